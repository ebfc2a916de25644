# Writes the source tree's revision into a header at every build (not at configure time), so that a
# result names the code that produced it; "-dirty" when the tree has uncommitted changes.
# Called as: cmake -DSRC=<source dir> -DOUT=<header> -P git_rev.cmake
execute_process(COMMAND git describe --always --dirty --abbrev=7 WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE rev OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rev)
  set(rev unknown)
endif()
set(text "#define KVOUTER_GIT_REV \"${rev}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
