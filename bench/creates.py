#!/usr/bin/env python3
"""Sandbox creates at the rates RL loops ask for, through farm's Python SDK (run by
bench/creates.sh): create to first command (`exec("true")`), then the sandbox is killed.

    creates.py URL sequential N LABEL
    creates.py URL rate PER_SEC SECONDS LABEL
    creates.py URL burst N LABEL [WAIT_READY [ROUNDS]]   WAIT_READY: ready forks to wait for
                                                         before each round (default 0, 1 round)
    creates.py - report RESULTS.jsonl

Each mode prints one JSON line: p50/p95/p99 of create-to-first-exec (ms), the creates that
failed (and why, by status), the wall time and creates/s. `report` prints the table of a run.
"""

import asyncio
import json
import sys
import time

from farm_sdk.aio import AsyncFarm
from farm_sdk import Farm


def percentile(values, p):
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))], 1)


def environment(url):
    with Farm(url=url) as farm:
        return farm.environments.create(image="minimal").id


def wait_ready(url, env_id, want, limit=600):
    """Waits until the environment's pool holds `want` ready forks (the operator's view)."""
    import httpx

    started = time.monotonic()
    while time.monotonic() - started < limit:
        env = httpx.get(f"{url}/v1/environments/{env_id}", timeout=30).json()
        if env.get("warm", 0) >= want:
            return time.monotonic() - started
        time.sleep(0.25)
    raise SystemExit(f"the pool never held {want} ready forks: {env}")


async def one(farm, env_id, latencies, failures):
    t0 = time.monotonic()
    try:
        sb = await farm.sandboxes.create(env_id)
    except Exception as e:  # noqa: BLE001 - a benchmark counts every failure
        failures.append(type(e).__name__ + ": " + str(e)[:120])
        return
    try:
        result = await sb.exec("true")
        if result.exit_code != 0:
            failures.append(f"exec exit {result.exit_code}")
            return
        latencies.append((time.monotonic() - t0) * 1e3)
    finally:
        await sb.kill()


def line(label, mode, latencies, failures, wall, extra=None):
    out = {
        "label": label, "mode": mode, "n": len(latencies) + len(failures), "failed": len(failures),
        "failures": sorted(set(failures))[:5],
        "p50_ms": percentile(latencies, 50), "p95_ms": percentile(latencies, 95),
        "p99_ms": percentile(latencies, 99), "wall_s": round(wall, 2),
        "creates_per_s": round(len(latencies) / wall, 2) if wall else None,
    }
    out.update(extra or {})
    print(json.dumps(out), flush=True)


async def sequential(url, env_id, n, label):
    latencies, failures = [], []
    async with AsyncFarm(url=url) as farm:
        await one(farm, env_id, [], [])  # the first one starts whatever is lazy
        started = time.monotonic()
        for _ in range(n):
            await one(farm, env_id, latencies, failures)
    line(label, "sequential", latencies, failures, time.monotonic() - started)


async def rate(url, env_id, per_sec, seconds, label):
    latencies, failures = [], []
    async with AsyncFarm(url=url) as farm:
        started = time.monotonic()
        tasks = []
        for i in range(int(per_sec * seconds)):
            await asyncio.sleep(max(0.0, started + i / per_sec - time.monotonic()))
            tasks.append(asyncio.create_task(one(farm, env_id, latencies, failures)))
        await asyncio.gather(*tasks)
    line(label, f"rate {per_sec}/s", latencies, failures, time.monotonic() - started, {"asked_per_s": per_sec})


async def burst(url, env_id, n, label, wait, rounds):
    async with AsyncFarm(url=url) as farm:
        for round_ in range(1, rounds + 1):
            latencies, failures = [], []
            # A sandbox of the caller's own while the pool fills: it starts a pool made on
            # first use, and a caller sees an environment's warm forks once it has a sandbox
            # there.
            holder = await farm.sandboxes.create(env_id)
            filled = wait_ready(url, env_id, wait) if wait else 0
            await holder.kill()
            started = time.monotonic()
            await asyncio.gather(*(one(farm, env_id, latencies, failures) for _ in range(n)))
            line(label, f"burst {n} #{round_}", latencies, failures, time.monotonic() - started,
                 {"pool_ready_before": wait, "pool_filled_s": round(filled, 1)})


def report(path):
    rows = [json.loads(x) for x in open(path) if x.strip()]
    print(f"{'label':24} {'mode':16} {'n':>4} {'failed':>6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'wall s':>7} {'creates/s':>9}")
    for r in rows:
        print(f"{r['label']:24} {r['mode']:16} {r['n']:>4} {r['failed']:>6} {r['p50_ms']!s:>8} {r['p95_ms']!s:>8} "
              f"{r['p99_ms']!s:>8} {r['wall_s']:>7} {r['creates_per_s']!s:>9}")
        for f in r["failures"]:
            print(f"    failure: {f}")


def main():
    url, mode = sys.argv[1], sys.argv[2]
    if mode == "report":
        return report(sys.argv[3])
    env_id = environment(url)
    if mode == "sequential":
        asyncio.run(sequential(url, env_id, int(sys.argv[3]), sys.argv[4]))
    elif mode == "rate":
        asyncio.run(rate(url, env_id, float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]))
    elif mode == "burst":
        wait = int(sys.argv[5]) if len(sys.argv) > 5 else 0
        rounds = int(sys.argv[6]) if len(sys.argv) > 6 else 1
        asyncio.run(burst(url, env_id, int(sys.argv[3]), sys.argv[4], wait, rounds))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
