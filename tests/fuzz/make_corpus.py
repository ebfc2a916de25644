#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets into tests/fuzz/corpus/<target>/.

    .venv/bin/python tests/fuzz/make_corpus.py

Seeds are small on purpose. The files written here are named seed_*; inputs kept because they once
crashed a target (regressions) are named crash_* and are never touched by this script.
"""
import io
import json
import pathlib
import random
import struct

import numpy as np

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"


def npy_bytes(array, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, array, allow_pickle=False)
    else:
        np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


def halide_style(array):
    """The header as Halide's save_npy writes it: the dict ends with '}\\n' before the padding."""
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s)}\n" % (
        array.dtype.str, "".join("%d," % e for e in array.shape) if array.ndim != 1 else "%d," % array.shape[0])
    total = 10 + len(header)
    header += " " * ((64 - total % 64) % 64)
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + array.tobytes()


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / ("seed_" + name)).write_bytes(data if isinstance(data, bytes) else data.encode())


def npy_seeds():
    rng = np.random.default_rng(6)
    for dtype in ("<f4", "<i4", "<i8"):
        tag = dtype[1:]
        write("fuzz_npy", f"{tag}_3d.npy", npy_bytes(rng.standard_normal((2, 3, 4)).astype(dtype)))
        write("fuzz_npy", f"{tag}_1d.npy", npy_bytes(np.arange(5, dtype=dtype)))
        write("fuzz_npy", f"{tag}_scalar.npy", npy_bytes(np.array(7, dtype=dtype)))
        write("fuzz_npy", f"{tag}_empty.npy", npy_bytes(np.zeros((3, 0, 2), dtype=dtype)))
        write("fuzz_npy", f"{tag}_halide.npy", halide_style(np.arange(6, dtype=dtype).reshape(2, 3)))
    write("fuzz_npy", "f4_v2.npy", npy_bytes(np.ones((2, 2), dtype="<f4"), version=(2, 0)))
    write("fuzz_npy", "f8.npy", npy_bytes(np.ones(3, dtype="<f8")))
    # 16-bit storage: float16 (subnormal, max, inf, nan among them) and bfloat16 bits.
    write("fuzz_npy", "f2.npy", npy_bytes(np.array([1, -2, 6e-8, 65504, np.inf, np.nan], dtype="<f2")))
    write("fuzz_npy", "u2_bf16.npy", npy_bytes(np.array([0x3FC0, 0xC050, 0x0001, 0x7F80], dtype="<u2")))
    write("fuzz_npy", "u1.npy", npy_bytes(np.ones(3, dtype="u1")))
    write("fuzz_npy", "bigendian.npy", npy_bytes(np.ones(3, dtype=">i4")))
    write("fuzz_npy", "fortran.npy", npy_bytes(np.asfortranarray(np.ones((2, 3), dtype="<f4"))))
    write("fuzz_npy", "truncated.npy", npy_bytes(np.arange(16, dtype="<i8"))[:-9])
    write("fuzz_npy", "header_only.npy", npy_bytes(np.arange(4, dtype="<i4"))[:64])


def case_json_seeds():
    valid = {"block_size": 4, "page_size": 2, "causal": True}
    write("fuzz_case_json", "valid.json", json.dumps(valid))
    write("fuzz_case_json", "valid_scale.json", json.dumps({**valid, "softmax_scale": 0.35, "causal": False}))
    write("fuzz_case_json", "null_scale.json", json.dumps({**valid, "softmax_scale": None}))
    write("fuzz_case_json", "missing_page.json", json.dumps({"block_size": 4}))
    write("fuzz_case_json", "string_block.json", json.dumps({**valid, "block_size": "4"}))
    write("fuzz_case_json", "float_block.json", json.dumps({**valid, "block_size": 4.0}))
    write("fuzz_case_json", "big_block.json", '{"block_size": 18446744073709551615, "page_size": 2}')
    write("fuzz_case_json", "huge_scale.json", '{"block_size": 4, "page_size": 2, "softmax_scale": 1e300}')
    write("fuzz_case_json", "not_object.json", "[4, 2, true]")
    write("fuzz_case_json", "bad_causal.json", json.dumps({**valid, "causal": 1}))
    write("fuzz_case_json", "truncated.json", json.dumps(valid)[:-3])
    write("fuzz_case_json", "block_not_multiple.json", json.dumps({**valid, "block_size": 3}))
    # case.json, NUL, selector, the bytes of a replacement .npy (see fuzz_case_json.cpp).
    base = json.dumps(valid).encode() + b"\0"
    write("fuzz_case_json", "no_used_kv_lens", base + bytes([7]))
    write("fuzz_case_json", "used_kv_lens_short", base + bytes([6]) + npy_bytes(np.array([12], dtype="<i4")))
    write("fuzz_case_json", "used_kv_lens_i64", base + bytes([6]) + npy_bytes(np.array([12, 7], dtype="<i8")))
    write("fuzz_case_json", "selected_out_of_range",
          base + bytes([3]) + npy_bytes(np.full((5, 2, 2), 3, dtype="<i4")))
    write("fuzz_case_json", "cu_bad", base + bytes([5]) + npy_bytes(np.array([0, 4, 5], dtype="<i8")))
    write("fuzz_case_json", "table_page_oob", base + bytes([4]) + npy_bytes(np.full((2, 6), 8, dtype="<i4")))
    write("fuzz_case_json", "q_wrong_heads", base + bytes([0]) + npy_bytes(np.zeros((5, 3, 4), dtype="<f4")))
    # Storage dtypes (SPEC section 1): a key contradicting the files, an unknown key, and q alone
    # in float16 or as bfloat16 bits (mixed with the float32 K/V).
    write("fuzz_case_json", "dtype_contradicts.json", json.dumps({**valid, "dtype": "float16"}))
    write("fuzz_case_json", "dtype_unknown.json", json.dumps({**valid, "dtype": "int8"}))
    bf = json.dumps({**valid, "dtype": "bfloat16"}).encode() + b"\0"
    write("fuzz_case_json", "q_bf16_mixed", bf + bytes([0]) + npy_bytes(np.zeros((5, 2, 4), dtype="<u2")))
    write("fuzz_case_json", "q_f16_mixed", base + bytes([0]) + npy_bytes(np.zeros((5, 2, 4), dtype="<f2")))
    # The float16 and bfloat16 baselines (selector / 8 = 1, 2): whole 16-bit cases, valid, and with
    # float32 K against 16-bit q and V.
    f16 = json.dumps({**valid, "dtype": "float16"}).encode() + b"\0"
    write("fuzz_case_json", "f16_case", f16 + bytes([8 + 7]))
    write("fuzz_case_json", "bf16_case", bf + bytes([16 + 7]))
    write("fuzz_case_json", "bf16_k_f32", bf + bytes([16 + 1]) + npy_bytes(np.zeros((8, 2, 2, 4), dtype="<f4")))
    write("fuzz_case_json", "f16_v_bf16_bits", f16 + bytes([8 + 2]) + npy_bytes(np.zeros((8, 2, 2, 4), dtype="<u2")))


def random_seeds(target, count, rng):
    for i in range(count):
        size = rng.choice([16, 64, 256, 1024, 4096])
        write(target, f"random_{i:02d}", bytes(rng.getrandbits(8) for _ in range(size)))


def main():
    for d in CORPUS.glob("*/seed_*"):
        d.unlink()
    npy_seeds()
    case_json_seeds()
    rng = random.Random(6)
    random_seeds("fuzz_validate_plan", 16, rng)
    random_seeds("fuzz_run", 12, rng)


if __name__ == "__main__":
    main()
