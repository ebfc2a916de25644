# install: headers, the runtime and the generated kernels, and a CMake package (kvouterConfig).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/runtime/include/kvouter ${PROJECT_SOURCE_DIR}/generators/include/kvouter
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
find_file(KVOUTER_HALIDE_RUNTIME_H HalideRuntime.h PATHS ${Halide_DIR}/../../../include NO_DEFAULT_PATH REQUIRED)
get_filename_component(_halide_inc ${KVOUTER_HALIDE_RUNTIME_H} DIRECTORY)
foreach(h HalideBuffer.h HalideRuntime.h HalideRuntimeVulkan.h HalideRuntimeCuda.h)
  install(FILES ${_halide_inc}/${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvouter/halide)
endforeach()

install(TARGETS kvouter_runtime kvouter_prefetch kvouter_aot_kernels kvouter_halide_rt ${KVOUTER_AOT_LIBS}
        EXPORT kvouterTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set_target_properties(kvouter_runtime PROPERTIES EXPORT_NAME runtime)
set_target_properties(kvouter_aot_kernels PROPERTIES EXPORT_NAME aot_kernels)
install(EXPORT kvouterTargets NAMESPACE kvouter:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvouter)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvouterConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kvouterConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvouter)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvouterConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvouterConfig.cmake ${PROJECT_BINARY_DIR}/kvouterConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvouter)
