#!/usr/bin/env python3
"""Prints the markdown table of a kvouter_bench JSON file (medians): the CPU table of
experiments/results/README.md is this script's output over the committed cpu_bench.json.

    python3 experiments/bench_table.py experiments/results/cpu_bench.json
"""
import json
import sys


def main(path: str) -> int:
    doc = json.load(open(path))
    ctx = doc["context"]
    print(f"Run `{ctx.get('git_rev', '?')}` ({ctx.get('date', '?')[:10]}), Halide {ctx.get('halide_version', '?')}, "
          f"target `{ctx.get('host_target', '?')}`, {ctx.get('num_cpus', '?')} CPUs; measured at the start of the run: "
          f"{float(ctx.get('fp32_peak_gflops', 'nan')):.0f} GFLOP/s FP32, {float(ctx.get('read_gbps', 'nan')):.1f} GB/s.")
    print()
    # Runs with 16-bit shapes (KVOUTER_BENCH_DTYPES) add each row's ratio to float32; runs that
    # measured the paged bound add it, and runs that timed an engine's call (run_into's wall time
    # per call) its ratio to the kernels.
    extra = [("x float32", "x_float32", ".2f"), ("% of paged bound", "pct_paged_bound", ".1f"),
             ("call / kernels", "call_over_kernels", ".2f")]
    extra = [e for e in extra if any(e[1] in b for b in doc["benchmarks"])]
    print("| shape | backend / schedule | median ms | fwd ms | combine ms | plan ms | GFLOP/s | % of peak | % of roofline bound | x direct |"
          + "".join(f" {e[0]} |" for e in extra))
    print("|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(extra))
    rows, errors, plans = [], [], []
    for b in doc["benchmarks"]:
        name = b.get("run_name", b["name"])
        if b.get("error_occurred"):
            errors.append(f"{name.split('/min_time')[0]}: {b.get('error_message', '')}")
            continue
        # The kernel rows are one iteration each, which ran the measurement core (real_time is the
        # median of its repetitions); the plan rows are Google Benchmark's median aggregates.
        if b.get("aggregate_name") != "median" and not (b.get("run_type") == "iteration" and "p10_ms" in b):
            continue
        parts = name.split("/")
        if parts[0] == "fwd+combine":
            _, backend, schedule, shape = parts[:4]
            rows.append((shape, f"{backend} / {schedule}", b["real_time"], b.get("fwd_ms"), b.get("combine_ms"),
                         b.get("plan_ms"), b.get("GFLOP/s"), b.get("pct_peak"), b.get("pct_roofline"), b.get("x_direct"),
                         [b.get(e[1]) for e in extra]))
        elif parts[0].startswith("plan"):
            plans.append((parts[0], parts[1], b["real_time"], b.get("edges"), b.get("ns_per_edge")))
    fmt = lambda v, f: "-" if v is None else format(v, f)
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {fmt(r[3], '.2f')} | {fmt(r[4], '.2f')} | {fmt(r[5], '.2f')} | "
              f"{fmt(r[6], '.1f')} | {fmt(r[7], '.1f')} | {fmt(r[8], '.1f')} | {fmt(r[9], '.2f')} |"
              + "".join(f" {fmt(v, e[2])} |" for v, e in zip(r[10], extra)))
    if plans:
        print()
        print("| plan | shape | median us | edges | ns per edge |")
        print("|---|---|---|---|---|")
        for p in plans:
            print(f"| {p[0]} | {p[1]} | {p[2]:.0f} | {fmt(p[3], '.0f')} | {fmt(p[4] * 1e9 if p[4] else None, '.0f')} |")
    if errors:
        print()
        print("Not run: " + "; ".join(errors))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "experiments/results/cpu_bench.json"))
