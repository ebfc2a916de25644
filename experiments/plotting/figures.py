"""The figures: each fig_* returns (Figure, "") or (None, why it was skipped); write_figures writes
them all as PNG and SVG."""

from __future__ import annotations
from pathlib import Path
from typing import Callable, Iterable
import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from plotting.load import (BENCH_MARK, DENSE_BACKEND, GPU_TARGETS, Results)
from plotting.rows import (gflops_rows, gpu_rows, schedule_rows, speedup_rows, tuning_series)


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
    labels = {k: " / ".join(x for x in k if x) for k in series}
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
    _title(fig, "Tuning convergence per (shape class, target, machine)", res)
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
