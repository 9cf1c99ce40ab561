#!/usr/bin/env python3
"""A git server for the egress tests: `git http-backend` (smart HTTP, pushes allowed) behind a
small HTTP server on 127.0.0.1, plus a few plain paths. Every request must carry
`Authorization: Bearer TOKEN` (401 otherwise); each request line and whether it carried the
token is appended to LOG.

    git_server.py ROOT TOKEN LOG [CERT KEY]     (prints "listening on PORT"; HTTPS with CERT)

ROOT/repo.git is the repository. Under /simple/ and /packages/, a file of ROOT/index is
served when there is one (a package index), and anything else answers 200 "ok".

It is as careless as many http.server-based apps: it never reads the body of a GET or a
HEAD and keeps the connection open, so a body sent with one is read as the next request.
The egress tests need such an upstream: a proxy that forwarded those bodies would let a
request no rule checked reach it (logged here like any other).
"""
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT, TOKEN, LOG = sys.argv[1], sys.argv[2], sys.argv[3]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def record(self, authorized):
        with open(LOG, "a") as f:
            f.write(f"{self.command} {self.path} {'token' if authorized else 'no-token'} host={self.headers.get('Host')}\n")

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))

    def reply(self, status, body, headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def handle_any(self):
        authorized = self.headers.get("Authorization") == f"Bearer {TOKEN}"
        self.record(authorized)
        data = self.body() if self.command not in ("GET", "HEAD") else b""
        if not authorized:
            return self.reply(401, b"a bearer token is required\n", [("WWW-Authenticate", "Bearer")])
        path, _, query = self.path.partition("?")
        if path.startswith("/simple/") or path.startswith("/packages/"):
            local = os.path.join(ROOT, "index", path.lstrip("/"))
            if os.path.isdir(local):
                local = os.path.join(local, "index.html")
            if os.path.isfile(local) and ".." not in path:
                kind = "text/html" if local.endswith(".html") else "application/octet-stream"
                return self.reply(200, open(local, "rb").read(), [("Content-Type", kind)])
            return self.reply(200, b"ok\n", [("Content-Type", "text/plain")])
        if not path.startswith("/repo.git/"):
            return self.reply(404, b"no such path\n")
        env = dict(os.environ, GIT_PROJECT_ROOT=ROOT, GIT_HTTP_EXPORT_ALL="1", PATH_INFO=path, QUERY_STRING=query,
                   REQUEST_METHOD=self.command, CONTENT_TYPE=self.headers.get("Content-Type", ""),
                   CONTENT_LENGTH=str(len(data)), REMOTE_USER="agent", REMOTE_ADDR="127.0.0.1")
        out = subprocess.run(["git", "http-backend"], input=data, env=env, capture_output=True).stdout
        head, _, content = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode().split("\r\n"):
            if not line:
                continue
            k, _, v = line.partition(": ")
            if k.lower() == "status":
                status = int(v.split()[0])
            else:
                headers.append((k, v))
        self.reply(status, content, headers)

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = handle_any


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
if len(sys.argv) > 5:
    import ssl
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(sys.argv[4], sys.argv[5])
    server.socket = context.wrap_socket(server.socket, server_side=True)
print(f"listening on {server.server_address[1]}", flush=True)
server.serve_forever()
