"""Reading kvouter result files into records: sweep and tuning-log JSONL, Google Benchmark JSON,
kvouter_gpu_bench and torch_compare JSON (the kind told from the content). experiments/plot.py
re-exports everything here."""

from __future__ import annotations
import json
import math
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

FIGURES = ("speedup_vs_sparsity", "gflops_vs_roofline", "schedule_bars", "tuning_convergence", "gpu_roofline")
# The GPU shapes' targets (issue #4): the roofline share each is measured by, and the target.
GPU_TARGETS = {"gpu-decode": ("pct_hbm", 60.0), "gpu-prefill": ("pct_peak", 20.0)}
DENSE_BACKEND = "dense"
BENCH_MARK = " [bench]"  # appended to benchmark series: a different run from the sweeps
DEFAULT_RESULTS = "../experiments/results"  # relative to notebooks/, where Jupyter starts kernels
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results" / "figures"  # experiments/results/figures

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
    machine: str = ""      # the host the trial ran on (the log's "machine")
    halide: str = ""       # the Halide version it ran with (the tuner resumes per machine and version)

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
    """'kvouter_vulkan_onepass_d128_..._host_cuda_chunk_0_rows_16_unroll_4' -> the knobs after
    the target ('rows_16_unroll_4'; the one-chunk GPU schedules' chunk 0 is 'the whole block', as
    was chunk 4096 in results recorded before it)."""
    marker = "_" + target.replace("-", "_") + "_"
    knobs = variant.split(marker, 1)[1] if marker in variant else ""
    return re.sub(r"^chunk_(0|4096)(_|$)", "", knobs)


def _load_gpu_bench(doc: dict, file: str, res: Results) -> int:
    device = doc.get("device", "?")
    peak, hbm = _opt_float(doc.get("peak_fp32_tflops")), _opt_float(doc.get("hbm_tbps"))
    synthetic = bool(doc.get("synthetic", False))
    n = 0
    for shape_rec in doc.get("results", []):
        shape = shape_rec.get("shape", "?")
        for run in shape_rec.get("runs", []):
            name = f"{run.get('schedule', '?')}@{run.get('target', '?')}"
            ms = _record_median(run)
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
                                  median_ms=ms, ms_all=_record_all(run, ms),
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
    if "trial" in rec and "shape_class" in rec:
        return "tune"
    if "time_ms" in rec:
        return "sweep"
    return None


def _record_median(rec: dict) -> float | None:
    """A record's median in milliseconds: experiments/measure.h's schema (time_ms.median), or the
    earlier files' median_ms (tuner logs) and kernel_ms (GPU benchmark)."""
    t = rec.get("time_ms")
    if isinstance(t, dict):
        return _opt_float(t.get("median"))
    return _opt_float(rec.get("median_ms", rec.get("kernel_ms")))


def _record_all(rec: dict, ms: float) -> list[float]:
    t = rec.get("time_ms")
    if isinstance(t, dict) and isinstance(t.get("all"), list):
        return [float(x) for x in t["all"]]
    return [float(x) for x in rec.get("kernel_ms_all", [ms])]


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
        read_gbps=_opt_float(rec.get("read_gbps")), max_err=_opt_float(rec.get("max_out_err", rec.get("max_err"))),
        ok=bool(rec.get("ok", True)), synthetic=bool(rec.get("synthetic", False)),
        repro=str(rec.get("repro", "")))


def _tune_trial(rec: dict, file: str) -> TuneTrial:
    return TuneTrial(
        file=file, shape_class=str(rec["shape_class"]), target=str(rec.get("target", "")),
        trial=int(rec["trial"]), schedule=str(rec.get("schedule", "")), knobs=dict(rec.get("knobs") or {}),
        median_ms=_record_median(rec), best_ms=_opt_float(rec.get("best_ms")),
        status=str(rec.get("status", "ok")), synthetic=bool(rec.get("synthetic", False)),
        machine=str(rec.get("machine", "")), halide=str(rec.get("halide_version", "")))


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
        elif len(its) == 1 and "p10_ms" in its[0]:
            # One iteration that ran the measurement core (experiments/measure.h): its real_time is
            # the median of its repetitions, whose spread and count are counters.
            main, median = its[0], ms(its[0])
            reps = int(main.get("n", 1))
            lo, hi = _opt_float(main.get("p10_ms")), _opt_float(main.get("p90_ms"))
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
                  "iterations", "real_time", "cpu_time", "p10_ms", "p90_ms", "n"}


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
