#!/usr/bin/env python3
"""Executes every notebook in this folder on the committed results ($KVOUTER_RESULTS, by default
../experiments/results) and saves it with its outputs, so that it reads without running.

    .venv/bin/python notebooks/refresh.py        # or: make notebooks
"""
import hashlib
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "experiments" / "results"


def results_digest(root: Path = RESULTS) -> str:
    """sha256 over the committed result files (names and bytes; not the fixtures, not the figures):
    a notebook saved with another digest shows outputs of other results (the notebooks test fails)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if not p.is_file() or rel.parts[0] in ("fixtures", "figures") or p.suffix not in (".json", ".jsonl", ".csv"):
            continue
        h.update(str(rel).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def main() -> int:
    env_results = os.environ.get("KVOUTER_RESULTS")
    for path in sorted(HERE.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for c in nb.cells:
            if c.cell_type == "code":
                c.outputs = []
                c.execution_count = None
        NotebookClient(nb, kernel_name="python3", timeout=120, startup_timeout=60,
                       resources={"metadata": {"path": str(HERE)}}).execute()
        if not env_results:  # on the committed results: say which
            nb.metadata["kvouter"] = {"results_digest": results_digest()}
        nbformat.write(nb, path)
        print(f"executed {path.name} on {env_results or '../experiments/results'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
