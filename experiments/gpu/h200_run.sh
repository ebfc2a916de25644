#!/usr/bin/env bash
# Runs on the lent GPU machine (experiments/results/gpu/README.md): Vulkan through the NVIDIA driver with a
# carried loader, then the gpu tests, the GPU benchmark and the PyTorch comparison, all on the
# same inputs. Carried (built here by `make gpu-carry`; add kvouter to CARRY_BINS for `sweep`):
#   .gl/*.deb                    Debian's Vulkan loader + libglvnd (unpacked into / here)
#   .carry/bin/{kvouter_gpu_bench,vulkan_test[,vk_pipeline_stats][,kvouter]}.xz   portable builds (unpacked to /tmp/kvbin)
#   .carry/spv/*.spv             the GPU-shape Vulkan kernels' SPIR-V (for the vkstats step; with
#                                vk_pipeline_stats in CARRY_BINS)
#   .carry/lib/{libHalide.so.xz,libautoschedule_*.so,libgomp.so.1,libyaml-cpp.so.0.7}
# Usage: experiments/gpu/h200_run.sh STEP...   (steps: env tests bench vkstats torch sweep)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/kvlib /tmp/xdg
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
echo '{"file_format_version":"1.0.0","ICD":{"library_path":"/usr/local/nvidia/lib64/libEGL_nvidia.so.0","api_version":"1.4.0"}}' > /tmp/nv_icd.json
export VK_ICD_FILENAMES=/tmp/nv_icd.json VK_DRIVER_FILES=/tmp/nv_icd.json XDG_RUNTIME_DIR=/tmp/xdg
unset HL_VK_DEVICE_TYPE
[ -f /tmp/kvlib/libHalide.so ] || xz -dc .carry/lib/libHalide.so.xz > /tmp/kvlib/libHalide.so
cp -n .carry/lib/*.so* /tmp/kvlib/ 2>/dev/null  # libgomp, yaml-cpp, the autoscheduler plugins
# Halide's CUDA runtime (the host-cuda kernels) loads libcuda.so; the driver ships libcuda.so.1.
for d in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64; do
  if [ -e "$d/libcuda.so.1" ]; then ln -sf "$d/libcuda.so.1" /tmp/kvlib/libcuda.so; break; fi
done
export LD_LIBRARY_PATH=/tmp/kvlib
BIN=/tmp/kvbin
mkdir -p $BIN
# Always unpacked: a machine still warm from an earlier call must not run an earlier build.
for f in .carry/bin/*.xz; do b=$BIN/$(basename "$f" .xz); xz -dc "$f" > "$b.new" && chmod +x "$b.new" && mv "$b.new" "$b"; done
for step in "$@"; do
  case $step in
    env)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
      lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-200 | tee -a "$OUT/env.txt" ;;
    tests)
      # No validation layer there (not installed); the same tests run under it on lavapipe in CI.
      timeout ${TESTS_TIMEOUT:-300} $BIN/vulkan_test --gtest_brief=1 2>&1 | grep -v "^Vulkan: Configuring" | tee "$OUT/gpu_tests.log" | tail -25 ;;
    bench)
      # The SM clock, sampled while the benchmark runs (the driver keeps a Vulkan-only load at
      # its idle clock until the GPU has been busy a while; the benchmark warms up for that).
      nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,utilization.gpu,power.draw --format=csv -lms 200 \
        > "$OUT/${BENCH_JSON:-gpu_bench.json}.clocks.csv" 2>&1 & smi=$!
      # CASE_DIR= (empty) skips writing the inputs for the torch step (gpu-decode's are 4 GB).
      cases=${CASE_DIR-/tmp/cases}
      timeout ${BENCH_TIMEOUT:-420} $BIN/kvouter_gpu_bench --json "$OUT/${BENCH_JSON:-gpu_bench.json}" \
        ${cases:+--case-dir "$cases"} ${BENCH_ARGS:-} > /dev/null
      kill $smi ;;
    vkstats)
      # The driver's statistics (registers, memory) of the carried kernels' SPIR-V (.carry/spv,
      # written by make gpu-carry), the Vulkan counterpart of ptxas -v.
      $BIN/vk_pipeline_stats .carry/spv/*.spv 2>&1 | tee "$OUT/vk_pipeline_stats.txt" | tail -40 ;;
    torch)
      PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-420} python3 experiments/torch_compare.py /tmp/cases --json "$OUT/torch_compare.json" ${TORCH_ARGS:-} ;;
    sweep)
      # JIT knob sweep of the Vulkan schedules on the cases the bench step saved. SWEEP_CFGS:
      # space-separated "schedule:k=v,k=v" items; each line of sweep.txt is kvouter run's summary.
      for shape in ${SWEEP_SHAPES:-gpu-prefill}; do
        for cfg in ${SWEEP_CFGS:-vulkan_tiled:chunk=8}; do
          sched=${cfg%%:*}; params=()
          IFS=, read -ra kv <<< "${cfg#*:}"; for p in "${kv[@]}"; do params+=(--param "$p"); done
          echo "$shape $cfg: $(timeout 120 $BIN/kvouter run /tmp/cases/$shape --out /tmp/sweep_out --backend jit \
            --schedule "$sched" --target host-vulkan "${params[@]}" --repeat 3 --warmup-ms ${SWEEP_WARMUP_MS:-2000} 2>&1 | tail -1)" | tee -a "$OUT/sweep.txt"
        done
      done ;;
  esac
done
