#!/usr/bin/env python3
"""What unread output streams hold of `farm serve` (run by bench/streams.sh).

    streams.py URL SERVE_PID N LABEL    one JSON line: the service's RSS with N output streams of
                                        a chatty process open and never read, against none

A process prints as fast as it can; N clients open its output stream (and N an exec's
stream of the same), read the answer's head and then nothing. The service's RSS is read
before, and after the streams had 20 s to fill whatever they buffer.
"""

import json
import socket
import sys
import time
import urllib.parse

import requests

HTTP = requests.Session()


def call(url, method, path, body=None):
    r = HTTP.request(method, url + path, json=body, timeout=900)
    if r.status_code not in (200, 201, 202):
        raise SystemExit(f"{method} {path}: {r.status_code} {r.text}")
    return r.json()


def environment(url):
    env = call(url, "POST", "/v1/environments", {"image": "minimal"})
    while env["state"] == "building":
        time.sleep(1)
        env = call(url, "GET", f"/v1/environments/{env['id']}")
    return env["id"]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise SystemExit("no VmRSS")


def unread(url, method, path, body=None):
    """Opens a stream, reads its status line, and never reads again."""
    parsed = urllib.parse.urlparse(url)
    s = socket.create_connection((parsed.hostname, parsed.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nContent-Length: {len(data)}\r\n"
    if body is not None:
        head += "Content-Type: application/json\r\n"
    s.sendall(head.encode() + b"\r\n" + data)
    status = s.recv(64)
    if b" 200 " not in status:
        raise SystemExit(f"{path}: {status!r}")
    return s


def main():
    url, pid, n, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    env_id = environment(url)
    sb = call(url, "POST", "/v1/sandboxes", {"environment": env_id})["id"]
    chatty = "while true; do cat /proc/cpuinfo /proc/meminfo; done"
    proc = call(url, "POST", f"/v1/sandboxes/{sb}/processes", {"command": chatty, "ring_bytes": 16 << 20})
    time.sleep(5)
    before = rss_mib(pid)
    held = []
    for _ in range(n):
        held.append(unread(url, "GET", f"/v1/sandboxes/{sb}/processes/{proc['pid']}/output/stream"))
        held.append(unread(url, "POST", f"/v1/sandboxes/{sb}/exec/stream",
                           {"command": chatty, "max_output_bytes": 16 << 20, "timeout_secs": 60}))
    time.sleep(20)
    after = rss_mib(pid)
    for s in held:
        s.close()
    call(url, "DELETE", f"/v1/sandboxes/{sb}")
    print(json.dumps({
        "label": label, "streams": 2 * n, "rss_before_mib": round(before, 1),
        "rss_after_mib": round(after, 1),
        "mib_per_stream": round((after - before) / (2 * n), 2),
    }))


if __name__ == "__main__":
    main()
