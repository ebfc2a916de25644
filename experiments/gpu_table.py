#!/usr/bin/env python3
"""Prints the markdown tables of a kvouter_gpu_bench JSON file: the kernels (medians) and the
whole-step loops. The GPU tables of experiments/results/gpu/README.md from 2026-12-02 on are this
script's output over the committed files.

    python3 experiments/gpu_table.py experiments/results/gpu/2026-12-02/gpu_bench_measure_core.json
"""
import json
import sys


def fmt(v, f):
    return "-" if v is None else format(v, f)


def median(rec):
    """experiments/measure.h's record (time_ms.median), or the earlier files' kernel_ms."""
    t = rec.get("time_ms")
    return t.get("median") if isinstance(t, dict) else rec.get("kernel_ms")


def check_of(run):
    checks = {k[3:]: v for k, v in run.items() if k.startswith("vs_") and isinstance(v, dict)}
    if not checks:
        return "unchecked"
    return ", ".join(("matches " if v.get("within_tolerance") else "DIFFERS from ") + k for k, v in checks.items())


def main(path: str) -> int:
    doc = json.load(open(path))
    print(f"`{path.split('experiments/results/gpu/')[-1]}`: run `{doc.get('git_rev', '?')}`"
          + (f" ({doc['timestamp'][:10]})" if doc.get("timestamp") else "")
          + f", {doc.get('device', '?')}, medians of {doc.get('reps', '?')} after {doc.get('warmup_ms', '?')} ms of warm-up;"
          + (f" ratios to {doc['peak_fp32_tflops']} TFLOP/s and {doc['hbm_tbps']} TB/s."
             if doc.get("peak_fp32_tflops") and doc.get("hbm_tbps") else " no datasheet figures for this device, no ratios."))
    print()
    if any(sd.get("runs") for sd in doc.get("results", [])):
        print("| shape | dtype | schedule @ target | kernels ms | forward | combine | TFLOP/s | % FP32 peak | K/V TB/s | % HBM | x float32 | check |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    loops = []
    for sd in doc.get("results", []):
        for r in sd.get("runs", []):
            name = f"{r.get('schedule', '?')} @ {r.get('target', '?')}"
            ms = median(r)
            if ms is None:
                print(f"| {sd['shape']} | {sd.get('dtype', 'float32')} | {name} | error: {str(r.get('error', '?'))[:80]} |"
                      + " |" * 8)
                continue
            print(f"| {sd['shape']} | {sd.get('dtype', 'float32')} | {name} | {ms:.3f} | {fmt(r.get('forward_ms'), '.3f')} | "
                  f"{fmt(r.get('combine_ms'), '.3f')} | {fmt(r.get('tflops'), '.2f')} | {fmt(r.get('pct_fp32_peak'), '.1f')} | "
                  f"{fmt(r.get('kv_tbps'), '.2f')} | {fmt(r.get('pct_hbm'), '.1f')} | {fmt(r.get('x_float32'), '.2f')} | {check_of(r)} |")
        for lp in sd.get("loops", []):
            loops.append((sd, lp))
    if loops:
        if any(sd.get("runs") for sd in doc.get("results", [])):
            print()
        print("| shape | dtype | target | pool | staging | steps | step ms | plan | uploads | kernels | read-back | step / kernels | checks |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for sd, lp in loops:
            if "error" in lp:
                print(f"| {sd['shape']} | {sd.get('dtype', 'float32')} | {lp.get('target')} | {lp.get('pool')} | "
                      f"{lp.get('staging', 'copy')} | error: {str(lp['error'])[:80]} |" + " |" * 7)
                continue
            m = lambda k: (lp.get(k) or {}).get("median")
            ok = all(c.get("within_tolerance") for c in lp.get("checks", []))
            # staging: the engine's q and outputs copied by the step (copy; every file before
            # 2026-12-03), or in the runner's staging (in_place, DeviceStepRunner::q_staging)
            print(f"| {sd['shape']} | {lp.get('dtype', sd.get('dtype', 'float32'))} | {lp.get('target')} | {lp.get('pool')} | "
                  f"{lp.get('staging', 'copy')} | {lp.get('steps', '-')} | {fmt(m('step_ms'), '.3f')} | {fmt(m('plan_ms'), '.3f')} | {fmt(m('upload_ms'), '.3f')} | "
                  f"{fmt(m('kernel_ms'), '.3f')} | {fmt(m('readback_ms'), '.3f')} | {fmt(lp.get('step_over_kernels'), '.2f')} | "
                  f"{len(lp.get('checks', []))} {'matched' if ok else 'DIFFER'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
