#!/usr/bin/env python3
"""The one plotting script: reads every kvouter result file and draws the figures.

    .venv/bin/python experiments/plot.py [--out DIR] FILE_OR_DIR...

Inputs, any mix (the kind is told from the content, not the file name):
  sweep JSONL             one {"kind": "sweep", ...} record per line
  tuning-log JSONL        one {"kind": "tune", ...} record per line
  Google Benchmark JSON   what bench_kvouter writes with --benchmark_out / --benchmark_format=json
  GPU benchmark JSON      what kvouter_gpu_bench writes with --json (experiments/results/gpu/)
  PyTorch comparison      what experiments/torch_compare.py writes with --json (same folder)
A folder stands for its *.json and *.jsonl files, not those of its subfolders (results/fixtures holds
synthetic test data that must never mix into real results).

Figures, each written as PNG and SVG: speedup_vs_sparsity, gflops_vs_roofline, schedule_bars,
tuning_convergence, gpu_roofline. A figure whose inputs are absent is skipped with a line saying why.

The notebooks import this module for loading, tables and figures, so that logic lives here once.
Nothing here times anything: it only reads what the experiments recorded.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import Patch

FIGURES = ("speedup_vs_sparsity", "gflops_vs_roofline", "schedule_bars", "tuning_convergence", "gpu_roofline")
# The GPU shapes' targets (issue #4): the roofline share each is measured by, and the target.
GPU_TARGETS = {"gpu-decode": ("pct_hbm", 60.0), "gpu-prefill": ("pct_peak", 20.0)}
DENSE_BACKEND = "dense"
BENCH_MARK = " [bench]"  # appended to benchmark series: a different run from the sweeps
DEFAULT_RESULTS = "../experiments/results"  # relative to notebooks/, where Jupyter starts kernels
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "figures"

_MS_PER_UNIT = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
# Name segments Google Benchmark appends for options set in code (MinTime, Repetitions, ...).
_GBENCH_OPTION = re.compile(
    r"^(min_time|min_warmup_time|repeats|iterations|threads|real_time|manual_time|process_time)(:.*)?$")
_GBENCH_AGGREGATE_SUFFIX = re.compile(r"_(mean|median|stddev|cv)$")


# ---------------------------------------------------------------------------------------------
# Records


@dataclass
class Measurement:
    """One timed configuration: a sweep record, or one Google Benchmark run (all its repetitions)."""
    source: str            # "sweep" or "gbench"
    file: str
    backend: str
    schedule: str
    shape_name: str
    shape: dict | None     # the full shape for sweep records; benchmarks carry only a name
    knobs: dict
    target: str
    machine: str
    median_ms: float
    lo_ms: float | None    # low end of the spread: p10 (sweep) or median - stddev (benchmark)
    hi_ms: float | None    # high end: p90 (sweep) or median + stddev (benchmark)
    n: int | None = None   # timed repetitions behind the median
    gflops: float | None = None
    peak_gflops: float | None = None
    pct_peak: float | None = None
    kv_gbps: float | None = None
    read_gbps: float | None = None
    max_err: float | None = None
    ok: bool = True
    synthetic: bool = False
    repro: str = ""
    counters: dict = field(default_factory=dict)  # benchmark counters not mapped above (x_direct, ...)
    shape_label: str = ""  # filled by Results: the name, plus whatever tells same-named shapes apart

    @property
    def series(self) -> str:
        """What one line / bar colour stands for. Benchmarks are marked: they are a different run."""
        s = f"{self.backend}/{self.schedule}"
        return s + BENCH_MARK if self.source == "gbench" else s

    @property
    def sparsity(self) -> float | None:
        """Fraction of the KV a query reads: topk * block_size / kv_len (at most 1)."""
        sh = self.shape or {}
        topk, bs, kv = sh.get("topk"), sh.get("block_size"), sh.get("kv")
        if topk is None or bs is None or kv is None:
            return None
        kvs = kv if isinstance(kv, list) else [kv]  # ragged batches: the share of all KV rows read
        total = sum(kvs)
        return sum(min(topk * bs, k) for k in kvs) / total if total > 0 else None

    @property
    def shape_key(self) -> str:
        return json.dumps(self.shape, sort_keys=True) if self.shape else self.shape_name

    @property
    def knobs_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.knobs.items())) or "-"


@dataclass
class TuneTrial:
    """One line of a tuning log."""
    file: str
    shape_class: str
    target: str
    trial: int
    schedule: str
    knobs: dict
    median_ms: float | None
    best_ms: float | None
    status: str
    synthetic: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.median_ms is not None


@dataclass
class GpuRun:
    """One GPU implementation timed on one shape: a kvouter_gpu_bench run (a kvouter kernel on a
    target) or a PyTorch implementation of experiments/torch_compare.py on the same inputs."""
    file: str
    device: str
    shape: str
    impl: str              # schedule@target, or "torch gather" / "torch flex"
    variant: str           # the AOT variant's knobs (e.g. rows_16_unroll_4), "" for PyTorch
    median_ms: float
    ms_all: list[float]
    flops: float | None = None      # the shape's attended work (SPEC §5), from the benchmark
    kv_bytes: float | None = None   # K/V bytes the selection reads
    peak_tflops: float | None = None
    hbm_tbps: float | None = None
    ok: bool = True                 # no check against a baseline failed
    checked: bool = True            # it was checked (a benchmark's first run is the others' reference)
    synthetic: bool = False

    @property
    def pct_peak(self) -> float | None:
        if not self.flops or not self.peak_tflops or self.median_ms <= 0:
            return None
        return 100.0 * self.flops / (self.median_ms * 1e-3) / (self.peak_tflops * 1e12)

    @property
    def pct_hbm(self) -> float | None:
        if not self.kv_bytes or not self.hbm_tbps or self.median_ms <= 0:
            return None
        return 100.0 * self.kv_bytes / (self.median_ms * 1e-3) / (self.hbm_tbps * 1e12)


@dataclass
class Results:
    measurements: list[Measurement] = field(default_factory=list)
    trials: list[TuneTrial] = field(default_factory=list)
    gpu: list[GpuRun] = field(default_factory=list)
    loaded: list[tuple[str, str, int]] = field(default_factory=list)  # (file, kinds, records)
    notes: list[str] = field(default_factory=list)                    # skipped lines and why

    @property
    def synthetic(self) -> bool:
        return (any(m.synthetic for m in self.measurements) or any(t.synthetic for t in self.trials)
                or any(g.synthetic for g in self.gpu))

    def ok_measurements(self) -> list[Measurement]:
        return [m for m in self.measurements if m.ok]

    def summary(self) -> str:
        lines = [f"{f}: {n} {kind} record(s)" for f, kind, n in self.loaded]
        lines += [f"note: {n}" for n in self.notes]
        bad = sum(not m.ok for m in self.measurements)
        if bad:
            lines.append(f"note: {bad} record(s) with ok=false are left out of every table and figure")
        if self.synthetic:
            lines.append("note: SYNTHETIC fixture data (made up for tests, not measured)")
        if not self.loaded:
            lines.append("no results loaded")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Loading


def results_dir() -> Path:
    """The folder the notebooks read: $KVOUTER_RESULTS, else ../experiments/results."""
    return Path(os.environ.get("KVOUTER_RESULTS", DEFAULT_RESULTS))


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(q for q in p.iterdir() if q.is_file() and q.suffix in (".json", ".jsonl"))
        else:
            out.append(p)
    return out


def load_results(paths: str | Path | Iterable[str | Path]) -> Results:
    """Reads files and folders of results into one Results."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    res = Results()
    for path in expand_paths(paths):
        if not path.exists():
            res.notes.append(f"{path}: no such file")
            continue
        _load_file(path, res)
    _label_shapes(res.measurements)
    _link_gpu_runs(res.gpu)
    return res


def _load_file(path: Path, res: Results) -> None:
    text = path.read_text()
    try:
        whole, whole_error = json.loads(text), None  # Python's json takes the NaN benchmarks write
    except json.JSONDecodeError as e:
        whole, whole_error = None, e
    if isinstance(whole, dict) and isinstance(whole.get("benchmarks"), list):
        n = _load_gbench(whole, str(path), res)
        res.loaded.append((str(path), "Google Benchmark", n))
        return
    if isinstance(whole, dict) and whole.get("tool") in (GPU_BENCH_TOOL, TORCH_TOOL):
        n = (_load_gpu_bench if whole["tool"] == GPU_BENCH_TOOL else _load_torch_compare)(whole, str(path), res)
        res.loaded.append((str(path), whole["tool"], n))
        return
    if isinstance(whole, dict):
        records = [(1, whole)]
    elif isinstance(whole, list):
        records = list(enumerate(whole, 1))
    else:  # JSONL
        records, bad = [], []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((lineno, json.loads(line)))
            except json.JSONDecodeError as e:
                bad.append(f"line {lineno}: {e.msg}")
        if bad and not records:  # one document that does not parse, e.g. a benchmark still writing it
            res.notes.append(f"{path}: not valid JSON ({whole_error.msg} at line {whole_error.lineno}; "
                             "truncated, or still being written?), skipped")
            return
        if bad:
            res.notes.append(f"{path}: {len(bad)} line(s) not JSON, skipped (first: {bad[0]})")
    counts: dict[str, int] = {}
    for lineno, rec in records:
        kind = _record_kind(rec)
        try:
            if kind == "sweep":
                res.measurements.append(_sweep_measurement(rec, str(path)))
            elif kind == "tune":
                res.trials.append(_tune_trial(rec, str(path)))
            else:
                res.notes.append(f"{path}:{lineno}: neither a sweep nor a tuning record, skipped")
                continue
        except (KeyError, TypeError, ValueError) as e:
            res.notes.append(f"{path}:{lineno}: {kind} record lacks or mangles {e}, skipped")
            continue
        counts[kind] = counts.get(kind, 0) + 1
    for kind, n in counts.items():
        res.loaded.append((str(path), kind, n))
    if not counts:
        res.notes.append(f"{path}: nothing recognisable in it")


GPU_BENCH_TOOL = "kvouter_gpu_bench"
TORCH_TOOL = "experiments/torch_compare.py"


def _variant_knobs(variant: str, target: str) -> str:
    """'kvouter_vulkan_onepass_d128_..._host_cuda_chunk_4096_rows_16_unroll_4' -> the knobs after
    the target ('rows_16_unroll_4'; the GPU schedules' chunk 4096 means 'the whole block')."""
    marker = "_" + target.replace("-", "_") + "_"
    knobs = variant.split(marker, 1)[1] if marker in variant else ""
    return re.sub(r"^chunk_4096_?", "", knobs)


def _load_gpu_bench(doc: dict, file: str, res: Results) -> int:
    device = doc.get("device", "?")
    peak, hbm = _opt_float(doc.get("peak_fp32_tflops")), _opt_float(doc.get("hbm_tbps"))
    synthetic = bool(doc.get("synthetic", False))
    n = 0
    for shape_rec in doc.get("results", []):
        shape = shape_rec.get("shape", "?")
        for run in shape_rec.get("runs", []):
            name = f"{run.get('schedule', '?')}@{run.get('target', '?')}"
            ms = _opt_float(run.get("kernel_ms"))
            if ms is None:
                res.notes.append(f"{file}: {shape} {name}: {str(run.get('error', 'no kernel time'))[:160]}, left out")
                continue
            checks = {k: v for k, v in run.items() if k.startswith("vs_") and isinstance(v, dict)}
            failed = [k for k, v in checks.items() if not v.get("within_tolerance", False)]
            variant = _variant_knobs(run.get("variant", ""), run.get("target", ""))
            if failed:
                res.notes.append(f"{file}: {shape} {name}{' ' + variant if variant else ''}: differs "
                                 f"({', '.join(failed)}), left out")
            res.gpu.append(GpuRun(file=file, device=device, shape=shape, impl=name, variant=variant,
                                  median_ms=ms, ms_all=[float(x) for x in run.get("kernel_ms_all", [ms])],
                                  flops=_opt_float(run.get("flops")), kv_bytes=_opt_float(run.get("kv_bytes")),
                                  peak_tflops=peak, hbm_tbps=hbm, ok=not failed, checked=bool(checks),
                                  synthetic=synthetic))
            n += 1
    return n


def _load_torch_compare(doc: dict, file: str, res: Results) -> int:
    device = doc.get("device", "?")
    synthetic = bool(doc.get("synthetic", False))
    n = 0
    for shape_rec in doc.get("results", []):
        shape = shape_rec.get("shape", "?")
        for impl in ("gather", "flex"):
            r = shape_rec.get(impl)
            ms = _opt_float(r.get("ms")) if isinstance(r, dict) else None
            if ms is None:
                why = r.get("error", "no time") if isinstance(r, dict) else "absent"
                res.notes.append(f"{file}: {shape} torch {impl}: {str(why)[:120]}, left out")
                continue
            diff = r.get("vs_kvouter")
            checked = isinstance(diff, dict)
            # torch_compare.py's own tolerance for agreeing with kvouter's outputs.
            ok = not checked or all(_opt_float(diff.get(k)) is not None and diff[k] < 1e-4
                                    for k in ("max_out_diff", "max_lse_diff"))
            if not ok:
                res.notes.append(f"{file}: {shape} torch {impl}: differs from kvouter ({diff}), left out")
            res.gpu.append(GpuRun(file=file, device=device, shape=shape, impl=f"torch {impl}",
                                  variant="", median_ms=ms, ms_all=[float(x) for x in r.get("ms_all", [ms])],
                                  ok=ok, checked=checked, synthetic=synthetic))
            n += 1
    return n


def _link_gpu_runs(runs: list[GpuRun]) -> None:
    """PyTorch files carry no work counts: take the shape's from a kvouter run on the same device
    (the benchmark writes the inputs PyTorch reads, so the work is the same)."""
    for g in runs:
        if g.flops is not None:
            continue
        ref = next((k for k in runs if k.shape == g.shape and k.device == g.device and k.flops is not None), None)
        if ref:
            g.flops, g.kv_bytes, g.peak_tflops, g.hbm_tbps = ref.flops, ref.kv_bytes, ref.peak_tflops, ref.hbm_tbps


def _record_kind(rec) -> str | None:
    if not isinstance(rec, dict):
        return None
    kind = rec.get("kind")
    if kind in ("sweep", "tune"):
        return kind
    if "time_ms" in rec:
        return "sweep"
    if "trial" in rec and "shape_class" in rec:
        return "tune"
    return None


def _opt_float(v) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _sweep_measurement(rec: dict, file: str) -> Measurement:
    t = rec["time_ms"]
    if _opt_float(t["median"]) is None:
        raise ValueError("time_ms.median (not a finite number)")
    shape = rec.get("shape") or {}
    return Measurement(
        source="sweep", file=file, backend=str(rec["backend"]), schedule=str(rec.get("schedule", "")),
        shape_name=str(shape.get("name", rec.get("point", "?"))), shape=shape or None,
        knobs=dict(rec.get("knobs") or {}), target=str(rec.get("target", "")),
        machine=str(rec.get("machine", "")), median_ms=float(t["median"]),
        lo_ms=_opt_float(t.get("p10")), hi_ms=_opt_float(t.get("p90")), n=t.get("n"),
        gflops=_opt_float(rec.get("gflops")), peak_gflops=_opt_float(rec.get("peak_gflops")),
        pct_peak=_opt_float(rec.get("pct_peak")), kv_gbps=_opt_float(rec.get("kv_gbps")),
        read_gbps=_opt_float(rec.get("read_gbps")), max_err=_opt_float(rec.get("max_err")),
        ok=bool(rec.get("ok", True)), synthetic=bool(rec.get("synthetic", False)),
        repro=str(rec.get("repro", "")))


def _tune_trial(rec: dict, file: str) -> TuneTrial:
    return TuneTrial(
        file=file, shape_class=str(rec["shape_class"]), target=str(rec.get("target", "")),
        trial=int(rec["trial"]), schedule=str(rec.get("schedule", "")), knobs=dict(rec.get("knobs") or {}),
        median_ms=_opt_float(rec.get("median_ms")), best_ms=_opt_float(rec.get("best_ms")),
        status=str(rec.get("status", "ok")), synthetic=bool(rec.get("synthetic", False)))


def parse_benchmark_name(run_name: str) -> tuple[str, str, str]:
    """'fwd+combine/<backend>/<schedule>/<shape>[/min_time:..][/repeats:..][/manual_time]' ->
    (backend, schedule, shape)."""
    parts = [p for p in run_name.split("/") if not _GBENCH_OPTION.match(p)]
    if len(parts) >= 4:
        return parts[1], parts[2], "/".join(parts[3:])
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    return run_name, "", ""


def _load_gbench(doc: dict, file: str, res: Results) -> int:
    ctx = doc.get("context", {})
    peak, read = _opt_float(ctx.get("fp32_peak_gflops")), _opt_float(ctx.get("read_gbps"))
    synthetic = str(ctx.get("synthetic", "")).lower() in ("true", "1")
    runs: dict[str, dict] = {}  # run name -> {"iterations": [...], aggregate name: entry}
    errors: dict[str, str] = {}   # run name -> message (every repetition repeats it)
    for b in doc["benchmarks"]:
        name = b.get("run_name") or _GBENCH_AGGREGATE_SUFFIX.sub("", b.get("name", ""))
        if b.get("error_occurred") or b.get("skipped"):
            errors.setdefault(name, b.get("error_message") or b.get("skip_message") or "no message")
            continue
        run = runs.setdefault(name, {"iterations": []})
        if b.get("run_type") == "aggregate":
            run[b.get("aggregate_name", "")] = b
        else:
            run["iterations"].append(b)
    for name, why in errors.items():
        res.notes.append(f"{file}: {name}: benchmark reported an error ({why}), skipped")
    n = 0
    for name, run in runs.items():
        its = run["iterations"]
        ms = lambda e: float(e["real_time"]) * _MS_PER_UNIT.get(e.get("time_unit", "ns"), 1e-6)
        if "median" in run:
            main, median = run["median"], ms(run["median"])
            reps = int(main.get("repetitions", len(its) or 1))
            if "stddev" in run:
                sd = ms(run["stddev"])
                lo, hi = max(0.0, median - sd), median + sd
            else:
                lo = hi = None
        elif its:  # no aggregates: the iterations themselves
            times = sorted(ms(e) for e in its)
            main, median, reps = its[len(its) // 2], statistics.median(times), len(its)
            lo, hi = (_quantile(times, 0.1), _quantile(times, 0.9)) if len(times) > 1 else (None, None)
        else:
            continue  # only mean/stddev/cv: nothing robust to plot
        backend, schedule, shape = parse_benchmark_name(name)
        counters = {k: v for k, v in main.items()
                    if k not in _GBENCH_FIELDS and isinstance(v, (int, float)) and not isinstance(v, bool)}
        res.measurements.append(Measurement(
            source="gbench", file=file, backend=backend, schedule=schedule, shape_name=shape, shape=None,
            knobs={}, target=str(ctx.get("target", "")), machine=str(ctx.get("host_name", "")),
            median_ms=median, lo_ms=lo, hi_ms=hi, n=reps,
            gflops=_opt_float(counters.pop("GFLOP/s", None)), peak_gflops=peak,
            pct_peak=_opt_float(counters.pop("pct_peak", None)),
            kv_gbps=_opt_float(counters.pop("kv_GB/s", None)), read_gbps=read,
            max_err=_opt_float(counters.pop("max_err", None)), synthetic=synthetic,
            repro=f"{ctx.get('executable', 'bench_kvouter')} --benchmark_filter='^{re.escape(name)}$'",
            counters=counters))
        n += 1
    return n


_GBENCH_FIELDS = {"family_index", "per_family_instance_index", "repetitions", "repetition_index", "threads",
                  "iterations", "real_time", "cpu_time"}


def _quantile(sorted_values: list[float], q: float) -> float:
    pos = q * (len(sorted_values) - 1)
    i = int(pos)
    j = min(i + 1, len(sorted_values) - 1)
    return sorted_values[i] + (sorted_values[j] - sorted_values[i]) * (pos - i)


def _label_shapes(ms: list[Measurement]) -> None:
    """Labels a shape by its name, adding the fields that differ between shapes of the same name
    (a topk sweep over 'prefill' gives 'prefill topk=4', 'prefill topk=8', ...)."""
    by_name: dict[str, list[dict]] = {}
    for m in ms:
        if m.shape:
            by_name.setdefault(m.shape_name, []).append(m.shape)
    varying: dict[str, list[str]] = {}
    for name, shapes in by_name.items():
        keys = [k for k in shapes[0] if k != "name"]
        varying[name] = [k for k in keys if len({json.dumps(s.get(k)) for s in shapes}) > 1]
    for m in ms:
        keys = varying.get(m.shape_name, []) if m.shape else []
        m.shape_label = " ".join([m.shape_name] + [f"{k}={m.shape.get(k)}" for k in keys])


def _shape_order(m: Measurement):
    """Sort key among shapes of one name: numbers by value (topk=4 before topk=16), others as text."""
    return tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, json.dumps(v, sort_keys=True))
                 for k, v in (m.shape or {}).items() if k != "name")


# ---------------------------------------------------------------------------------------------
# Tables (lists of dicts; format_table prints them)


def best_by(ms: Iterable[Measurement], key: Callable[[Measurement], object],
            score: Callable[[Measurement], float]) -> dict:
    """The measurement with the lowest score for each key, in order of first appearance."""
    best: dict = {}
    for m in ms:
        k = key(m)
        if k not in best or score(m) < score(best[k]):
            best[k] = m
    return best


def _ordered_groups(ms: Iterable[Measurement]) -> list[str]:
    first: dict[str, Measurement] = {}
    names: list[str] = []
    for m in ms:
        first.setdefault(m.shape_label, m)
        if m.shape_name not in names:
            names.append(m.shape_name)
    return sorted(first, key=lambda g: (names.index(first[g].shape_name), _shape_order(first[g])))


def _family(m) -> str:
    """The panel a sweep point belongs to: its base shape when the record names one (kvouter's
    sweeps vary kv, topk and block size inside a base), else its shape name."""
    return str((m.shape or {}).get("base") or m.shape_name)


def speedup_rows(res: Results) -> list[dict]:
    """Speedup over dense: each non-dense record against the fastest dense record of the same
    shape on the same machine; the best knobs per (series, shape)."""
    ok = [m for m in res.ok_measurements() if m.shape]
    dense = best_by((m for m in ok if m.backend == DENSE_BACKEND), lambda m: (m.shape_key, m.machine),
                    lambda m: m.median_ms)
    others = best_by((m for m in ok if m.backend != DENSE_BACKEND and (m.shape_key, m.machine) in dense),
                     lambda m: (m.series, m.shape_key, m.machine), lambda m: m.median_ms)
    rows = []
    for m in others.values():
        d = dense[(m.shape_key, m.machine)]
        rows.append({"shape": m.shape_label, "family": _family(m), "series": m.series, "knobs": m.knobs_text,
                     "sparsity": m.sparsity, "time_ms": m.median_ms, "dense_ms": d.median_ms,
                     "speedup": d.median_ms / m.median_ms})
    families = list(dict.fromkeys(_family(m) for m in ok))
    return sorted(rows, key=lambda r: (families.index(r["family"]), r["series"], r["sparsity"] or 0.0))


def schedule_rows(res: Results) -> list[dict]:
    """Median time and spread per (shape, series), the best knobs of each."""
    ms = res.ok_measurements()
    best = best_by(ms, lambda m: (m.shape_label, m.series), lambda m: m.median_ms)
    order = _ordered_groups(ms)
    rows = [{"shape": m.shape_label, "series": m.series, "knobs": m.knobs_text, "median_ms": m.median_ms,
             "lo_ms": m.lo_ms, "hi_ms": m.hi_ms, "spread": "p10..p90" if m.source == "sweep" else "±stddev",
             "n": m.n, "x_direct": m.counters.get("x_direct")} for m in best.values()]
    return sorted(rows, key=lambda r: (order.index(r["shape"]), r["median_ms"]))


def manual_vs_auto_rows(res: Results) -> list[dict]:
    """Best manual schedule next to best autoscheduled twin (auto_*), per (shape, backend, source)."""
    best: dict = {}
    for m in res.ok_measurements():
        kind = "auto" if m.schedule.startswith("auto") else "manual"
        k = (m.shape_label, m.backend, m.source, kind)
        if k not in best or m.median_ms < best[k].median_ms:
            best[k] = m
    rows = []
    for (shape, backend, source, kind), man in best.items():
        auto = best.get((shape, backend, source, "auto"))
        if kind != "manual" or auto is None:
            continue
        rows.append({"shape": shape, "backend": backend + (BENCH_MARK if source == "gbench" else ""),
                     "manual": man.schedule, "manual_ms": man.median_ms, "auto": auto.schedule,
                     "auto_ms": auto.median_ms, "auto/manual": auto.median_ms / man.median_ms})
    return rows


def gflops_rows(res: Results) -> list[dict]:
    """Throughput per (shape, series), best of each, against the measured peaks."""
    ms = [m for m in res.ok_measurements() if m.gflops is not None]
    best = best_by(ms, lambda m: (m.shape_label, m.series), lambda m: -m.gflops)
    order = _ordered_groups(ms)
    rows = []
    for m in best.values():
        pct = m.pct_peak if m.pct_peak is not None else (
            100 * m.gflops / m.peak_gflops if m.peak_gflops else None)
        rows.append({"shape": m.shape_label, "series": m.series, "gflops": m.gflops, "peak_gflops": m.peak_gflops,
                     "pct_peak": pct, "kv_gbps": m.kv_gbps, "read_gbps": m.read_gbps,
                     "pct_read": 100 * m.kv_gbps / m.read_gbps if m.kv_gbps and m.read_gbps else None,
                     "machine": m.machine})
    return sorted(rows, key=lambda r: (order.index(r["shape"]), r["series"]))


def tuning_series(res: Results) -> dict[tuple[str, str], list[dict]]:
    """Per (shape_class, target): the trials in order, each with the best-so-far median."""
    groups: dict[tuple[str, str], list[TuneTrial]] = {}
    for t in res.trials:
        groups.setdefault((t.shape_class, t.target), []).append(t)
    out = {}
    for key, trials in groups.items():
        best, rows = None, []
        for t in sorted(trials, key=lambda t: t.trial):
            if t.ok and (best is None or t.median_ms < best):
                best = t.median_ms
            rows.append({"trial": t.trial, "status": t.status, "schedule": t.schedule, "knobs": t.knobs,
                         "median_ms": t.median_ms, "best_so_far_ms": best, "logged_best_ms": t.best_ms})
        out[key] = rows
    return out


def tuning_rows(res: Results) -> list[dict]:
    """One summary line per (shape_class, target)."""
    rows = []
    for (shape_class, target), trials in tuning_series(res).items():
        ok = [t for t in trials if t["status"] == "ok" and t["median_ms"] is not None]
        win = min(ok, key=lambda t: t["median_ms"]) if ok else None
        rows.append({"shape_class": shape_class, "target": target, "trials": len(trials), "ok": len(ok),
                     "rejected": sum(t["status"].startswith("rejected") for t in trials),
                     "dropped": sum(t["status"] == "dropped" for t in trials),
                     "best_ms": win["median_ms"] if win else None, "best_trial": win["trial"] if win else None,
                     "best": (win["schedule"] + " " + ",".join(f"{k}={v}" for k, v in sorted(win["knobs"].items())))
                     if win else "-"})
    return rows


def gpu_rows(res: Results) -> list[dict]:
    """Per GPU shape and implementation (with its variant), the fastest recorded median, with its
    share of the FP32 peak and of HBM bandwidth and the shape's target; fastest first."""
    best: dict[tuple, GpuRun] = {}
    for g in res.gpu:
        if not g.ok:
            continue
        key = (g.shape, g.device, g.impl, g.variant)
        if key not in best or g.median_ms < best[key].median_ms:
            best[key] = g
    rows = []
    devices = {g.device for g in best.values()}
    for (shape, device, impl, variant), g in sorted(best.items(), key=lambda kv: (kv[0][0], kv[1].median_ms)):
        metric, target = GPU_TARGETS.get(shape, ("pct_peak", None))
        rows.append({"shape": shape, "implementation": impl + (f" ({device})" if len(devices) > 1 else ""),
                     "variant": variant or "-", "median_ms": g.median_ms,
                     "pct_fp32_peak": g.pct_peak, "pct_hbm": g.pct_hbm, "checked": g.checked,
                     "target": f"{target:g} % {'HBM' if metric == 'pct_hbm' else 'FP32'}" if target else "-",
                     "file": Path(g.file).name})
    return rows


def format_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """A plain-text table: numbers to 4 significant digits, right-aligned; None as '-'."""
    if not rows:
        return "(no rows)"
    columns = columns or list(rows[0])

    def cell(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, dict):
            return ",".join(f"{k}={x}" for k, x in sorted(v.items())) or "-"
        return str(v)

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    numeric = [all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows) for c in columns]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    fmt = lambda vals: "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric))
    return "\n".join([fmt(columns).rstrip(), "  ".join("-" * w for w in widths)] + [fmt(r).rstrip() for r in cells])


# ---------------------------------------------------------------------------------------------
# Figures: each fig_* returns (Figure, "") or (None, why it was skipped)


def _colors(series: Iterable[str]) -> dict[str, tuple]:
    """One colour per backend/schedule; a benchmark series shares it with the sweep series of the
    same name (bars of benchmarks are hatched instead)."""
    series = sorted(set(series))
    bases = sorted({s.removesuffix(BENCH_MARK) for s in series})
    cmap = matplotlib.colormaps["tab10" if len(bases) <= 10 else "tab20"]
    return {s: cmap(bases.index(s.removesuffix(BENCH_MARK)) % cmap.N) for s in series}


def _hatch(s: str, series: Iterable[str]) -> str | None:
    """Benchmark bars are hatched where they stand beside sweep bars (alone, they need no marking)."""
    mixed = len({x.endswith(BENCH_MARK) for x in series}) > 1
    return "///" if mixed and s.endswith(BENCH_MARK) else None


def _title(fig: Figure, text: str, res: Results) -> None:
    fig.suptitle(text + ("\nSYNTHETIC fixture data, not measurements" if res.synthetic else ""),
                 color="firebrick" if res.synthetic else "black")


def _log_if_wide(ax, values: list[float], axis: str, ratio: float, base: int = 10) -> None:
    pos = [v for v in values if v and v > 0]
    if pos and max(pos) / min(pos) >= ratio:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=base)


def _grouped_bars(ax, groups: list[str], series: list[str], values: dict, colors: dict,
                  spread: dict | None = None) -> list[str]:
    """Bars per group, only the series present in each (no empty slots); returns the series drawn."""
    x, ticks, drawn = 0.0, [], []
    for g in groups:
        start = x
        for s in series:
            if (g, s) not in values:
                continue
            v = values[(g, s)]
            yerr = None
            lo, hi = (spread or {}).get((g, s), (None, None))
            if lo is not None and hi is not None:
                yerr = [[max(0.0, v - lo)], [max(0.0, hi - v)]]
            ax.bar(x, v, 0.85, color=colors[s], hatch=_hatch(s, series), edgecolor="white", linewidth=0, yerr=yerr,
                   capsize=2, error_kw={"elinewidth": 0.8})
            if s not in drawn:
                drawn.append(s)
            x += 1
        if x > start:
            ticks.append(((start + x - 1) / 2, g))
            x += 0.8
    ax.set_xticks([t for t, _ in ticks], [g for _, g in ticks], rotation=30, ha="right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return drawn


def _series_legend(ax, drawn: list[str], colors: dict, extra: list | None = None) -> None:
    handles = [Patch(facecolor=colors[s], hatch=_hatch(s, drawn), edgecolor="white", label=s)
               for s in sorted(drawn)] + (extra or [])
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def fig_speedup_vs_sparsity(res: Results) -> tuple[Figure | None, str]:
    rows = [r for r in speedup_rows(res) if r["sparsity"] is not None]
    if not rows:
        sweeps = [m for m in res.ok_measurements() if m.source == "sweep"]
        if not sweeps:
            return None, "no sweep records (it needs full shapes, which benchmarks do not carry)"
        if not any(m.backend == DENSE_BACKEND for m in sweeps):
            return None, f"no dense rows (backend == '{DENSE_BACKEND}') among the sweep records"
        return None, "no non-dense sweep record shares shape and machine with a dense one"
    families = list(dict.fromkeys(r["family"] for r in rows))
    colors = _colors(r["series"] for r in rows)
    fig = Figure(figsize=(4.8 * len(families) + 2.2, 4.2), layout="constrained")
    axes = fig.subplots(1, len(families), squeeze=False)[0]
    for ax, fam in zip(axes, families):
        fam_rows = [r for r in rows if r["family"] == fam]
        for s in sorted({r["series"] for r in fam_rows}):
            best: dict[float, float] = {}  # several shapes of one sparsity: the best speedup
            for r in fam_rows:
                if r["series"] == s:
                    best[r["sparsity"]] = max(best.get(r["sparsity"], 0.0), r["speedup"])
            xs = sorted(best)
            ax.plot(xs, [best[x] for x in xs], marker="o", ms=4, color=colors[s], label=s)
        ax.axhline(1.0, color="gray", ls="--", lw=1, label="dense")
        _log_if_wide(ax, [r["sparsity"] for r in fam_rows], "x", 4, base=2)
        _log_if_wide(ax, [r["speedup"] for r in fam_rows] + [1.0], "y", 8, base=2)
        ax.set_title(fam)
        ax.set_xlabel("sparsity = topk·block_size / kv_len")
        ax.set_ylabel("speedup over dense (×)")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _title(fig, "Speedup over dense vs sparsity (best knobs per point)", res)
    return fig, ""


def fig_gflops_vs_roofline(res: Results) -> tuple[Figure | None, str]:
    rows = gflops_rows(res)
    if not rows:
        return None, "no record carries gflops"
    groups = list(dict.fromkeys(r["shape"] for r in rows))
    series = sorted({r["series"] for r in rows})
    colors = _colors(series)
    kv_rows = [r for r in rows if r["kv_gbps"] is not None]
    n_bars = len(rows)
    fig = Figure(figsize=(max(7.0, 0.28 * n_bars + 4.5), 4.4 * (2 if kv_rows else 1)), layout="constrained")
    axes = fig.subplots(2 if kv_rows else 1, 1, squeeze=False)[:, 0]

    def ceilings(ax, key: str, unit: str, what: str) -> list:
        handles = []
        levels = {(round(r[key], 1), r["machine"]) for r in rows if r[key]}
        machines = {m for _, m in levels}
        for i, (level, machine) in enumerate(sorted(levels)):
            label = f"{what} {level:g} {unit}" + (f" ({machine})" if len(machines) > 1 else "")
            handles.append(ax.axhline(level, color="black", ls=["--", ":", "-."][i % 3], lw=1.2, label=label))
        return handles

    ax = axes[0]
    drawn = _grouped_bars(ax, groups, series, {(r["shape"], r["series"]): r["gflops"] for r in rows}, colors)
    peaks = ceilings(ax, "peak_gflops", "GFLOP/s", "measured FP32 peak")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("throughput" + ("" if peaks else " (no measured peak recorded)"), fontsize=10)
    _series_legend(ax, drawn, colors, peaks)
    if kv_rows:
        ax = axes[1]
        drawn = _grouped_bars(ax, groups, series, {(r["shape"], r["series"]): r["kv_gbps"] for r in kv_rows},
                              colors)
        reads = ceilings(ax, "read_gbps", "GB/s", "measured read bandwidth")
        ax.set_ylabel("KV GB/s")
        ax.set_title("KV bytes loaded per second" + ("" if reads else " (no measured bandwidth recorded)"),
                     fontsize=10)
        _series_legend(ax, drawn, colors, reads)
    _title(fig, "Throughput against the measured roofline (best per shape)", res)
    return fig, ""


def fig_schedule_bars(res: Results) -> tuple[Figure | None, str]:
    rows = schedule_rows(res)
    if not rows:
        return None, "no timed records (sweep or benchmark)"
    groups = list(dict.fromkeys(r["shape"] for r in rows))
    series = sorted({r["series"] for r in rows})
    colors = _colors(series)
    fig = Figure(figsize=(max(7.0, 0.28 * len(rows) + 4.5), 4.8), layout="constrained")
    ax = fig.subplots()
    key = lambda r: (r["shape"], r["series"])
    drawn = _grouped_bars(ax, groups, series, {key(r): r["median_ms"] for r in rows}, colors,
                          {key(r): (r["lo_ms"], r["hi_ms"]) for r in rows})
    _log_if_wide(ax, [r["median_ms"] for r in rows], "y", 30)
    ax.set_ylabel("median time (ms), lower is better")
    spreads = sorted({r["spread"] for r in rows if r["lo_ms"] is not None})
    ax.set_title("error bars: " + (", ".join({"p10..p90": "p10..p90 (sweeps)",
                                               "±stddev": "median ± stddev (Google Benchmark)"}[s]
                                              for s in spreads) or "none recorded"), fontsize=9)
    _series_legend(ax, drawn, colors)
    _title(fig, "Schedules compared (best knobs per schedule and shape)", res)
    return fig, ""


def fig_tuning_convergence(res: Results) -> tuple[Figure | None, str]:
    series = tuning_series(res)
    if not series:
        return None, "no tuning-log records"
    if not any(r["best_so_far_ms"] is not None for rows in series.values() for r in rows):
        return None, "no tuning trial finished with status 'ok'"
    labels = {k: f"{k[0]} / {k[1]}" for k in series}
    colors = _colors(labels.values())
    fig = Figure(figsize=(8.5, 4.6), layout="constrained")
    ax = fig.subplots()
    values = []
    for key, rows in series.items():
        c = colors[labels[key]]
        pts = [(r["trial"], r["best_so_far_ms"]) for r in rows if r["best_so_far_ms"] is not None]
        ok = [(r["trial"], r["median_ms"]) for r in rows if r["status"] == "ok" and r["median_ms"] is not None]
        rejected = sum(r["status"].startswith("rejected") for r in rows)
        dropped = sum(r["status"] == "dropped" for r in rows)
        ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", color=c, lw=1.8,
                label=f"{labels[key]} ({len(ok)} ok, {rejected} rejected, {dropped} dropped)")
        ax.scatter([p[0] for p in ok], [p[1] for p in ok], color=c, s=12, alpha=0.35)
        values += [p[1] for p in ok]
    _log_if_wide(ax, values, "y", 10)
    ax.set_xlabel("trial")
    ax.set_ylabel("median time (ms): best so far (line), each trial (dots)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _title(fig, "Tuning convergence per (shape class, target)", res)
    return fig, ""


def fig_gpu_roofline(res: Results) -> tuple[Figure | None, str]:
    rows = gpu_rows(res)
    if not rows:
        return None, "no GPU benchmark records (kvouter_gpu_bench or torch_compare JSON)"
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig = Figure(figsize=(9.0, sum(1.2 + 0.32 * sum(r["shape"] == s for r in rows) for s in shapes)),
                 layout="constrained")
    axes = fig.subplots(len(shapes), 1, squeeze=False)[:, 0]
    for ax, shape in zip(axes, shapes):
        metric, target = GPU_TARGETS.get(shape, ("pct_peak", None))
        key = "pct_hbm" if metric == "pct_hbm" else "pct_fp32_peak"
        sub = [r for r in rows if r["shape"] == shape and r[key] is not None]
        if not sub:
            ax.set_axis_off()
            ax.set_title(f"{shape}: no run with a work count (a PyTorch file needs a kvouter run of the shape)",
                         fontsize=9)
            continue
        labels = [r["implementation"] + ("" if r["variant"] == "-" else f" {r['variant']}") for r in sub]
        colors = ["tab:gray" if r["implementation"].startswith("torch") else
                  "tab:green" if r["implementation"].endswith("@host-cuda") else "tab:blue" for r in sub]
        ax.barh(range(len(sub)), [r[key] for r in sub], color=colors)
        for i, r in enumerate(sub):
            ax.text(r[key], i, f" {r['median_ms']:.4g} ms", va="center", fontsize=7)
        ax.set_yticks(range(len(sub)), labels, fontsize=7)
        ax.invert_yaxis()
        what = "% of HBM bandwidth (K/V bytes read)" if key == "pct_hbm" else "% of FP32 peak (attended FLOP)"
        ax.set_xlabel(what)
        if target:
            ax.axvline(target, color="firebrick", ls="--", lw=1.2, label=f"target {target:g} %")
            ax.legend(fontsize=7, loc="lower right")
            ax.set_xlim(0, max(target, *(r[key] for r in sub)) * 1.25)
        ax.set_title(f"{shape}: blue Vulkan, green CUDA, grey PyTorch (fastest recorded median each)", fontsize=9)
    _title(fig, "GPU shapes against the roofline", res)
    return fig, ""


FIGURE_BUILDERS: dict[str, Callable[[Results], tuple[Figure | None, str]]] = {
    "speedup_vs_sparsity": fig_speedup_vs_sparsity,
    "gflops_vs_roofline": fig_gflops_vs_roofline,
    "schedule_bars": fig_schedule_bars,
    "tuning_convergence": fig_tuning_convergence,
    "gpu_roofline": fig_gpu_roofline,
}


def write_figures(res: Results, out_dir: str | Path, formats=("png", "svg"),
                  log: Callable[[str], None] = print) -> list[Path]:
    """Builds every figure it can and writes each in every format; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    # A fixed hash salt and no date keep the SVGs identical from run to run.
    with matplotlib.rc_context({"svg.hashsalt": "kvouter"}):
        for name, build in FIGURE_BUILDERS.items():
            fig, why = build(res)
            if fig is None:
                log(f"skip {name}: {why}")
                continue
            for fmt in formats:
                path = out / f"{name}.{fmt}"
                fig.savefig(path, dpi=150, metadata={"Date": None} if fmt == "svg" else None)
                written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="figures: " + ", ".join(FIGURES))
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="folder for the figures (default: %(default)s)")
    ap.add_argument("files", nargs="*", metavar="FILE_OR_DIR",
                    help="sweep JSONL, tuning-log JSONL or Google Benchmark JSON files, or folders of them "
                         "(default: experiments/results)")
    args = ap.parse_args(argv)
    matplotlib.use("Agg")
    paths = args.files or [str(Path(__file__).resolve().parent / "results")]
    res = load_results(paths)
    print(res.summary())
    if not res.measurements and not res.trials and not res.gpu:
        print("nothing to plot", file=sys.stderr)
        return 1
    written = write_figures(res, args.out)
    print(f"wrote {len(written)} file(s):")
    for p in written:
        print(f"  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
