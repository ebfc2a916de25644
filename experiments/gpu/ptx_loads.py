#!/usr/bin/env python3
"""Counts the global-memory loads of the PTX that Halide generated for a CUDA AOT pipeline, by
width: how many bytes each load instruction moves, and how many of them are vectors (the CUDA
counterpart of spirv_dis.py's load count).

    python3 experiments/gpu/ptx_loads.py build/generators/kvouter_vulkan_slices_..._host_cuda_..._fwd.stmt
                                         [--out K.ptx]

The .stmt file (written beside every generated kernel) holds the PTX as Halide's runtime loads it,
in a `cuda_gpu_source_kernels` buffer. A load's bytes are its vector length times its element
width (`ld.global.nc.v4.b32`: 16 bytes). Prints one line per kernel entry:

    _kernel_partials_s0_tile_block_id_y: 25 global loads: 12 x 16 B (4-wide), 13 x 4 B

then a summary over the kernels, `bytes per load: {4: 13, 16: 12}`. Exits 2 with a clear line on
any bad input.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

BLOB = "buffer cuda_gpu_source_kernels = {\n"
LOAD = re.compile(r"^\s*(?:@%p\d+\s+)?ld\.global(?:\.nc)?(?:\.v(\d))?\.[a-z](\d+)\s")
ENTRY = re.compile(r"^\.(?:visible\s+)?\.entry\s+(\w+)\(")
# The first line of the host code after the buffer (its closing brace is the line before).
HOST_CODE = re.compile(r"^(?:external_plus_metadata |external |internal |func |module )", re.M)


def extract_ptx(stmt: str) -> str:
    """The PTX module of a Halide CUDA .stmt: from `.version` to the host code after the buffer
    (every kernel of the module; each function's body also ends with a `}` line)."""
    start = stmt.find(BLOB)
    if start < 0:
        raise ValueError("no CUDA kernels in it (was it generated for a host-cuda target?)")
    begin = stmt.find(".version", start)
    host = HOST_CODE.search(stmt, begin) if begin >= 0 else None
    if begin < 0 or host is None:
        raise ValueError("its CUDA blob holds no PTX module")
    return stmt[begin:host.start()]


def loads_by_kernel(ptx: str) -> dict[str, collections.Counter]:
    """For each kernel entry, its global loads as a Counter of (lanes, bytes per load)."""
    kernels: dict[str, collections.Counter] = {}
    current = None
    for line in ptx.splitlines():
        m = ENTRY.match(line)
        if m:
            current = kernels.setdefault(m.group(1), collections.Counter())
            continue
        m = LOAD.match(line)
        if m and current is not None:
            lanes = int(m.group(1) or 1)
            current[(lanes, lanes * int(m.group(2)) // 8)] += 1
    return kernels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stmt", type=Path)
    ap.add_argument("--out", type=Path, help="write the PTX module here")
    a = ap.parse_args()
    try:
        ptx = extract_ptx(a.stmt.read_text(errors="replace"))
    except (OSError, ValueError) as e:
        print(f"ptx_loads: {a.stmt}: {e}", file=sys.stderr)
        return 2
    if a.out:
        a.out.write_text(ptx)
    kernels = loads_by_kernel(ptx)
    if not kernels:
        print(f"ptx_loads: {a.stmt}: its PTX has no kernel entry", file=sys.stderr)
        return 2
    total: collections.Counter = collections.Counter()
    for name, loads in kernels.items():
        parts = ", ".join(f"{n} x {b} B" + (f" ({lanes}-wide)" if lanes > 1 else "")
                          for (lanes, b), n in sorted(loads.items(), key=lambda kv: (-kv[0][1], kv[0][0])))
        print(f"{name}: {sum(loads.values())} global loads: {parts or 'none'}")
        for (_, b), n in loads.items():
            total[b] += n
    print("bytes per load: {" + ", ".join(f"{b}: {n}" for b, n in sorted(total.items())) + "}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
