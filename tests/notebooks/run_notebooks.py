#!/usr/bin/env python3
"""Runs every notebook in notebooks/ headless against the synthetic fixtures, and plot.py over the
same fixtures, and checks what comes out. One line per check, then 'N passed, M failed'; exits 1 on
any failure.

    .venv/bin/python tests/notebooks/run_notebooks.py [--keep DIR]   # DIR: the executed notebooks

Run it with the venv's python: the kernel is that interpreter's ipykernel (jupyter_client starts the
'python3' kernel spec with sys.executable).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
sys.path.insert(0, str(NOTEBOOKS))
from refresh import results_digest  # noqa: E402
FIXTURES = REPO / "experiments" / "results" / "fixtures"
PLOT = REPO / "experiments" / "plot.py"
FIGURES = ("speedup_vs_sparsity", "gflops_vs_roofline", "schedule_bars", "tuning_convergence", "gpu_roofline")
REQUIRED_NOTEBOOKS = ("compare_schedules", "roofline", "sparse_vs_dense")
# Notebooks load results; they never time anything (STYLE.md).
TIMING = re.compile(r"%%?timeit|\btime\.(perf_counter|time|monotonic|process_time)|\btimeit\b|"
                    r"subprocess|build/bin|kvouter_bench")

failures: list[str] = []
passed = [0]


def expect(cond: bool, what: str) -> bool:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if cond:
        passed[0] += 1
    else:
        failures.append(what)
    return cond


def outputs(nb, output_type=None, mime=None):
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if output_type and out.get("output_type") != output_type:
                continue
            if mime and mime not in out.get("data", {}):
                continue
            yield out


def check_kernel() -> None:
    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        expect(False, "a 'python3' kernel spec exists (pip install ipykernel into the venv)")
        return
    # jupyter_client swaps a bare 'python' for sys.executable; anything else must be this venv's python.
    exe = spec.argv[0]
    same = exe in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}") or \
        Path(exe).resolve() == Path(sys.executable).resolve()
    expect(same, f"python3 kernel runs this interpreter ({sys.executable}; spec says {exe})")


def run_notebook(path: Path, keep: Path | None) -> None:
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    hit = TIMING.search(code)
    expect(hit is None, f"{path.name}: times nothing and runs no binaries"
           + (f" (found {hit.group(0)!r})" if hit else ""))
    # Committed executed on the committed results (make notebooks), so that they read without
    # running: every code cell has its outputs and none is an error. Here they run again on the
    # fixtures, from cleared outputs.
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    expect(all(c.get("outputs") for c in code_cells) and not any(o.get("output_type") == "error"
                                                                 for c in code_cells for o in c.get("outputs", [])),
           f"{path.name}: stored executed (every code cell has outputs, none an error; make notebooks)")
    saved = nb.metadata.get("kvouter", {}).get("results_digest")
    expect(saved == results_digest(),
           f"{path.name}: its saved outputs are of the committed results (digest {str(saved)[:12]} vs "
           f"{results_digest()[:12]}; make notebooks after a result file changes)")
    for c in code_cells:
        c.outputs = []
        c.execution_count = None
    start = time.monotonic()
    client = NotebookClient(nb, kernel_name="python3", timeout=60, startup_timeout=30,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    # The kernel's own stderr (a TCP-transport warning on every start) is shown only on failure.
    with tempfile.TemporaryFile("w+") as kernel_stderr:
        try:
            client.execute(stderr=kernel_stderr)
            error = None
        except CellExecutionError as e:
            error = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
        except Exception as e:  # the kernel did not start, a cell timed out, ...
            error = f"{type(e).__name__}: {e}"
        secs = time.monotonic() - start
        if keep:
            nbformat.write(nb, keep / path.name)
        if not expect(error is None,
                      f"{path.name}: executes without error ({secs:.1f} s)" + (f": {error}" if error else "")):
            kernel_stderr.seek(0)
            print(kernel_stderr.read(), end="")
            return
    text = "".join(o.get("text", "") for o in outputs(nb, "stream"))
    expect(str(FIXTURES) in text and "SYNTHETIC" in text,
           f"{path.name}: read the fixtures named by KVOUTER_RESULTS")
    has_table = re.search(r"^-+(  -+)+$", text, re.M) is not None  # format_table's rule under the header
    expect(has_table and "(no rows)" not in text, f"{path.name}: prints a table with rows")
    n_png = sum(1 for _ in outputs(nb, mime="image/png"))
    expect(n_png >= 1 and "no figure:" not in text, f"{path.name}: shows a figure ({n_png} PNG output(s))")


def run_plot(args: list[str], out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PLOT), "--out", str(out), *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "MPLBACKEND": "Agg"})


def check_plot(tmp: Path) -> None:
    out = tmp / "figures"
    r = run_plot([str(FIXTURES)], out)
    if not expect(r.returncode == 0, f"plot.py over the fixtures exits 0 (rc {r.returncode})"):
        print(r.stdout + r.stderr)
        return
    for name in FIGURES:
        png, svg = out / f"{name}.png", out / f"{name}.svg"
        ok_png = png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        ok_svg = svg.is_file() and b"<svg" in svg.read_bytes()[:2000]
        expect(ok_png and ok_svg, f"plot.py wrote {name}.png and {name}.svg")
    expect(r.stdout.strip().splitlines()[-1].strip() == str(out / "gpu_roofline.svg")
           and "wrote 10 file(s):" in r.stdout, "plot.py ends by listing the 10 files it wrote")
    expect("ok=false are left out" in r.stdout and "benchmark reported an error" in r.stdout,
           "plot.py says which records it left out (ok=false, benchmark error)")

    # The GPU results' tables are generated from their JSON (experiments/gpu_table.py).
    r = subprocess.run([sys.executable, str(REPO / "experiments" / "gpu_table.py"), str(FIXTURES / "gpu_bench_synthetic.json")],
                       capture_output=True, text=True, timeout=60)
    expect(r.returncode == 0 and "| gpu-decode | float32 | vulkan_onepass @ host-cuda | 1.103 |" in r.stdout
           and "matches direct" in r.stdout, f"gpu_table.py prints the fixture's kernel rows: {r.stderr[-300:]}")

    # Inputs for only one figure: the other four are skipped, each with its reason.
    out2 = tmp / "only_tuning"
    r = run_plot([str(FIXTURES / "tune_synthetic.jsonl")], out2)
    written = sorted(p.name for p in out2.iterdir()) if out2.is_dir() else []
    skips = [line for line in r.stdout.splitlines() if line.startswith("skip ")]
    expect(r.returncode == 0 and written == ["tuning_convergence.png", "tuning_convergence.svg"] and len(skips) == 4,
           f"plot.py with only a tuning log writes only tuning_convergence and skips 4 figures, saying why")

    # The GPU files alone: only gpu_roofline.
    out4 = tmp / "only_gpu"
    r = run_plot([str(FIXTURES / "gpu_bench_synthetic.json"), str(FIXTURES / "torch_compare_synthetic.json")], out4)
    written = sorted(p.stem for p in out4.iterdir()) if out4.is_dir() else []
    expect(r.returncode == 0 and set(written) == {"gpu_roofline"} and "no generated kernel" in r.stdout
           and "vulkan_tiled@host-vulkan: differs (vs_direct), left out" in r.stdout
           and "torch flex: OutOfMemoryError" in r.stdout,
           "plot.py with only GPU benchmark and PyTorch JSON draws gpu_roofline and names each run it left out")
    # PyTorch alone: no work counts to take, so no shares; the figure says so instead of failing.
    out5 = tmp / "only_torch"
    r = run_plot([str(FIXTURES / "torch_compare_synthetic.json")], out5)
    expect(r.returncode == 0 and (out5 / "gpu_roofline.png").is_file(),
           "plot.py with only PyTorch JSON still draws gpu_roofline (each shape saying it lacks a work count)")

    # The benchmark JSON alone: no full shapes, so no speedup figure; the others are drawn.
    out3 = tmp / "only_bench"
    r = run_plot([str(FIXTURES / "bench_synthetic.json")], out3)
    written = sorted(p.stem for p in out3.iterdir()) if out3.is_dir() else []
    expect(r.returncode == 0 and set(written) == {"gflops_vs_roofline", "schedule_bars"}
           and "skip speedup_vs_sparsity" in r.stdout,
           "plot.py with only Google Benchmark JSON draws the roofline and schedule figures")

    r = run_plot([str(tmp / "does_not_exist.jsonl")], tmp / "none")
    expect(r.returncode == 1, "plot.py with nothing readable exits 1")


def check_helpers() -> None:
    """The numbers the notebooks show, checked against the fixtures by hand-computable rules."""
    sys.path.insert(0, str(PLOT.parent))
    import plot
    res = plot.load_results(FIXTURES)
    kinds = sorted({k for _, k, _ in res.loaded})
    expect(kinds == ["Google Benchmark", "experiments/torch_compare.py", "kvouter_gpu_bench", "sweep", "tune"],
           f"content detection finds all five kinds ({kinds})")
    rows = plot.speedup_rows(res)
    sweep = [m for m in res.ok_measurements() if m.source == "sweep"]
    r = rows[0]
    shape = next(m for m in sweep if m.shape_label == r["shape"] and m.series == r["series"]).shape
    dense = min(m.median_ms for m in sweep if m.backend == "dense" and m.shape == shape)
    expect(abs(r["speedup"] - dense / r["time_ms"]) < 1e-12 and r["dense_ms"] == dense
           and abs(r["sparsity"] - shape["topk"] * shape["block_size"] / shape["kv"]) < 1e-12,
           "speedup = dense median / median of the same shape; sparsity = topk*block_size/kv")
    expect(not any("auto_li2018" in x["series"] for x in plot.schedule_rows(res)),
           "records with ok=false stay out of the tables")
    tiled = [m for m in sweep if m.schedule == "cpu_tiled" and m.shape_label == "prefill topk=16"]
    row = next(x for x in plot.schedule_rows(res) if x["shape"] == "prefill topk=16" and x["series"] == "jit/cpu_tiled")
    expect(len(tiled) == 2 and row["median_ms"] == min(m.median_ms for m in tiled),
           "a schedule run with several knobs shows its fastest")
    bench = next(m for m in res.measurements if m.source == "gbench" and m.series == "jit/cpu_tiled [bench]"
                 and m.shape_name == "prefill")
    expect(bench.peak_gflops == 128.0 and bench.lo_ms is not None and bench.lo_ms < bench.median_ms < bench.hi_ms,
           "benchmark runs take the median, ±stddev and the context's fp32_peak_gflops")
    gpu = plot.gpu_rows(res)
    cuda = next(r for r in gpu if r["shape"] == "gpu-decode" and r["implementation"] == "vulkan_onepass@host-cuda")
    gather = next(r for r in gpu if r["shape"] == "gpu-decode" and r["implementation"] == "torch gather")
    expect(abs(cuda["pct_hbm"] - 100 * 1.0e9 / (cuda["median_ms"] * 1e-3) / 4.0e12) < 1e-9
           and abs(gather["pct_fp32_peak"] - 100 * 8.0e9 / 3.0e-3 / 60.0e12) < 1e-9,
           "GPU shares: K/V bytes / median / HBM; PyTorch takes the shape's work from the kvouter run")
    decode = [r for r in gpu if r["shape"] == "gpu-decode"]
    expect(not any(r["implementation"] in ("vulkan_tiled@host-vulkan", "torch flex", "vulkan_rows@host-cuda")
                   for r in decode) and [r["median_ms"] for r in decode] == sorted(r["median_ms"] for r in decode)
           and {r["variant"] for r in decode if r["implementation"] == "vulkan_onepass@host-vulkan"}
           == {"rows_16_unroll_2", "rows_8_unroll_4"},
           "GPU rows: failed checks, errors and missing kernels left out; variants apart; fastest first")
    series = plot.tuning_series(res)
    ok = all(all(t["best_so_far_ms"] == t["logged_best_ms"] for t in trials) for trials in series.values())
    expect(ok, "tuning best-so-far agrees with the log's best_ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="write the executed notebooks here")
    args = ap.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    os.environ["KVOUTER_RESULTS"] = str(FIXTURES)  # the kernels inherit it
    start = time.monotonic()
    check_kernel()
    found = sorted(NOTEBOOKS.glob("*.ipynb"))
    names = {p.stem for p in found}
    expect(set(REQUIRED_NOTEBOOKS) <= names, f"notebooks present: {', '.join(sorted(names)) or 'none'}")
    for path in found:
        run_notebook(path, args.keep)
    with tempfile.TemporaryDirectory(prefix="kvouter_plot_") as tmp:
        check_plot(Path(tmp))
    check_helpers()
    print(f"took {time.monotonic() - start:.1f} s")
    print(f"{passed[0]} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
