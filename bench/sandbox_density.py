#!/usr/bin/env python3
"""The HTTP side of bench/sandbox-density.sh (stock libraries only). Prints one JSON object.

    sandbox_density.py URL N SERVE_PID KSM RUN_DIR
"""

import json
import os
import sys
import time

import requests

from sandboxes import qemu_pids
from serve_density import meminfo, stats, tree_ticks

PORT = 8000


def pss_mib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main():
    url, n, serve_pid, ksm, run_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    http = requests.Session()
    total = meminfo()["MemTotal"]
    peak_used = 0

    def call(method, path, body=None):
        return http.request(method, url + path, json=body, timeout=600)

    env = call("POST", "/v1/environments", {"image": "minimal"}).json()
    while env["state"] == "building":
        time.sleep(1)
        env = call("GET", f"/v1/environments/{env['id']}").json()
    if env["state"] != "ready":
        raise SystemExit(f"the environment failed: {env}")

    waits = {"fetch": 0, "command": 0}

    def fetch(port):
        """The sandbox's page through the port listener: (seconds, body) or (None, what). A 503
        (the host under half the memory reserve) is retried every 5 s for two minutes, as a
        client would."""
        for _ in range(25):
            t = time.monotonic()
            try:
                r = http.get(f"http://{port['address']}/", headers={port["header"]: port["token"]}, timeout=120)
            except requests.RequestException as e:
                return None, str(e)
            if r.status_code != 503:
                break
            waits["fetch"] += 1
            time.sleep(5)
        return (time.monotonic() - t, r.text.strip()) if r.status_code == 200 else (None, f"{r.status_code} {r.text[:120]}")

    def command(sid, script):
        """`script` in sandbox `sid`, retried after a 503 as `fetch` does: (seconds, response)."""
        for _ in range(25):
            t = time.monotonic()
            r = call("POST", f"/v1/sandboxes/{sid}/exec", {"command": script})
            if r.status_code != 503:
                break
            waits["command"] += 1
            time.sleep(int(r.headers.get("retry-after", "5")))
        return time.monotonic() - t, r

    # A 503 (memory past the reserve) is retried after its Retry-After while memory still
    # comes back (ksmd merging); a minute without a new sandbox ends the fill.
    live, creates, serves, first_fetches, failed = [], [], [], [], []
    refused, refusals, last_made = None, 0, time.monotonic()
    while len(live) < n:
        t = time.monotonic()
        r = call("POST", "/v1/sandboxes", {"environment": env["id"], "lifetime_secs": 7200, "idle_timeout_secs": 7200})
        if r.status_code != 201:
            refused = {"status": r.status_code, "error": r.json().get("error"), "retry_after": r.headers.get("retry-after")}
            refusals += 1
            if r.status_code != 503 or time.monotonic() - last_made > 60:
                break
            time.sleep(int(r.headers.get("retry-after", "5")))
            continue
        last_made = time.monotonic()
        creates.append(last_made - t)
        sid = r.json()["id"]
        # A background process with an open port: busybox httpd, which detaches.
        t = time.monotonic()
        _, r = command(sid, f"mkdir -p /www && echo {sid} > /www/index.html && httpd -p 127.0.0.1:{PORT} -h /www")
        if r.status_code != 200 or r.json().get("exit_code") != 0:
            failed.append(f"{sid}: httpd: {r.status_code} {r.text[:160]}")
            continue
        port = call("POST", f"/v1/sandboxes/{sid}/ports", {"port": PORT}).json()
        serves.append(time.monotonic() - t)
        took, body = fetch(port)
        if took is None or body != sid:
            failed.append(f"{sid}: first fetch: {body}")
        else:
            first_fetches.append(took)
        live.append((sid, port))
        m = meminfo()
        peak_used = max(peak_used, m["MemTotal"] - m["MemAvailable"])
        if len(live) % 50 == 0:
            print(f"{len(live)} sandboxes live, host memory used {(m['MemTotal'] - m['MemAvailable']) >> 20} MiB",
                  file=sys.stderr)

    qemus = qemu_pids(run_dir)
    sample = [p for p in (pss_mib(pid) for pid in qemus[:: max(1, len(qemus) // 50)]) if p is not None]
    hz = os.sysconf("SC_CLK_TCK")
    t0, ticks0 = time.monotonic(), tree_ticks(serve_pid)
    time.sleep(60)
    idle_percent = (tree_ticks(serve_pid) - ticks0) / hz / (time.monotonic() - t0) * 100

    # With all live, after the idle minute: each answers through its port, and a command.
    fetches, commands, answered = [], [], 0
    for sid, port in live:
        took, body = fetch(port)
        if took is None or body != sid:
            failed.append(f"{sid}: fetch after the idle minute: {body}")
            continue
        fetches.append(took)
        took, r = command(sid, "pidof httpd >/dev/null && echo up")
        if r.status_code == 200 and r.json().get("stdout", "").strip() == "up":
            commands.append(took)
            answered += 1
        else:
            failed.append(f"{sid}: command after the idle minute: {r.status_code} {r.text[:120]}")
        m = meminfo()
        peak_used = max(peak_used, m["MemTotal"] - m["MemAvailable"])

    for sid, _ in live:
        call("DELETE", f"/v1/sandboxes/{sid}")
    time.sleep(5)
    m = meminfo()
    print(json.dumps({
        "benchmark": "sandbox-density",
        "ksm": ksm,
        "sandboxes_wanted": n,
        "sandboxes_live": len(live),
        "answered_port_and_command_after_idle_minute": answered,
        "last_refusal": refused,
        "refusals_503": refusals,
        "create": stats(creates),
        "start_httpd_and_open_port": stats(serves),
        "first_fetch_through_port": stats(first_fetches),
        "fetch_through_port_with_all_live": stats(fetches),
        "command_with_all_live": stats(commands),
        "waits_503_after_retry_after": waits,
        "failed": failed[:10],
        "failed_count": len(failed),
        "qemu_processes_with_all_live": len(qemus),
        "pss_per_vm_mib_sampled": {"n": len(sample), "mean": round(sum(sample) / len(sample), 1) if sample else None},
        "idle_service_cpu_percent_of_one_core": round(idle_percent, 2),
        "host_total_mib": total >> 20,
        "host_used_peak_percent": round(peak_used / total * 100, 2),
        "host_used_after_delete_mib": (m["MemTotal"] - m["MemAvailable"]) >> 20,
    }, indent=1))


if __name__ == "__main__":
    main()
