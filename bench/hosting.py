#!/usr/bin/env python3
"""The hosting benchmark (run by bench/hosting.sh): URL SERVE_PID N_LATENCY N_REQUESTS N_SANDBOXES.

1. On one sandbox of the minimal image with busybox httpd running in the background: an exec
   round trip (`true`), the baseline, against opening a port and the first request through it
   (the port closed again before each try, so each open makes a new token).
2. On one sandbox of the python image with `python3 -m http.server` running: requests per second
   through the port listener from the host, against the same server reached by a client inside
   the guest (both one connection per request, one at a time).
3. N sandboxes, each with httpd in the background and its port open, all asked through the
   listener; farm serve's RSS and open descriptors before, with them, and after.
"""

import concurrent.futures
import http.client
import json
import os
import sys
import time

import requests

HTTP = requests.Session()


def call(url, method, path, body=None, expect=(200, 201, 202)):
    r = HTTP.request(method, url + path, json=body, timeout=900)
    if r.status_code not in expect:
        raise SystemExit(f"{method} {path}: {r.status_code} {r.text}")
    return r.json()


def environment(url, image):
    env = call(url, "POST", "/v1/environments", {"image": image})
    while env["state"] == "building":
        time.sleep(1)
        env = call(url, "GET", f"/v1/environments/{env['id']}")
    if env["state"] != "ready":
        raise SystemExit(f"the environment failed: {env}")
    return env["id"]


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def stats(values):
    return {"p50_ms": round(percentile(values, 50), 2), "p99_ms": round(percentile(values, 99), 2)}


def get(address, token, path="/"):
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", path, headers={"Farm-Port-Token": token})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def start(url, sb, body):
    return call(url, "POST", f"/v1/sandboxes/{sb}/processes", body)["pid"]


def until_served(address, token):
    for _ in range(600):
        status, _ = get(address, token)
        if status == 200:
            return
        time.sleep(0.1)
    raise SystemExit("the server never answered through its port")


def latency(url, n):
    env = environment(url, "minimal")
    sb = call(url, "POST", "/v1/sandboxes", {"environment": env})["id"]
    call(url, "POST", f"/v1/sandboxes/{sb}/exec", {"command": "mkdir -p /www && echo hello > /www/index.html"})
    start(url, sb, {"argv": ["httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/www"]})
    port = call(url, "POST", f"/v1/sandboxes/{sb}/ports", {"port": 8000})
    until_served(port["address"], port["token"])
    execs, opens = [], []
    for _ in range(n):
        t0 = time.monotonic()
        out = call(url, "POST", f"/v1/sandboxes/{sb}/exec", {"command": "true"})
        execs.append((time.monotonic() - t0) * 1e3)
        assert out["exit_code"] == 0, out
        call(url, "DELETE", f"/v1/sandboxes/{sb}/ports/8000")
        t0 = time.monotonic()
        port = call(url, "POST", f"/v1/sandboxes/{sb}/ports", {"port": 8000})
        status, body = get(port["address"], port["token"])
        opens.append((time.monotonic() - t0) * 1e3)
        assert status == 200 and body == b"hello\n", (status, body)
    call(url, "DELETE", f"/v1/sandboxes/{sb}")
    return {"n": n, "exec": stats(execs), "open_and_first_request": stats(opens),
            "ratio_p50": round(percentile(opens, 50) / percentile(execs, 50), 2)}


GUEST_CLIENT = """
import http.client, sys, time
n = int(sys.argv[1])
t0 = time.monotonic()
for _ in range(n):
    c = http.client.HTTPConnection("127.0.0.1", 8000, timeout=60)
    c.request("GET", "/hello.txt")
    r = c.getresponse(); r.read(); c.close()
    assert r.status == 200, r.status
print(n / (time.monotonic() - t0))
"""


def throughput(url, n):
    env = environment(url, "python")
    sb = call(url, "POST", "/v1/sandboxes", {"environment": env})["id"]
    call(url, "POST", f"/v1/sandboxes/{sb}/exec", {"command": "mkdir -p /www && echo hello > /www/hello.txt && cat > /tmp/client.py",
                                                   "stdin": GUEST_CLIENT})
    start(url, sb, {"command": "cd /www && exec python3 -m http.server --bind 127.0.0.1 8000"})
    port = call(url, "POST", f"/v1/sandboxes/{sb}/ports", {"port": 8000})
    until_served(port["address"], port["token"])
    rounds = []
    for _ in range(3):
        t0 = time.monotonic()
        for i in range(n):
            status, body = get(port["address"], port["token"], "/hello.txt")
            assert status == 200, f"request {i}: {status} {body[:300]!r}"
        proxied = n / (time.monotonic() - t0)
        out = call(url, "POST", f"/v1/sandboxes/{sb}/exec", {"command": f"python3 /tmp/client.py {n}", "timeout_secs": 900})
        assert out["exit_code"] == 0, out
        inside = float(out["stdout"])
        rounds.append({"proxied_rps": round(proxied, 1), "inside_rps": round(inside, 1),
                       "ratio": round(proxied / inside, 2)})
    call(url, "DELETE", f"/v1/sandboxes/{sb}")
    return {"n": n, "rounds": rounds}


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def many(url, serve_pid, n):
    env = environment(url, "minimal")
    HTTP.close()
    time.sleep(1)
    before = {"rss_kib": rss_kib(serve_pid), "fds": fds(serve_pid)}

    def one(i):
        sb = call(url, "POST", "/v1/sandboxes", {"environment": env})["id"]
        call(url, "POST", f"/v1/sandboxes/{sb}/exec", {"command": f"mkdir -p /www && echo sandbox-{i} > /www/index.html"})
        start(url, sb, {"argv": ["httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/www"]})
        port = call(url, "POST", f"/v1/sandboxes/{sb}/ports", {"port": 8000})
        return sb, port, i

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        made = list(pool.map(one, range(n)))
    t1 = time.monotonic()

    def ask(entry):
        sb, port, i = entry
        for _ in range(600):
            status, body = get(port["address"], port["token"])
            if status == 200:
                return body == f"sandbox-{i}\n".encode()
            time.sleep(0.1)
        return False

    answered = sum(concurrent.futures.ThreadPoolExecutor(8).map(ask, made))
    t2 = time.monotonic()
    HTTP.close()
    time.sleep(1)
    peak = {"rss_kib": rss_kib(serve_pid), "fds": fds(serve_pid)}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda e: call(url, "DELETE", f"/v1/sandboxes/{e[0]}"), made))
    HTTP.close()
    time.sleep(2)
    after = {"rss_kib": rss_kib(serve_pid), "fds": fds(serve_pid)}
    return {"n": n, "answered": answered, "start_secs": round(t1 - t0, 1), "ask_secs": round(t2 - t1, 1),
            "before": before, "peak": peak, "after": after,
            "rss_kib_per_sandbox": round((peak["rss_kib"] - before["rss_kib"]) / n, 1),
            "fds_per_sandbox": round((peak["fds"] - before["fds"]) / n, 2)}


def main():
    url, serve_pid = sys.argv[1].rstrip("/"), int(sys.argv[2])
    n_latency, n_requests, n_sandboxes = map(int, sys.argv[3:6])
    lat = latency(url, n_latency)
    print(json.dumps({"latency": lat}), flush=True)
    thr = throughput(url, n_requests)
    print(json.dumps({"throughput": thr}), flush=True)
    crowd = many(url, serve_pid, n_sandboxes)
    print(json.dumps({"many": crowd}), flush=True)
    print()
    print(f"exec round trip (true), n={lat['n']}: p50 {lat['exec']['p50_ms']} ms, p99 {lat['exec']['p99_ms']} ms")
    print(f"open a port + first proxied GET: p50 {lat['open_and_first_request']['p50_ms']} ms, "
          f"p99 {lat['open_and_first_request']['p99_ms']} ms  (x{lat['ratio_p50']} the exec p50)")
    for r in thr["rounds"]:
        print(f"python http.server, {thr['n']} GETs one at a time: through the port {r['proxied_rps']} req/s, "
              f"from inside the guest {r['inside_rps']} req/s (ratio {r['ratio']})")
    print(f"{crowd['n']} sandboxes with a server behind an open port: {crowd['answered']} answered with their own page; "
          f"started in {crowd['start_secs']} s, all asked in {crowd['ask_secs']} s")
    print(f"  farm serve RSS {crowd['before']['rss_kib'] // 1024} -> {crowd['peak']['rss_kib'] // 1024} -> "
          f"{crowd['after']['rss_kib'] // 1024} MiB ({crowd['rss_kib_per_sandbox']} KiB a sandbox); "
          f"descriptors {crowd['before']['fds']} -> {crowd['peak']['fds']} -> {crowd['after']['fds']} "
          f"({crowd['fds_per_sandbox']} a sandbox)")


if __name__ == "__main__":
    main()
