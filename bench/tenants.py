"""bench/tenants.sh's client: A's admission waits, quiet, under B's flood, and under a flood
in A's own lane. Usage: tenants.py URL KEY_A KEY_B FLOOD A_N."""
import json
import sys
import time
import urllib.request

url, key_a, key_b, flood, a_n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
ACTIONS = [{"kind": "exec", "command": "echo $(( $(cat n.txt) * 2 )) > out.txt"}]


def call(key, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read() or b"null"), r.headers


def submit(key, n, version):
    item = {"task_id": "double", "n": n, "policy_version": version, "policy": {"kind": "replay", "actions": ACTIONS}}
    answer, _ = call(key, "POST", "/v1/rollouts", {"items": [item]})
    return answer["groups"][0]["rollout_ids"]


def rows(key, ids, cursor):
    """Rows of `ids` (a dict by id), read from `cursor` on; the next cursor."""
    got = {}
    while len(got) < len(ids):
        req = urllib.request.Request(f"{url}/v1/results?cursor={cursor}&max=10000&wait=30")
        req.add_header("Authorization", f"Bearer {key}")
        with urllib.request.urlopen(req, timeout=600) as r:
            cursor = int(r.headers["farm-next-cursor"])
            for line in r.read().decode().splitlines():
                row = json.loads(line)
                if row.get("rollout_id") in ids:
                    got[row["rollout_id"]] = row
    return got, cursor


def a_waits(flood_key, cursor, version):
    """A's waits (ms) while `flood_key` (None: nobody) has FLOOD rollouts queued."""
    if flood_key is not None:
        submit(flood_key, flood, version)
    submitted = {}
    for _ in range(a_n):
        at = time.time() * 1000
        (rid,) = submit(key_a, 1, version + 1)
        submitted[rid] = at
        time.sleep(0.5)
    got, cursor = rows(key_a, set(submitted), cursor)
    # The flood that is left is cancelled (it is B's, or A's older policy version).
    call(flood_key or key_a, "POST", "/v1/cancel", {"policy_version_below": version + 1})
    waits = sorted(max(0.0, got[r]["started_at_ms"] - submitted[r]) for r in submitted)
    return waits, cursor


def pct(xs, p):
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    # Warm-up: the template's first forks.
    _, cursor = rows(key_a, set(submit(key_a, 4, 1)), 0)
    results = {}
    for name, flood_key, version in [("quiet", None, 10), ("flood_fair", key_b, 20), ("flood_fifo", key_a, 30)]:
        waits, cursor = a_waits(flood_key, cursor, version)
        results[name] = {"p50_ms": round(pct(waits, 50)), "p99_ms": round(pct(waits, 99)), "n": len(waits)}
        print(f"{name:<11} A's admission wait p50 {results[name]['p50_ms']:>7} ms  p99 {results[name]['p99_ms']:>7} ms  ({len(waits)} rollouts)", file=sys.stderr)
        # Let the cancelled flood drain before the next phase.
        time.sleep(5)
    q, f, o = results["quiet"], results["flood_fair"], results["flood_fifo"]
    results["ratios"] = {
        "fair_p99_over_quiet_p99": round(f["p99_ms"] / max(q["p99_ms"], 1), 2),
        "fifo_p99_over_fair_p99": round(o["p99_ms"] / max(f["p99_ms"], 1), 2),
    }
    print(json.dumps(results, indent=1))


main()
