"""Run `kvouter run` over a folder of cases and compare with their expected outputs (SPEC §4).

usage: check_cases.py CASES_DIR KVOUTER [extra CLI args...]
CASES_DIR/index.json maps case names to "valid" or "error". A valid case must reproduce
expect_out.npy / expect_lse.npy within SPEC's tolerance (|err| <= 2e-4 + 2e-4 * max|ref|, LSE 2e-4,
-inf exactly where expected, no NaN); an error case must exit 2 with one message on stderr and
write nothing. Prints one line per case and "N passed, M failed" last.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def check_valid(case_dir, out_dir, proc):
    if proc.returncode != 0:
        return False, f"rc={proc.returncode} {proc.stderr.strip()[-200:]}"
    o = np.load(os.path.join(out_dir, "out.npy"))
    lse = np.load(os.path.join(out_dir, "lse.npy"))
    eo = np.load(os.path.join(case_dir, "expect_out.npy"))
    el = np.load(os.path.join(case_dir, "expect_lse.npy"))
    if o.shape != eo.shape or lse.shape != el.shape or o.dtype != np.float32 or lse.dtype != np.float32:
        return False, f"shape/dtype out {o.shape} {o.dtype} vs {eo.shape}, lse {lse.shape} vs {el.shape}"
    fin = np.isfinite(el)
    err_o = float(np.max(np.abs(o - eo))) if o.size else 0.0
    err_l = float(np.max(np.abs(lse[fin] - el[fin]))) if fin.any() else 0.0
    ok = (err_o <= 2e-4 + 2e-4 * float(np.max(np.abs(eo), initial=0)) and err_l <= 2e-4
          and bool(np.all(np.isneginf(lse[~fin]))) and not np.isnan(o).any())
    return ok, f"max|out err|={err_o:.2e} max|lse err|={err_l:.2e}"


def check_error(out_dir, proc):
    lines = proc.stderr.strip().splitlines()
    wrote = os.listdir(out_dir)
    ok = proc.returncode == 2 and len(lines) == 1 and len(lines[0]) > 10 and not wrote
    return ok, f"rc={proc.returncode} files={wrote} msg={lines[-1][:160] if lines else ''!r}"


def vulkan_device(cli):
    """Whether the CLI sees a Vulkan device (`run --help` lists host-vulkan among the targets)."""
    return "host-vulkan" in subprocess.run([cli, "run", "--help"], capture_output=True, text=True, timeout=120).stdout


def main():
    root, cli, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    index = json.load(open(os.path.join(root, "index.json")))
    passed = failed = 0
    for name, kind in index.items():
        case_dir = os.path.join(root, name)
        with tempfile.TemporaryDirectory() as out_dir:
            proc = subprocess.run([cli, "run", case_dir, "--out", out_dir] + extra,
                                  capture_output=True, text=True, timeout=600)
            ok, info = check_error(out_dir, proc) if kind == "error" else check_valid(case_dir, out_dir, proc)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {info}")
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed")
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
