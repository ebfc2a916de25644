#!/usr/bin/env bash
# Runs libFuzzer targets one after the other, each for SECONDS, on a working corpus under the
# build folder (a copy of tests/fuzz/corpus/<target>: the committed corpus is never written).
# Crashes go to BUILD/fuzz-artifacts/<target>/, full logs to BUILD/fuzz-logs/<target>.log; one
# summary line per target (executions, cov, ft, corpus) is printed. Exits 1 if any target failed.
#   tests/fuzz/run_fuzzers.sh BUILD_DIR SECONDS [TARGET...]
set -uo pipefail
build=$1
seconds=$2
shift 2
src=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_npy fuzz_case_json fuzz_validate_plan fuzz_run)
status=0
for t in "${targets[@]}"; do
  work=$build/fuzz-corpus/$t
  art=$build/fuzz-artifacts/$t
  log=$build/fuzz-logs/$t.log
  mkdir -p "$work" "$art" "$build/fuzz-logs"
  cp -n "$src/corpus/$t"/* "$work"/
  "$build/bin/$t" -max_total_time="$seconds" -timeout=120 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$art/" "$work" >"$log" 2>&1
  rc=$?
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  if [ $rc -ne 0 ]; then
    echo "$t: FAILED (exit $rc), log $log, input in $art/"
    grep -E 'ERROR|FUZZ_CHECK|runtime error|SUMMARY' "$log" | head -5
    status=1
  else
    echo "$t: ${seconds}s, ${execs:-?} executions, ${done_line#*DONE   }"
  fi
done
exit $status
