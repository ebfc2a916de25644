"""`kvouter run` on seeded random cases against the independent float64 numpy implementation of
SPEC section 2 (tests/data/make_cases.py), within SPEC's tolerance (tests/cli/check_cases.py).

usage: random_cases_test.py KVOUTER SEED N [extra CLI args...]
Each case draws its own shape: page_size 1-16, blocks of 1-8 pages, 1-3 KV heads of 1-8 query
heads, D from 1 to 136 (odd and non-power-of-two sizes among them), 1-3 sequences of 0-5 queries
(one at least) or a decode step (1-6 sequences of one query each), up to five blocks a sequence,
topk 1-5, causal or not, with or without used_kv_lens, negative pages, padding and duplicate
selections, a custom softmax scale, spare table columns, and float32, float16 or bfloat16
storage. A failure prints the case's parameters and keeps its folder (KVOUTER_KEEP_CASES=DIR:
every case is written there and kept); SEED and N reproduce it.
With --target host-vulkan: a Vulkan validation-layer error on stderr fails the case; without a
Vulkan device the test is skipped (exit 77), or fails under KVOUTER_REQUIRE_VULKAN=1.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data"))
sys.path.insert(0, HERE)
import make_cases  # noqa: E402
from check_cases import check_valid, vulkan_device  # noqa: E402


def draw(rng):
    ps = int(rng.choice([1, 2, 4, 8, 16]))
    bs = ps * int(rng.choice([1, 2, 4, 8]))
    Hkv, qh = int(rng.integers(1, 4)), int(rng.choice([1, 2, 3, 4, 8]))
    D = int(rng.choice([1, 3, 8, 16, 24, 40, 64, 72, 96, 128, 136]))
    if rng.random() < 0.25:  # a decode step: one query per sequence (the decode layouts)
        B = int(rng.integers(1, 7))
        qo = [1] * B
    else:
        B = int(rng.integers(1, 4))
        qo = [int(rng.integers(0, 6)) for _ in range(B)]
        if sum(qo) == 0:
            qo[0] = 1
    kv = [int(rng.integers(1, 5 * bs + 1)) for _ in range(B)]
    used = bool(rng.random() < 0.8)
    if not used:
        kv = [max(kv)] * B  # without used_kv_lens every sequence spans its whole table
    return dict(qo=qo, kv=kv, Hq=Hkv * qh, Hkv=Hkv, D=D, bs=bs, ps=ps, topk=int(rng.integers(1, 6)),
                causal=bool(rng.random() < 0.6), neg=float(rng.choice([0, 0.2])), pad=float(rng.choice([0, 0.3])),
                dup=float(rng.choice([0, 0.4])), used=used,
                scale=float(rng.uniform(0.05, 3)) if rng.random() < 0.3 else None,
                extra_pages=int(rng.integers(0, 3)), dtype=str(rng.choice(["float32", "float32", "float16", "bfloat16"])))


def main():
    cli, seed, n, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    if "host-vulkan" in extra and not vulkan_device(cli):
        if os.environ.get("KVOUTER_REQUIRE_VULKAN") == "1":
            print("FAIL: KVOUTER_REQUIRE_VULKAN=1, but no Vulkan device (kvouter run --help lists no host-vulkan)")
            sys.exit(1)
        print("skipped: no Vulkan device (kvouter run --help lists no host-vulkan)")
        sys.exit(77)
    rng = np.random.default_rng(seed)
    keep = os.environ.get("KVOUTER_KEEP_CASES")
    root = keep or tempfile.mkdtemp(prefix="kvouter_random_cases_")
    failed = []
    for i in range(n):
        params = draw(rng)
        name = f"seed{seed}_{i}"
        make_cases.make(name, rng, root=root, **params)
        case_dir = os.path.join(root, name)
        with tempfile.TemporaryDirectory() as out_dir:
            proc = subprocess.run([cli, "run", case_dir, "--out", out_dir] + extra,
                                  capture_output=True, text=True, timeout=600)
            ok, info = check_valid(case_dir, out_dir, proc)
            if "Validation Error" in proc.stderr:
                ok, info = False, info + " Vulkan validation layer: " + proc.stderr.strip()[-300:]
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {info}" + ("" if ok else f"\n     case: {json.dumps(params)}"))
        if not ok:
            failed.append(case_dir)
        elif not keep:
            shutil.rmtree(case_dir)
    print(f"{n - len(failed)} passed, {len(failed)} failed" + (f"; kept: {' '.join(failed)}" if failed else ""))
    if not failed and not keep:
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
