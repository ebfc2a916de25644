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

The logic lives once, in experiments/plotting/: load.py (records from result files), rows.py
(tables) and figures.py (the figures); this script re-exports it, and the notebooks `import plot`.
Nothing here times anything: it only reads what the experiments recorded.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
import matplotlib

sys.path.insert(0, str(Path(__file__).resolve().parent))  # plotting/, when run as a script from elsewhere
# The notebooks `import plot`: loading, tables and figures are re-exported from plotting/.
from plotting.load import *  # noqa: F401,F403
from plotting.rows import *  # noqa: F401,F403
from plotting.figures import *  # noqa: F401,F403


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
