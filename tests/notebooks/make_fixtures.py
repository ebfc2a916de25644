#!/usr/bin/env python3
"""Writes the SYNTHETIC result fixtures in experiments/results/fixtures/ that the notebook and
plot.py tests read. Nothing here is measured: times come from a toy roofline model (compute or
bandwidth bound, whichever is slower, plus a fixed overhead) with seeded jitter, so that the
figures have plausible shapes. Every record says "synthetic": true.

    .venv/bin/python tests/notebooks/make_fixtures.py   # rewrites the five files, deterministically
"""
import json
import math
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "experiments" / "results" / "fixtures"
PEAK_GFLOPS, READ_GBPS = 128.0, 27.0  # the made-up machine's "measured" ceilings
MACHINE = "synthetic-fixture-2core"
JIT_TARGET = "x86-64-linux-avx2-fma-f16c-sse41"
WHO = "synthetic fixture written by tests/notebooks/make_fixtures.py; no command produced it"

SHAPES = {
    "tiny": dict(B=2, qo=64, kv=256, Hq=4, Hkv=2, D=128, block_size=32, page_size=16, topk=4, causal=True),
    "prefill": dict(B=1, qo=2048, kv=2048, Hq=16, Hkv=2, D=128, block_size=64, page_size=16, topk=16,
                    causal=True),
    "decode": dict(B=64, qo=1, kv=16384, Hq=32, Hkv=4, D=128, block_size=64, page_size=16, topk=16,
                   causal=True),
}
# (backend, schedule, knobs, share of peak FLOP/s, share of read bandwidth, overhead ms)
SERIES = [
    ("dense", "eigen-f32", {}, 0.45, 0.60, 0.02),
    ("direct", "seed-simd8", {}, 0.22, 0.50, 0.03),
    ("jit", "cpu_tiled", {"T": "16", "vec": "8"}, 0.62, 0.70, 0.05),
    ("jit", "cpu_tiled", {"T": "32", "vec": "8"}, 0.52, 0.70, 0.05),
    ("jit", "cpu_rowstream", {"R": "4"}, 0.55, 0.75, 0.05),
    ("jit", "auto_adams2019", {}, 0.35, 0.55, 0.06),
]


def model(shape, backend, ceff, beff, overhead, rng):
    """(median ms, useful GFLOP, KV GB loaded) for one configuration of the toy model."""
    sel = min(shape["topk"] * shape["block_size"], shape["kv"])
    per_key = 4 * shape["B"] * shape["qo"] * shape["Hq"] * shape["D"]  # Q.K^T and P.V, 2 flops a MAC
    kv_bytes = shape["B"] * shape["Hkv"] * shape["D"] * 2 * 4           # K and V rows, float32
    union = shape["kv"] if shape["qo"] > 1 else min(shape["kv"], 1.5 * sel)  # blocks loaded once per tile
    useful_gflop, kv_gb = per_key * sel / 1e9, kv_bytes * union / 1e9
    work_gflop, read_gb = (per_key * shape["kv"] / 1e9, kv_bytes * shape["kv"] / 1e9) if backend == "dense" \
        else (useful_gflop, kv_gb)
    ms = 1e3 * max(work_gflop / (ceff * PEAK_GFLOPS), read_gb / (beff * READ_GBPS)) + overhead
    return ms * rng.uniform(0.97, 1.03), useful_gflop, kv_gb


def sweep_record(name, shape, series, rng, ok=True):
    backend, schedule, knobs, ceff, beff, overhead = series
    ms, gflop, kv_gb = model(shape, backend, ceff, beff, overhead, rng)
    gflops = gflop / (ms / 1e3)
    return {
        "kind": "sweep", "synthetic": True, "sweep": "fixture_topk", "point": f"{name}-k{shape['topk']}",
        "shape": {"name": name, **shape}, "backend": backend, "schedule": schedule, "knobs": knobs,
        "target": JIT_TARGET if backend == "jit" else "host", "git_rev": "synthetic", "halide_version": "21.0.0",
        "machine": MACHINE,
        "time_ms": {"median": round(ms, 5), "p10": round(ms * 0.96, 5), "p90": round(ms * rng.uniform(1.04, 1.12), 5),
                    "min": round(ms * 0.94, 5), "n": 5},
        "gflops": round(gflops, 3), "peak_gflops": PEAK_GFLOPS, "pct_peak": round(100 * gflops / PEAK_GFLOPS, 2),
        "kv_gbps": round(kv_gb / (ms / 1e3), 3), "read_gbps": READ_GBPS,
        "max_out_err": 2.4e-7 if ok else 3.1e-2, "ok": ok, "repro": WHO, "timestamp": "2000-01-01T00:00:00Z",
    }


def write_sweep(rng):
    lines = []
    for name, topks in (("prefill", (4, 8, 16, 32)), ("decode", (16, 64, 128))):
        for topk in topks:
            shape = dict(SHAPES[name], topk=topk)
            lines += [sweep_record(name, shape, s, rng) for s in SERIES]
    # One wrong result: plots and tables must leave it out.
    lines.append(sweep_record("prefill", SHAPES["prefill"], ("jit", "auto_li2018", {}, 0.3, 0.5, 0.06), rng,
                              ok=False))
    (OUT / "sweep_synthetic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def write_tuning(rng):
    lines = []
    for shape_class, trials, start_ms in (("prefill", 16, 14.0), ("decode", 10, 3.2)):
        best = None
        for trial in range(trials):
            schedule = ("cpu_tiled", "cpu_rowstream")[trial % 2]
            knobs = {"T": str((8, 16, 32, 64)[trial % 4]), "vec": str((8, 16)[(trial // 4) % 2])}
            status, median = "ok", None
            if trial % 7 == 5:
                status = f"rejected: keep(): T={knobs['T']} with vec={knobs['vec']} spills registers"
            elif trial % 9 == 8:
                status = "dropped"
            else:
                # a tuner that learns: later candidates are better on average, each one noisy
                median = round(start_ms * (1 - 0.45 * (1 - math.exp(-trial / 4))) * rng.uniform(0.85, 1.2), 4)
                best = median if best is None else min(best, median)
            lines.append({"kind": "tune", "synthetic": True, "shape_class": shape_class, "target": "host",
                          "trial": trial, "schedule": schedule, "knobs": knobs, "best_ms": best, "status": status,
                          **({"time_ms": {"median": median, "n": 5}} if median is not None else {})})
    (OUT / "tune_synthetic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def write_gbench(rng):
    """Google Benchmark 1.7 JSON as kvouter_bench writes it (one iteration per row, which ran the
    measurement core)."""
    benchmarks, direct_ms = [], {}
    series = [SERIES[1], SERIES[0], SERIES[2], SERIES[5]]  # direct first, as the driver registers it
    for family, (shape_name, s) in enumerate((n, s) for n in ("tiny", "prefill") for s in series):
        backend, schedule, knobs, ceff, beff, overhead = s
        shape = SHAPES[shape_name]
        run_name = f"fwd+combine/{backend}/{schedule}/{shape_name}/iterations:1/manual_time"
        ms, gflop, kv_gb = model(shape, backend, ceff, beff, overhead, rng)
        if backend == "direct":
            direct_ms[shape_name] = ms
        sd = ms * rng.uniform(0.01, 0.05)
        counters = {"GFLOP/s": gflop / (ms / 1e3), "combine_ms": 0.1 * ms, "compile_ms": 0.0 if backend != "jit"
                    else 850.0, "fwd_ms": 0.9 * ms, "kv_GB/s": kv_gb / (ms / 1e3), "max_err": 2.4e-7,
                    "pct_peak": 100 * gflop / (ms / 1e3) / PEAK_GFLOPS, "plan_ms": 0.02}
        if shape_name in direct_ms:
            counters["x_direct"] = direct_ms[shape_name] / ms
        # One iteration that ran the measurement core: real_time is its median, p10/p90/n counters.
        counters.update({"p10_ms": ms - sd, "p90_ms": ms + sd, "n": 7})
        entry = {"name": run_name, "family_index": family, "per_family_instance_index": 0,
                 "run_name": run_name, "run_type": "iteration", "repetitions": 1, "repetition_index": 0,
                 "threads": 1, "iterations": 1, "real_time": round(ms, 6), "cpu_time": round(ms * 1.9, 6),
                 "time_unit": "ms"}
        entry.update({k: round(v, 6) for k, v in counters.items()})
        benchmarks.append(entry)
    # A run the driver refused to time (wrong result): the plots must skip it.
    bad = "fwd+combine/jit/cpu_rowstream/tiny/iterations:1/manual_time"
    benchmarks.append({"name": bad, "family_index": len(benchmarks), "per_family_instance_index": 0,
                       "run_name": bad, "run_type": "iteration", "repetitions": 1, "repetition_index": 0,
                       "threads": 1, "iterations": 0, "real_time": 0.0, "cpu_time": 0.0, "time_unit": "ms",
                       "error_occurred": True, "error_message": "wrong result: max|err| 0.031250"})
    doc = {"context": {"date": "2000-01-01T00:00:00+00:00", "host_name": MACHINE,
                       "executable": "build/bin/kvouter_bench", "num_cpus": 2, "mhz_per_cpu": 2500,
                       "cpu_scaling_enabled": False,
                       "caches": [{"type": "Data", "level": 1, "size": 49152, "num_sharing": 1},
                                  {"type": "Unified", "level": 2, "size": 2097152, "num_sharing": 1}],
                       "load_avg": [0.1, 0.1, 0.1], "library_build_type": "release",
                       "fp32_peak_gflops": f"{PEAK_GFLOPS:.6f}", "read_gbps": f"{READ_GBPS:.6f}",
                       "synthetic": "true", "note": WHO},
           "benchmarks": benchmarks}
    (OUT / "bench_synthetic.json").write_text(json.dumps(doc, indent=1) + "\n")


def write_gpu(rng):
    """kvouter_gpu_bench JSON and experiments/torch_compare.py JSON of a made-up GPU: two shapes, a
    Vulkan and a CUDA kernel each (one with two variants), one run whose check failed, one run
    without a kernel for its target, and PyTorch gather/flex on the same shapes."""
    shapes = {"gpu-decode": (8.0e9, 1.0e9), "gpu-prefill": (2.0e12, 1.3e8)}  # (FLOP, K/V bytes)
    runs_of = {"gpu-decode": [("vulkan_onepass", "host-cuda", "rows_16_unroll_4", 1.1, True),
                              ("vulkan_onepass", "host-vulkan", "rows_16_unroll_2", 5.5, True),
                              ("vulkan_onepass", "host-vulkan", "rows_8_unroll_4", 9.0, True),
                              ("vulkan_tiled", "host-vulkan", "", 6.0, False)],
               "gpu-prefill": [("vulkan_onepass", "host-cuda", "rows_16_unroll_4", 210.0, True),
                               ("vulkan_tiled", "host-vulkan", "", 950.0, True)]}
    results = []
    for shape, (flops, kv) in shapes.items():
        runs = []
        for schedule, target, knobs, ms, ok in runs_of[shape]:
            tgt = target.replace("-", "_")
            variant = f"kvouter_{schedule}_d128_p64_b128_q16_t1_{tgt}_chunk_0" + (f"_{knobs}" if knobs else "")
            all_ms = sorted(round(ms * rng.uniform(0.98, 1.05), 4) for _ in range(3))
            runs.append({"schedule": schedule, "target": target, "variant": variant, "backend": "aot",
                         "time_ms": {"median": all_ms[1], "n": 3, "all": all_ms}, "flops": flops, "kv_bytes": kv,
                         "vs_direct": {"within_tolerance": ok, "max_out_err": 3e-8 if ok else 0.5}})
        runs.append({"schedule": "vulkan_rows", "target": "host-cuda",
                     "error": "aot: no generated kernel for schedule 'vulkan_rows' and target 'host-cuda'"})
        results.append({"shape": shape, "flops": flops, "runs": runs})
    doc = {"tool": "kvouter_gpu_bench", "synthetic": True, "note": WHO, "device": "Synthetic GPU",
           "peak_fp32_tflops": 60.0, "hbm_tbps": 4.0, "reps": 3, "warmup_ms": 2000.0, "results": results}
    (OUT / "gpu_bench_synthetic.json").write_text(json.dumps(doc, indent=1) + "\n")
    torch = {"tool": "experiments/torch_compare.py", "synthetic": True, "note": WHO, "device": "Synthetic GPU",
             "tf32": False, "results": [
                 {"shape": "gpu-decode", "gather": {"ms": 3.0, "ms_all": [3.0, 3.1, 2.9],
                                                    "vs_kvouter": {"max_out_diff": 1e-7, "max_lse_diff": 1e-6}},
                  "flex": {"error": "OutOfMemoryError('synthetic')"}},
                 {"shape": "gpu-prefill", "gather": {"ms": 640.0, "ms_all": [640.0],
                                                     "vs_kvouter": {"max_out_diff": 2e-7, "max_lse_diff": 1e-6}},
                  "flex": {"ms": 1600.0, "ms_all": [1600.0],
                           "vs_kvouter": {"max_out_diff": 2e-7, "max_lse_diff": 2e-6}}}]}
    (OUT / "torch_compare_synthetic.json").write_text(json.dumps(torch, indent=1) + "\n")


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20240601)
    write_sweep(rng)
    write_tuning(rng)
    write_gbench(rng)
    write_gpu(rng)
    for p in sorted(OUT.iterdir()):
        print(f"{p} ({p.stat().st_size} bytes)")
