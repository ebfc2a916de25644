#!/usr/bin/env python3
"""Executes every notebook in this folder on the committed results ($KVOUTER_RESULTS, by default
../experiments/results) and saves it with its outputs, so that it reads without running.

    .venv/bin/python notebooks/refresh.py        # or: make notebooks
"""
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


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
        nbformat.write(nb, path)
        print(f"executed {path.name} on {env_results or '../experiments/results'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
