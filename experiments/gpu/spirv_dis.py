#!/usr/bin/env python3
"""Disassembles the SPIR-V that Halide generated for a Vulkan AOT pipeline, and counts what matters
for speed on a GPU: the instructions by opcode, the loops (all `DontUnroll` in Halide 21's SPIR-V,
README limit 9) and the global loads, in and out of loops.

    python3 experiments/gpu/spirv_dis.py build/generators/kvouter_vulkan_onepass_..._fwd.stmt [--out K.spvasm]
                                         [--spv-dir DIR]

The .stmt file (written beside every generated kernel) holds the module as Halide's runtime loads
it: a header (entry points, descriptor-set layout), then one SPIR-V module per kernel, then the
host code. Needs `spirv-dis`
(Debian's spirv-tools, installed by `make setup`). Exits 2 with a clear line on any bad input.
"""
from __future__ import annotations

import argparse
import collections
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

SPIRV_MAGIC = struct.pack("<I", 0x07230203)
BLOB = b"buffer vulkan_gpu_source_kernels = {\n"


def _module_end(stmt: bytes, magic: int) -> int:
    """Where the SPIR-V module starting at `magic` ends: instruction by instruction (each one's
    first word holds its word count) to its last OpFunctionEnd; -1 if it has none."""
    pos, end = magic + 5 * 4, -1  # the module header is five words
    while pos + 4 <= len(stmt):
        word = struct.unpack("<I", stmt[pos:pos + 4])[0]
        count, opcode = word >> 16, word & 0xFFFF
        if count == 0 or pos + 4 * count > len(stmt) or stmt[pos:pos + 4] == SPIRV_MAGIC:
            break
        pos += 4 * count
        if opcode == 56:  # OpFunctionEnd
            end = pos
    return end


def extract_spirv(stmt: bytes) -> list[bytes]:
    """The SPIR-V modules (one per kernel) of a Halide Vulkan .stmt, in order."""
    start = stmt.find(BLOB)
    if start < 0:
        raise ValueError("no Vulkan kernels in it (was it generated for a host-vulkan target?)")
    modules, pos = [], start
    while True:
        magic = stmt.find(SPIRV_MAGIC, pos)
        end = _module_end(stmt, magic) if magic >= 0 else -1
        if end < 0:
            break
        modules.append(stmt[magic:end])
        pos = end
    if not modules:
        raise ValueError("its Vulkan blob holds no complete SPIR-V module")
    return modules


def summarize(asm: str) -> str:
    ops = collections.Counter(re.findall(r"\bOp[A-Za-z0-9]+", asm))
    lines = asm.splitlines()
    # Global (storage buffer) loads: loads through an access chain into a Uniform/StorageBuffer
    # pointer. A loop is the span from its OpLoopMerge to its merge label.
    # Reads of the kernel's scalar arguments (a uniform block, `*_args_var`) are not data loads.
    chains = {m.group(1) for m in re.finditer(
        r"(%\w+) = OpInBoundsAccessChain %_ptr_(?:Uniform|StorageBuffer)_\w+ (%\w+)", asm)
        if not m.group(2).endswith("_args_var")}
    depth, in_loop, out_loop, merges = 0, 0, 0, []
    for line in lines:
        m = re.search(r"OpLoopMerge (%\w+)", line)
        if m:
            merges.append(m.group(1))
        label = re.match(r"\s*(%\w+) = OpLabel", line)
        if label and merges and label.group(1) == merges[-1]:
            merges.pop()
        load = re.search(r"= OpLoad %\w+ (%\w+)", line)
        if load and load.group(1) in chains:
            if merges:
                in_loop += 1
            else:
                out_loop += 1
    fma = sum(1 for _ in re.finditer(r"OpExtInst %float %\w+ Fma\b", asm))
    out = [f"instructions: {sum(ops.values())}; loops: {ops['OpLoopMerge']} "
           f"({asm.count('DontUnroll')} marked DontUnroll); barriers: {ops['OpControlBarrier']}",
           f"global loads: {in_loop} inside loops, {out_loop} outside (unrolled or straight-line)",
           f"float: {ops['OpFMul']} mul, {ops['OpFAdd']} add, {fma} fma; integer: {ops['OpIMul']} mul, "
           f"{ops['OpIAdd']} add, {ops['OpSDiv'] + ops['OpUDiv']} div, {ops['OpSMod'] + ops['OpUMod']} mod",
           "most frequent: " + ", ".join(f"{k} {v}" for k, v in ops.most_common(8))]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stmt", type=Path, help="a generated kernel's .stmt file (host-vulkan)")
    ap.add_argument("--out", type=Path, help="write the disassembly here (default: not kept)")
    ap.add_argument("--spv-dir", type=Path,
                    help="also write each module as DIR/<stmt name>.k<i>.spv (for vk_pipeline_stats)")
    args = ap.parse_args(argv)
    try:
        modules = extract_spirv(args.stmt.read_bytes())
    except (OSError, ValueError) as e:
        print(f"spirv_dis: {args.stmt}: {e}", file=sys.stderr)
        return 2
    if args.spv_dir:
        args.spv_dir.mkdir(parents=True, exist_ok=True)
        for i, module in enumerate(modules):
            (args.spv_dir / f"{args.stmt.stem}.k{i}.spv").write_bytes(module)
    dis = shutil.which("spirv-dis")
    if dis is None:
        print("spirv_dis: spirv-dis not found (apt install spirv-tools)", file=sys.stderr)
        return 2
    asm = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, module in enumerate(modules):
            spv = Path(tmp) / f"k{i}.spv"
            spv.write_bytes(module)
            r = subprocess.run([dis, str(spv)], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"spirv_dis: {args.stmt}: module {i}: spirv-dis failed: {r.stderr.strip()}", file=sys.stderr)
                return 2
            asm.append(r.stdout)
    text = "\n".join(asm)
    if args.out:
        args.out.write_text(text)
    names = re.findall(r'OpEntryPoint GLCompute %\w+ "(\w+)"', text)
    print(f"{args.stmt.name}: {len(names)} kernel(s) in {len(modules)} module(s), "
          f"{sum(map(len, modules))} bytes of SPIR-V: {', '.join(names)}")
    print(summarize(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
