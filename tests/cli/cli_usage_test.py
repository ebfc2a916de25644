"""The CLI's usage contract: --help lists backends, bad usage and bad files exit 2 with one line on
stderr and leave no output files behind."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_cases import vulkan_device  # noqa: E402

cli = sys.argv[1]
failures = []
checks = [0]


def run(*args):
    return subprocess.run([cli, *args], capture_output=True, text=True, timeout=120)


def expect(cond, what):
    checks[0] += 1
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


r = run("--help")
expect(r.returncode == 0 and "direct" in r.stdout and "dense" in r.stdout, "--help lists backends")
r = run("run", "--help")
expect(r.returncode == 0 and "--backend" in r.stdout and "schedules:" in r.stdout, "run --help lists options")
expect("unroll grain slice" in r.stdout, "run --help lists the knobs")
r = run("run", "-h")
expect(r.returncode == 0 and "--backend" in r.stdout, "run -h is --help")
r = run("roofline", "extra")
expect(r.returncode == 2 and "roofline" in r.stderr, "roofline with an argument exits 2")
for bad in (("--paged", "0"), ("--paged", "8x"), ("--paged", "8", "9"), ("--paged", "8", "--ahead"),
            ("--paged", "--ahead", "x"), ("--paged", "8", "--ahead", "65"), ("--paged", "8", "--ahead", "1", "2")):
    r = run("roofline", *bad)
    expect(r.returncode == 2 and "roofline" in r.stderr, f"roofline {' '.join(bad)} exits 2: {r.stderr[-200:]}")
for sub in ("compare", "demo", "roofline", "make-case", "export", "sweep", "sweep-merge", "tune"):
    r = run(sub, "--help")
    expect(r.returncode == 0 and r.stdout.startswith("usage: kvouter " + sub), sub + " --help exits 0 with its usage")
r = run("run")
expect(r.returncode == 2 and "CASE_DIR" in r.stderr, "run without CASE_DIR exits 2")
r = run("frobnicate")
expect(r.returncode == 2 and "unknown command" in r.stderr, "unknown command exits 2")

with tempfile.TemporaryDirectory() as tmp:
    case = os.path.join(tmp, "case")
    r = run("make-case", "tiny", case)
    expect(r.returncode == 0, "make-case tiny")
    out = os.path.join(tmp, "out")
    r = run("run", case, "--out", out, "--backend", "nope")
    expect(r.returncode == 2 and "backend" in r.stderr and not os.path.exists(os.path.join(out, "out.npy")),
           "unknown backend exits 2 and writes nothing")
    r = run("run", case, "--out", out, "--param", "novalue")
    expect(r.returncode == 2 and "KEY=VALUE" in r.stderr, "malformed --param exits 2")
    for bad in ("-1", "abc", "5x", "1e9"):
        r = run("run", case, "--out", out, "--warmup-ms", bad)
        expect(r.returncode == 2 and "--warmup-ms" in r.stderr and not os.path.exists(os.path.join(out, "out.npy")),
               "--warmup-ms " + bad + " exits 2 and writes nothing")
    r = run("run", case, "--out", out, "--backend", "jit", "--schedule", "cpu_tiled", "--warmup-ms", "300")
    expect(r.returncode == 0 and "time_ms=" in r.stdout, "--warmup-ms runs")
    r = run("run", case, "--out", out)
    expect(r.returncode == 0 and "backend=" in r.stdout and "gflops=" in r.stdout, "default run prints a summary")
    # A shape in 16-bit storage: the files in the dtype (bfloat16 as '<u2' bits with case.json's key),
    # run by the default backend and by direct; an unknown dtype is a usage error.
    for dtype, descr in (("float16", "<f2"), ("bfloat16", "<u2")):
        case16 = os.path.join(tmp, "case_" + dtype)
        r = run("make-case", "tiny", case16, "--dtype", dtype)
        expect(r.returncode == 0, "make-case tiny --dtype " + dtype)
        with open(os.path.join(case16, "k_pages.npy"), "rb") as f:
            expect(("'descr': '%s'" % descr).encode() in f.read(128), dtype + " K stored as " + descr)
        with open(os.path.join(case16, "case.json")) as f:
            expect(json.load(f).get("dtype") == dtype, "case.json names " + dtype)
        for backend in ("jit", "aot", "direct", "dense"):
            r = run("run", case16, "--out", os.path.join(tmp, "out_" + dtype), "--backend", backend)
            expect(r.returncode == 0 and "time_ms=" in r.stdout, dtype + " case runs through " + backend + ": " + r.stderr)
    r = run("make-case", "tiny", os.path.join(tmp, "bad"), "--dtype", "int8")
    expect(r.returncode == 2 and "--dtype" in r.stderr, "make-case --dtype int8 exits 2")
    # An autoscheduled GPU twin with a known wrong result on this case: an error, never the result.
    if vulkan_device(cli):
        out_twin = os.path.join(tmp, "out_twin")
        # Halide's JIT Vulkan runtime leaves its device allocations to process exit; the Vulkan
        # paths are not run under the sanitizers (ctest label gpu), so leak detection is off here.
        r = subprocess.run([cli, "run", case, "--out", out_twin, "--backend", "jit", "--schedule",
                            "auto_mullapudi2016_gpu", "--target", "host-vulkan"], capture_output=True, text=True,
                           timeout=300, env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
        expect(r.returncode == 2 and "off the float64 oracle" in r.stderr
               and not os.path.exists(os.path.join(out_twin, "out.npy")),
               f"a GPU twin's wrong result is an error, exit 2, nothing written: {r.stderr.strip()[-300:]}")
    else:
        expect(os.environ.get("KVOUTER_REQUIRE_VULKAN") != "1",
               "KVOUTER_REQUIRE_VULKAN=1, but no Vulkan device for the GPU twin check")
        print("skipped: the GPU twin check needs a Vulkan device (none found)")
    # compare: the AOT variant against the JIT of its configuration (the speed guard itself is the
    # bench_aot_vs_jit ctests); here its contract. A generous ratio keeps this a functional check.
    # --json: the measurement core's record (experiments/measure.h), every repetition in it.
    rec_path = os.path.join(out, "run.json")
    r = run("run", case, "--out", out, "--backend", "jit", "--schedule", "cpu_tiled", "--repeat", "3", "--json", rec_path)
    rec = json.load(open(rec_path)) if r.returncode == 0 and os.path.exists(rec_path) else {}
    t = rec.get("time_ms", {})
    expect(t.get("n") == 3 and len(t.get("all", [])) == 3 and t.get("min", 0) > 0
           and f"time_ms={t.get('median', -1):.3f}" in r.stdout and rec.get("schedule") == "cpu_tiled"
           and rec.get("git_rev") and rec.get("forward_ms", 0) > 0,
           f"run --json writes the measurement record: {r.stdout.strip()[-200:]} {r.stderr.strip()[-200:]}")
    r = run("compare", case, "--repeat", "2", "--max-ratio", "100")
    expect(r.returncode == 0 and "compare: variant=kvouter_cpu_tiled" in r.stdout and " ok" in r.stdout,
           f"compare times AOT against JIT: {r.stdout[-300:]} {r.stderr[-300:]}")
    for bad_args, needle in ((("compare",), "CASE_DIR or --shape"), (("compare", case, "--shape", "tiny"), "CASE_DIR or --shape"),
                             (("compare", case, "--max-ratio", "0.5"), "--max-ratio"),
                             (("compare", case, "--schedule", "nope"), "nope")):
        r = run(*bad_args)
        expect(r.returncode == 2 and needle in r.stderr, f"{' '.join(bad_args[:1] + bad_args[2:])} exits 2: {r.stderr.strip()[:200]}")
    expect(os.path.exists(os.path.join(out, "out.npy")), "default run writes out.npy")

    # No Vulkan device (the loader finds no driver): one clear line, exit 2, nothing written, for
    # both the JIT and the AOT backend (Halide's own runtime would abort the process).
    novk = dict(os.environ, VK_ICD_FILENAMES=os.path.join(tmp, "no_such_icd.json"),
                VK_DRIVER_FILES=os.path.join(tmp, "no_such_icd.json"))
    for backend in ("jit", "aot"):
        out_vk = os.path.join(tmp, "out_novk_" + backend)
        r = subprocess.run([cli, "run", case, "--out", out_vk, "--backend", backend, "--schedule", "vulkan_tiled",
                            "--target", "host-vulkan"], capture_output=True, text=True, timeout=120, env=novk)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        expect(r.returncode == 2 and len(lines) == 1 and "no usable Vulkan device" in lines[0]
               and not os.path.exists(os.path.join(out_vk, "out.npy")),
               f"{backend}: an absent Vulkan device is one clear error, exit 2: {r.stderr.strip()[:200]}")
    tune_db, tune_log = os.path.join(tmp, "novk_db.json"), os.path.join(tmp, "novk_log.jsonl")
    r = subprocess.run([cli, "tune", "--shape", "tiny", "--target", "host-vulkan", "--db", tune_db, "--log", tune_log],
                       capture_output=True, text=True, timeout=120, env=novk)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    expect(r.returncode == 2 and len(lines) == 1 and "no usable Vulkan device" in lines[0]
           and not os.path.exists(tune_db) and not os.path.exists(tune_log),
           f"tune on an absent Vulkan device is one clear error, exit 2: {r.stderr.strip()[:200]}")

    # Wrong dtype, truncated file, missing file, malformed case.json: exit 2, one line, nothing written.
    def broken(mutate, what, needle):
        bad = os.path.join(tmp, "bad_" + what.replace(" ", "_"))
        subprocess.run(["cp", "-r", case, bad], check=True)
        mutate(bad)
        o = os.path.join(tmp, "o_" + what.replace(" ", "_"))
        r = run("run", bad, "--out", o)
        lines = r.stderr.strip().splitlines()
        expect(r.returncode == 2 and len(lines) == 1 and needle in lines[0]
               and not (os.path.exists(o) and os.listdir(o)), f"{what}: exit 2, one line naming {needle!r}: {lines}")

    broken(lambda d: np.save(os.path.join(d, "q.npy"), np.load(os.path.join(d, "q.npy")).astype(np.float64)),
           "wrong dtype", "q dtype")
    def truncate(d):
        p = os.path.join(d, "k_pages.npy")
        data = open(p, "rb").read()
        open(p, "wb").write(data[: len(data) // 2])
    broken(truncate, "truncated file", "k_pages")
    broken(lambda d: os.remove(os.path.join(d, "selected.npy")), "missing file", "selected")
    broken(lambda d: open(os.path.join(d, "case.json"), "w").write("{not json"), "corrupt json", "case.json")
    broken(lambda d: json.dump({"block_size": "64", "page_size": 16}, open(os.path.join(d, "case.json"), "w")),
           "json wrong type", "block_size")
    broken(lambda d: open(os.path.join(d, "case.json"), "w").write('{"block_size": 18446744073709551615, "page_size": 16}'),
           "json integer beyond int64", "18446744073709551615")
    broken(lambda d: open(os.path.join(d, "v_pages.npy"), "wb").write(b"garbage"), "garbage npy", "v_pages")

with tempfile.TemporaryDirectory() as tmp:
    r = run("export", "--out", tmp, "--schedule", "cpu_simple", "--param", "chunk=32")
    names = sorted(os.listdir(tmp))
    expect(r.returncode == 0 and all(any(n.endswith(sfx) for n in names) for sfx in
           ["_fwd.a", "_fwd.h", "_fwd.stmt", "_comb.a", "_comb.h", "_comb.stmt"]), f"export writes library, header, stmt: {names}")
    expect("kvouter_cpu_simple_generic_chunk_32_fwd.a" in names, f"export names its output as the build does: {names}")
    # A schedule that needs the block as one chunk gets it by default, as run and the JIT give it.
    one_case, one_out = os.path.join(tmp, "one_chunk_case"), os.path.join(tmp, "one_chunk")
    run("make-case", "tiny", one_case)
    # (LeakSanitizer off for it: libHalide's Vulkan code generator leaks 128 bytes in the
    # sanitized generator, as in the GPU twin check above.)
    r = subprocess.run([cli, "export", "--out", one_out, "--schedule", "vulkan_tiled", "--target", "host-vulkan",
                        "--from-case", one_case], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
    expect(r.returncode == 0 and any("vulkan_tiled" in n and "chunk_0" in n and n.endswith("_fwd.a")
                                     for n in (os.listdir(one_out) if os.path.isdir(one_out) else [])),
           f"export of a one-chunk schedule applies the one-chunk default: {r.stderr.strip()[-300:]}")
    r = run("export", "--out", tmp, "--schedule", "nope")
    expect(r.returncode == 2 and "schedule" in r.stderr, "export of an unknown schedule exits 2")
    # A 16-bit configuration: the forward takes bfloat16 bits (its header says uint16 inputs).
    r = run("export", "--out", tmp, "--schedule", "cpu_tiled", "--dtype", "bfloat16")
    hdr = os.path.join(tmp, "kvouter_cpu_tiled_generic_storage_bfloat16_fwd.h")
    expect(r.returncode == 0 and os.path.exists(hdr), f"export --dtype bfloat16: {sorted(os.listdir(tmp))}")
    r = run("export", "--out", tmp, "--dtype", "int4")
    expect(r.returncode == 2 and "--dtype" in r.stderr, "export --dtype int4 exits 2")

with tempfile.TemporaryDirectory() as tmp:
    db, log = os.path.join(tmp, "db.json"), os.path.join(tmp, "log.jsonl")
    r = run("tune", "--shape", "tiny", "--max-candidates", "2", "--repeats", "2", "--db", db, "--log", log)
    expect(r.returncode == 0 and "winner" in r.stdout and "ETA" in r.stdout, f"tune writes a winner: {r.stdout[-300:]}")
    winner = json.load(open(db))["entries"] if os.path.exists(db) else {}
    sched = next(iter(winner.values()))["schedule"] if winner else "?"
    case = os.path.join(tmp, "tiny")
    run("make-case", "tiny", case)
    env = dict(os.environ, KVOUTER_TUNING_DB=db)
    r = subprocess.run([cli, "run", case, "--out", os.path.join(tmp, "o")], capture_output=True, text=True, env=env)
    expect(r.returncode == 0 and f"schedule={sched} " in r.stdout, f"run's default reads the tuning database ({sched}): {r.stdout.strip()[:200]}")
    # --backend jit without --schedule reads it too, schedule and knobs: an entry edited to a point
    # no default gives (cpu_rowstream, rows 2), so that only the database can name it.
    if winner:
        edited = json.load(open(db))
        for entry in edited["entries"].values():
            entry["schedule"], entry["knobs"] = "cpu_rowstream", {"rows": "2", "unroll": "2"}
        db2 = os.path.join(tmp, "db_edited.json")
        json.dump(edited, open(db2, "w"))
        r = subprocess.run([cli, "run", case, "--out", os.path.join(tmp, "o"), "--backend", "jit"], capture_output=True,
                           text=True, env=dict(os.environ, KVOUTER_TUNING_DB=db2))
        expect(r.returncode == 0 and "backend=jit schedule=cpu_rowstream " in r.stdout and "rows=2," in r.stdout,
               f"run --backend jit without --schedule takes the tuning database's schedule and knobs: {r.stdout.strip()[:200]} {r.stderr.strip()[-200:]}")
    exp = os.path.join(tmp, "exp")
    r = subprocess.run([cli, "export", "--out", exp, "--tuned", "--from-case", case], capture_output=True,
                       text=True, env=env)
    expect(r.returncode == 0 and any(n.endswith("_fwd.a") for n in os.listdir(exp)),
           f"export --tuned builds the database's winner: {r.stdout.strip()[-200:]} {r.stderr.strip()[-200:]}")

# On a machine the tuning database does not know, the CPU default follows the case's shape class:
# cpu_decode for a decode step (every sequence one query), cpu_tiled otherwise.
data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, KVOUTER_TUNING_DB=os.path.join(tmp, "no_such_db.json"))
    for case, sched in (("decode_steps", "cpu_decode"), ("gqa_varlen_causal", "cpu_tiled")):
        r = subprocess.run([cli, "run", os.path.join(data, case), "--out", os.path.join(tmp, case), "--target", "host"],
                           capture_output=True, text=True, env=env, timeout=300)
        expect(r.returncode == 0 and f"schedule={sched} " in r.stdout,
               f"run's default on an untuned machine, {case}: {sched} ({r.stdout.strip()[:200]} {r.stderr.strip()[-200:]})")
        # A Halide backend named without --schedule takes the same shape-class default.
        for backend in ("jit", "aot"):
            r = subprocess.run([cli, "run", os.path.join(data, case), "--out", os.path.join(tmp, case), "--target", "host",
                                "--backend", backend], capture_output=True, text=True, env=env, timeout=300)
            expect(r.returncode == 0 and f"backend={backend} schedule={sched} " in r.stdout,
                   f"run --backend {backend} without --schedule, {case}: {sched} ({r.stdout.strip()[:200]} {r.stderr.strip()[-200:]})")
        # export without --schedule builds the same schedule for the case's shape.
        out = os.path.join(tmp, case + "_export")
        r = subprocess.run([cli, "export", "--out", out, "--from-case", os.path.join(data, case)],
                           capture_output=True, text=True, timeout=300)
        names = os.listdir(out) if os.path.isdir(out) else []
        expect(r.returncode == 0 and any(n.startswith(f"kvouter_{sched}_") and n.endswith("_fwd.a") for n in names),
               f"export's default for {case}: {sched} ({names} {r.stderr.strip()[-200:]})")

print(f"{checks[0] - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
