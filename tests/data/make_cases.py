"""Writes the CLI case folders of tests/data with expected outputs from an independent float64
numpy implementation of SPEC §2 (not the C++ oracle), plus error cases.

usage: python tests/data/make_cases.py   (rewrites tests/data/*; deterministic)
"""
import json
import os
import shutil

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def reference(q, kp, vp, sel, bt, cu, used, bs, ps, causal, scale):
    Tq, Hq, D = q.shape
    Hkv = kp.shape[1]
    qh = Hq // Hkv
    msb = bt.shape[1] // (bs // ps)
    out = np.zeros((Tq, Hq, D), np.float64)
    lse = np.full((Tq, Hq), -np.inf, np.float64)
    for b in range(len(cu) - 1):
        L = int(used[b]) if used is not None else msb * bs
        qo = int(cu[b + 1] - cu[b])
        for i in range(qo):
            t = int(cu[b]) + i
            bound = (L - qo + i if L >= qo else i) if causal else L - 1
            for j in range(Hq):
                h = j // qh
                ps_ = sorted({p for blk in set(int(x) for x in sel[t, h] if x >= 0)
                              for p in range(blk * bs, min(L, (blk + 1) * bs))
                              if p <= bound and bt[b, p // ps] >= 0})
                if not ps_:
                    continue
                ks = np.array([kp[bt[b, p // ps], h, p % ps] for p in ps_], np.float64)
                vs = np.array([vp[bt[b, p // ps], h, p % ps] for p in ps_], np.float64)
                s = scale * ks @ q[t, j].astype(np.float64)
                m = s.max()
                w = np.exp(s - m)
                out[t, j] = w @ vs / w.sum()
                lse[t, j] = m + np.log(w.sum())
    return out.astype(np.float32), lse.astype(np.float32)


def storage(x, dtype):
    """x (float32) stored in dtype: the array written to the .npy (bfloat16 as its <u2 bits,
    rounded to nearest even) and the float32 values it holds, which the reference reads."""
    assert x.dtype == np.float32, x.dtype
    if dtype == "float32":
        return x, x
    if dtype == "float16":
        h = x.astype(np.float16)
        return h, h.astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    bits = np.where(np.isnan(x), ((u >> 16) | 0x40).astype(np.uint16), bits)  # NaN stays a (quiet) NaN
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


def make(name, rng, qo, kv, Hq, Hkv, D, bs, ps, topk, causal, neg=0.0, pad=0.0, dup=0.0,
         used=True, scale=None, extra_pages=0, kind="valid", dtype="float32", root=HERE):
    B = len(qo)
    ppb = bs // ps
    msb = -(-max(kv) // bs)
    max_pages = msb * ppb + extra_pages
    num_pages = B * max_pages + 3
    perm = rng.permutation(num_pages)[: B * max_pages].reshape(B, max_pages).astype(np.int32)
    perm[rng.random(perm.shape) < neg] = -1
    Tq = sum(qo)
    cu = np.concatenate([[0], np.cumsum(qo)]).astype(np.int64)
    q = rng.standard_normal((Tq, Hq, D)).astype(np.float32)
    kp = rng.standard_normal((num_pages, Hkv, ps, D)).astype(np.float32)
    vp = rng.standard_normal((num_pages, Hkv, ps, D)).astype(np.float32)
    sel = rng.integers(0, max(msb, 1), (Tq, Hkv, topk)).astype(np.int32)
    for idx in np.ndindex(Tq, Hkv, topk):
        if idx[2] > 0 and rng.random() < dup:
            sel[idx] = sel[idx[0], idx[1], rng.integers(0, idx[2])]
    sel[rng.random(sel.shape) < pad] = -1
    used_arr = np.array(kv, np.int32) if used else None
    (q, qv), (kp, kv_), (vp, vv) = storage(q, dtype), storage(kp, dtype), storage(vp, dtype)
    d = os.path.join(root, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cfg = {"block_size": bs, "page_size": ps, "causal": causal}
    if dtype != "float32":
        cfg["dtype"] = dtype
    if scale is not None:
        cfg["softmax_scale"] = scale
    if kind == "valid":
        o, l = reference(qv, kv_, vv, sel, perm, cu, used_arr, bs, ps, causal,
                         scale if scale is not None else 1 / np.sqrt(D))
        np.save(os.path.join(d, "expect_out.npy"), o)
        np.save(os.path.join(d, "expect_lse.npy"), l)
    elif kind == "err_page":
        perm[0, 0] = num_pages + 5
    elif kind == "err_used":
        used_arr[0] = msb * bs + 1
    elif kind == "err_qhead":
        q = q[:, :-1]
    for n, a in [("q", q), ("k_pages", kp), ("v_pages", vp), ("selected", sel), ("block_tables", perm),
                 ("cu_seqlens_q", cu)] + ([("used_kv_lens", used_arr)] if used else []):
        np.save(os.path.join(d, n + ".npy"), np.ascontiguousarray(a))
    json.dump(cfg, open(os.path.join(d, "case.json"), "w"))
    return name, "error" if kind.startswith("err") else "valid"


def main():
    rng = np.random.default_rng(1234)
    idx = dict([
        make("gqa_varlen_causal", rng, [5, 0, 9], [37, 12, 64], 6, 2, 16, 8, 4, 3, True),
        make("short_kv_causal", rng, [9], [5], 4, 1, 8, 4, 2, 4, True),
        make("pad_dup_negpages", rng, [6, 3], [40, 24], 4, 2, 12, 8, 2, 6, False, neg=0.25, pad=0.3, dup=0.4),
        make("d72_block256", rng, [7], [232], 2, 1, 72, 256, 64, 2, True),
        make("no_used_ragged_table", rng, [4, 2], [32, 32], 4, 1, 8, 8, 2, 2, True, used=False, extra_pages=3),
        make("custom_scale", rng, [6], [48], 4, 2, 16, 16, 8, 3, True, scale=2.5),
        make("err_page_out_of_range", rng, [3], [16], 2, 1, 8, 8, 4, 2, False, kind="err_page"),
        make("err_used_too_long", rng, [3], [16], 2, 1, 8, 8, 4, 2, False, kind="err_used"),
        make("err_heads", rng, [3], [16], 4, 2, 8, 8, 4, 2, False, kind="err_qhead"),
        # A decode step: every sequence one query (the CLI's default schedule for it: cpu_decode).
        make("decode_steps", rng, [1, 1, 1, 1], [40, 17, 64, 33], 8, 2, 16, 8, 4, 3, True, pad=0.2, dup=0.3),
    ])
    json.dump(idx, open(os.path.join(HERE, "index.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
