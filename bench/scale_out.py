#!/usr/bin/env python3
"""Scale-out figures for bench/RESULTS.md (run by bench/scale-out.sh).

1. Shard overhead and rollouts/s per core: one suite (generated HumanEval-format tasks, python
   image, reference solutions) as one `farm run`, as N shards one after another, and as one
   shard per core at once (each with --concurrency 1), end to end per process (start-up,
   template reuse, rollouts, summary), then merged. Every figure is compared with the single
   process in the same repeat.
2. Merge: `farm bench synthetic-run --shard I/N` writes SHARDS shard folders holding ROWS rows
   in all; `farm merge` of them is timed against `cp -r` of the same folders (the bytes alone).

    bench/scale_out.py FARM WORK [--tasks 40] [--shards 3] [--repeats 3] [--merge-shards 100]
        [--merge-rows 1000000]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def timed(cmd, **kw):
    t = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return time.monotonic() - t


def summary(d):
    with open(os.path.join(d, "summary.json")) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("farm")
    p.add_argument("work")
    p.add_argument("--tasks", type=int, default=40)
    p.add_argument("--shards", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--merge-shards", type=int, default=100)
    p.add_argument("--merge-rows", type=int, default=1_000_000)
    a = p.parse_args()
    farm, work = a.farm, a.work
    cores = os.cpu_count()
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, os.path.join(here, "humaneval_gen.py"), os.path.join(work, "data")], check=True, stdout=subprocess.DEVNULL)
    suite = os.path.join(work, "suite.toml")
    with open(suite, "w") as f:
        f.write(f"""[suite]
name = "scale-out-bench"
[template]
image = "python"
[dataset]
path = "data/tasks.jsonl"
format = "humaneval"
limit = {a.tasks}
[policy]
kind = "replay"
[output]
dir = "out"
""")
    # Warm-up: the template snapshot is built (or reused) before anything is timed.
    timed([farm, "run", suite, "--out", os.path.join(work, "warm"), "--limit", "1"])

    rows = {"single": [], "sequential": [], "concurrent": [], "merge_small": []}
    for r in range(a.repeats):
        d = os.path.join(work, f"r{r}")
        rows["single"].append(timed([farm, "run", suite, "--out", os.path.join(d, "single")]))
        passed = summary(os.path.join(d, "single"))["counts"]["passed"]
        seq = 0.0
        for i in range(a.shards):
            seq += timed([farm, "run", suite, "--out", os.path.join(d, f"seq-{i}"), "--shard", f"{i}/{a.shards}"])
        rows["sequential"].append(seq)
        t = time.monotonic()
        procs = [subprocess.Popen([farm, "run", suite, "--out", os.path.join(d, f"con-{i}"), "--shard", f"{i}/{cores}", "--concurrency", "1"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(cores)]
        for pr in procs:
            if pr.wait() != 0:
                sys.exit("a concurrent shard failed")
        rows["concurrent"].append(time.monotonic() - t)
        rows["merge_small"].append(timed([farm, "merge", os.path.join(d, "merged"), *[os.path.join(d, f"seq-{i}") for i in range(a.shards)]]))
        merged = summary(os.path.join(d, "merged"))
        if merged["counts"]["passed"] != passed or merged["finished"] != a.tasks:
            sys.exit(f"the merged run differs from the single run: {merged['counts']} vs {passed} passed")
        shutil.rmtree(d)

    def line(name, values, base=None):
        out = {"what": name, "p50_s": round(pct(values, 0.5), 2), "p99_s": round(pct(values, 0.99), 2)}
        if base:
            out["ratio_p50"] = round(pct(values, 0.5) / pct(base, 0.5), 3)
        return out

    single = rows["single"]
    print(json.dumps({"rollouts": a.tasks, "cores": cores, "shards": a.shards, "repeats": a.repeats}))
    print(json.dumps(line("one process", single)))
    print(json.dumps(line(f"{a.shards} shards one after another (sum)", rows["sequential"], single)))
    print(json.dumps(line(f"{cores} shards at once, --concurrency 1 each", rows["concurrent"], single)))
    print(json.dumps(line(f"merge of the {a.shards} shards", rows["merge_small"], single)))
    per_core = [a.tasks / s / cores for s in single]
    print(json.dumps({"what": "rollouts/s per core (one process, end to end)", "p50": round(pct(per_core, 0.5), 3), "p99_low": round(min(per_core), 3)}))

    # 2. Merge of many shards.
    m = os.path.join(work, "merge")
    os.makedirs(m)
    tasks = max(1, a.merge_rows // 100)
    t = time.monotonic()
    for i in range(a.merge_shards):
        subprocess.run([farm, "bench", "synthetic-run", "--out", os.path.join(m, f"s{i:03}"), "--rows", str(a.merge_rows),
                        "--tasks", str(tasks), "--shard", f"{i}/{a.merge_shards}"], check=True, stderr=subprocess.DEVNULL)
    made = time.monotonic() - t
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(m) for f in fs)
    shards = [os.path.join(m, f"s{i:03}") for i in range(a.merge_shards)]
    copy, merge = [], []
    for r in range(a.repeats):
        copy.append(timed(["cp", "-r", m, os.path.join(work, "copy")]))
        shutil.rmtree(os.path.join(work, "copy"))
        merge.append(timed([farm, "merge", os.path.join(work, "merged"), *shards]))
        s = summary(os.path.join(work, "merged"))
        if s["finished"] != a.merge_rows:
            sys.exit(f"merged {s['finished']} rows, not {a.merge_rows}")
        shutil.rmtree(os.path.join(work, "merged"))
    print(json.dumps({"what": f"{a.merge_shards} shards, {a.merge_rows} rows, {size / 2**20:.0f} MiB", "written_in_s": round(made, 1)}))
    print(json.dumps(line("cp -r of the shard folders", copy)))
    print(json.dumps(line("farm merge", merge, copy)))
    print(json.dumps({"what": "farm merge rows/s", "p50": round(a.merge_rows / pct(merge, 0.5))}))


if __name__ == "__main__":
    main()
