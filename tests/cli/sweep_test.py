"""Sweeps end to end: a grid run in two shards, merged; resuming skips measured points; a --point
repro runs one point; a failing run (a CPU schedule on a Vulkan target) is recorded with ok = false and its error."""
import json
import os
import subprocess
import sys
import tempfile

cli = sys.argv[1]
failures, checks = [], [0]


def expect(cond, what):
    checks[0] += 1
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def records(path):
    return [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []


with tempfile.TemporaryDirectory() as tmp:
    cfg = os.path.join(tmp, "t.yaml")
    open(cfg, "w").write("""name: t
repeats: 2
shapes:
  - base: tiny
    grid: {topk: [2, 4], kv: [128]}
runs:
  - {backend: direct}
  - {backend: jit, schedule: cpu_simple}
  - {backend: jit, schedule: cpu_tiled, target: host-vulkan}
""")
    outs = []
    for k in (1, 2):
        r = subprocess.run([cli, "sweep", cfg, "--shard", f"{k}/2", "--results", tmp], capture_output=True, text=True)
        expect(r.returncode == 0 and "ETA" in r.stdout, f"shard {k}/2 runs: {r.stderr[-200:]}")
        outs.append(os.path.join(tmp, f"sweep_t.shard{k}-of-2.jsonl"))
    expect(len(records(outs[0])) == 3 and len(records(outs[1])) == 3, "each shard holds half of the 6 points")
    merged = os.path.join(tmp, "merged.jsonl")
    r = subprocess.run([cli, "sweep-merge", merged] + outs, capture_output=True, text=True)
    recs = records(merged)
    expect(r.returncode == 0 and len(recs) == 6 and len({x["point"] for x in recs}) == 6, "merge joins 6 distinct points")
    good = [x for x in recs if x["ok"]]
    bad = [x for x in recs if not x["ok"]]
    expect(len(good) == 4 and all(x["time_ms"]["median"] > 0 and x["max_out_err"] < 1e-3 for x in good),
           "CPU points are checked and timed")
    expect(len(bad) == 2 and all("Vulkan target" in x["error"] for x in bad), "failing points are recorded with their error")
    keys = {"kind", "sweep", "point", "shape", "backend", "schedule", "knobs", "target", "git_rev", "halide_version",
            "machine", "repro", "timestamp", "peak_gflops"}
    expect(all(keys <= set(x) for x in recs), "records carry the repro fields")
    r = subprocess.run([cli, "sweep", cfg, "--shard", "1/2", "--results", tmp], capture_output=True, text=True)
    expect("0 to run" in r.stdout and len(records(outs[0])) == 3, "a rerun resumes: nothing measured twice")
    one = os.path.join(tmp, "one.jsonl")
    point = good[0]["point"]
    r = subprocess.run([cli, "sweep", cfg, "--point", point, "--out", one], capture_output=True, text=True)
    expect(r.returncode == 0 and [x["point"] for x in records(one)] == [point], "--point reruns one record's point")
    r = subprocess.run([cli, "sweep", os.path.join(tmp, "missing.yaml")], capture_output=True, text=True)
    expect(r.returncode == 2 and "sweep config" in r.stderr, "a missing config exits 2 naming it")

print(f"{checks[0] - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
