"""Tables from loaded results: lists of dicts, printed by format_table."""

from __future__ import annotations
from pathlib import Path
from typing import Callable, Iterable

from plotting.load import (BENCH_MARK, DENSE_BACKEND, GPU_TARGETS, GpuRun, Measurement, Results, TuneTrial, _shape_order)


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


def tuning_series(res: Results) -> dict[tuple[str, str, str], list[dict]]:
    """Per (shape_class, target, machine): the trials in order, each with the best-so-far median (a
    log holds every machine's trials; each machine and Halide version tunes its own database
    entry, so the machine part names the version too where the log gives it)."""
    groups: dict[tuple[str, str, str], list[TuneTrial]] = {}
    for t in res.trials:
        machine = t.machine + (f", Halide {t.halide}" if t.halide else "")
        groups.setdefault((t.shape_class, t.target, machine), []).append(t)
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
    """One summary line per (shape_class, target, machine)."""
    rows = []
    for (shape_class, target, machine), trials in tuning_series(res).items():
        ok = [t for t in trials if t["status"] == "ok" and t["median_ms"] is not None]
        win = min(ok, key=lambda t: t["median_ms"]) if ok else None
        rows.append({"shape_class": shape_class, "target": target, "machine": machine or "-",
                     "trials": len(trials), "ok": len(ok),
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
