# The two commands of the README (each does all of its own set-up on a fresh Debian/Ubuntu):
#   make demo   build, then run SPEC's tiny shape through every backend and print a table
#   make test   build, then run the whole test suite (what .ci/run calls)
SHELL := /bin/bash
.DEFAULT_GOAL := demo

VENV    := .venv
PY      := $(VENV)/bin/python
PRESET  ?= ci
BUILD   := build
JOBS    ?= $(shell nproc)
APT_PKGS := build-essential git python3 python3-venv python3-pip libeigen3-dev libgtest-dev \
            libgmock-dev libbenchmark-dev nlohmann-json3-dev libvulkan-dev libvulkan1 \
            mesa-vulkan-drivers vulkan-validationlayers vulkan-tools clang libyaml-cpp-dev \
            libclang-rt-14-dev libomp-dev spirv-tools spirv-headers
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Vulkan runs on Mesa's lavapipe (a CPU device) unless the caller chose a driver, under the Khronos
# validation layer during tests (see ../shared/notes/halide21-vulkan.md).
export VK_ICD_FILENAMES ?= /usr/share/vulkan/icd.d/lvp_icd.x86_64.json
export HL_VK_DEVICE_TYPE ?= cpu

.PHONY: setup deps venv configure build demo test test-asan test-fuzz bench roofline notebooks gpu-carry clean
setup: deps venv

deps: .stamps/apt
.stamps/apt: Makefile
	@missing=$$(for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "apt: installing $$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@mkdir -p .stamps && touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt .stamps/apt
	[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

configure: $(BUILD)/build.ninja
$(BUILD)/build.ninja: $(VENV)/.installed CMakeLists.txt CMakePresets.json
	$(VENV)/bin/cmake --preset $(PRESET) -DCMAKE_PREFIX_PATH=$(HALIDE_CMAKE)

build: configure
	$(VENV)/bin/cmake --build $(BUILD) -j $(JOBS)

DEMO := $(BUILD)/demo
# The main job: a short default exploration on this machine: every backend on SPEC's tiny shape,
# a brief tune, a small sweep, the plots; outputs under build/demo/.
demo: build
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(BUILD)/bin/kvouter demo --shape tiny
	$(BUILD)/bin/kvouter tune --shape tiny --max-candidates 8 --repeats 3 \
	  --db $(DEMO)/tuning_db.json --log $(DEMO)/tune_tiny_host.jsonl
	$(BUILD)/bin/kvouter sweep experiments/configs/demo.yaml --out $(DEMO)/sweep_demo.jsonl
	$(PY) experiments/plot.py --out $(DEMO)/figures $(DEMO) experiments/results/cpu_bench.json
	@echo
	@echo "demo outputs in $(DEMO)/: tuning_db.json, tune_tiny_host.jsonl, sweep_demo.jsonl, figures/*.png|svg"

HALIDE_CMAKE = "$$($(PY) -c 'import halide, os; print(os.path.join(os.path.dirname(halide.__file__), "lib64", "cmake"))')"

# The whole suite, then the unit and correctness suites again under ASan + UBSan (asan preset),
# then a short run of every libFuzzer target (fuzz preset).
test: build
	cd $(BUILD) && ../$(VENV)/bin/ctest -j $(JOBS) --output-on-failure --timeout 900
	$(MAKE) --no-print-directory test-asan
	$(MAKE) --no-print-directory test-fuzz

# The host paths under the sanitizers; the Vulkan ones are required (KVOUTER_REQUIRE_VULKAN, set by
# .ci/run) in the main run above, not here.
test-asan: $(VENV)/.installed
	$(VENV)/bin/cmake --preset asan -DCMAKE_PREFIX_PATH=$(HALIDE_CMAKE) > /dev/null
	$(VENV)/bin/cmake --build build-asan -j $(JOBS)
	cd build-asan && KVOUTER_REQUIRE_VULKAN= ../$(VENV)/bin/ctest -j $(JOBS) -L "unit|correctness" -E "notebooks|install_consumer" \
	  --output-on-failure --timeout 1800

# clang + libFuzzer, ASan + UBSan: builds only the fuzzers (runtime, reference, JIT; no AOT
# kernels), replays the committed corpus (seeds and past crashes), then fuzzes each target for
# FUZZ_SECONDS on a copy of it under build-fuzz/ (tests/fuzz/run_fuzzers.sh, tests/fuzz/RESULTS.md).
FUZZ_SECONDS ?= 25
test-fuzz: $(VENV)/.installed
	$(VENV)/bin/cmake --preset fuzz -DCMAKE_PREFIX_PATH=$(HALIDE_CMAKE) > /dev/null
	$(VENV)/bin/cmake --build build-fuzz -j $(JOBS) --target kvouter_fuzzers
	cd build-fuzz && ../$(VENV)/bin/ctest -L fuzz --output-on-failure --timeout 600
	tests/fuzz/run_fuzzers.sh build-fuzz $(FUZZ_SECONDS)

bench: build
	mkdir -p experiments/results
	$(BUILD)/bin/kvouter_bench --benchmark_out=experiments/results/cpu_bench.json --benchmark_out_format=json

roofline: build
	$(BUILD)/bin/kvouter roofline

# The notebooks executed on the committed results and saved with their outputs (the test suite
# runs them again on fixtures).
notebooks: $(VENV)/.installed
	MPLBACKEND=Agg $(PY) notebooks/refresh.py

# The bundle carried to the lent GPU machine (experiments/gpu/h200_run.sh reads it): the portable
# `gpu-carry` build, stripped and compressed (xz), with Halide's library (xz) and the GPU autoschedulers' plugins in
# .carry/, and Debian's Vulkan loader and libglvnd packages in .gl/. Under the device's 64 MiB
# with the repository. vk_pipeline_stats and the GPU-shape kernels' SPIR-V (h200_run.sh vkstats)
# come only when asked: CARRY_BINS="kvouter_gpu_bench vulkan_test vk_pipeline_stats".
CARRY_BINS ?= kvouter_gpu_bench vulkan_test
CARRY_DEBS := libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2
HALIDE_LIB = "$$($(PY) -c 'import halide, os; print(os.path.join(os.path.dirname(halide.__file__), "lib64"))')"
gpu-carry: $(VENV)/.installed
	$(VENV)/bin/cmake --preset gpu-carry -DCMAKE_PREFIX_PATH=$(HALIDE_CMAKE) > /dev/null
	$(VENV)/bin/cmake --build build-gpu -j $(JOBS) --target $(CARRY_BINS)
	rm -rf .carry && mkdir -p .carry/bin .carry/lib .gl
	for b in $(CARRY_BINS); do strip -o build-gpu/$$b.stripped build-gpu/bin/$$b && xz -T$(JOBS) -6 -c build-gpu/$$b.stripped > .carry/bin/$$b.xz; done
	xz -T$(JOBS) -9e -c $(HALIDE_LIB)/libHalide.so > .carry/lib/libHalide.so.xz  # -9e: 1.5 MB smaller than -6 (the device's 64 MiB)
	cp $(HALIDE_LIB)/libautoschedule_anderson2021.so $(HALIDE_LIB)/libautoschedule_mullapudi2016.so .carry/lib/
	cp /lib/x86_64-linux-gnu/libgomp.so.1 /lib/x86_64-linux-gnu/libyaml-cpp.so.0.7 .carry/lib/
	$(if $(filter vk_pipeline_stats,$(CARRY_BINS)),for s in build-gpu/generators/kvouter_vulkan_onepass_d128_p64_b128_q16_*_host_vulkan_*_fwd.stmt \
	  build-gpu/generators/kvouter_vulkan_tiled_d128_p64_b128_q16_t1_host_vulkan_*_fwd.stmt; do \
	  $(PY) experiments/gpu/spirv_dis.py $$s --spv-dir .carry/spv > /dev/null; done)
	cd .gl && rm -f *.deb && apt-get download $(CARRY_DEBS)
	du -sh .carry .gl

clean:
	rm -rf $(BUILD) build-dev build-release build-asan build-fuzz
