#!/usr/bin/env python3
"""A stand-in for a model: an OpenAI-compatible chat-completions server that solves farm's
`serve-sample` tasks (configs/serve.toml) with tool calls, for tests and benchmarks.

It reads the task from the conversation and answers with the next tool call:
- "six times seven": submit 42;
- otherwise: `cat n.txt`, then write twice that number into out.txt, then submit.

Each answer carries `token_ids`, `prompt_token_ids` and logprobs, so tests can check they are
recorded exactly as returned. It prints `listening on PORT` once it listens, and serves until
killed. `--port 0` picks a free port.
"""

import argparse
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def tool_call(n, name, args):
    return {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "model": "fake",
        "choices": [{
            "index": 0,
            "finish_reason": "tool_calls",
            "token_ids": [1000 + n, 2000 + n],
            "logprobs": {"content": [{"token": "t", "logprob": -0.5, "top_logprobs": []}]},
            "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call-{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]},
        }],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
        "prompt_token_ids": [7, 8, 9],
    }


def answer(messages):
    task = " ".join(m.get("content") or "" for m in messages if m.get("role") == "user")
    tools = [m for m in messages if m.get("role") == "tool"]
    if "six times seven" in task:
        return tool_call(0, "submit", {"answer": "42"})
    if not tools:
        return tool_call(1, "run_shell", {"command": "cat n.txt"})
    if len(tools) == 1:
        found = re.search(r"--- stdout ---\n\s*(-?\d+)", tools[0].get("content") or "")
        n = int(found.group(1)) if found else 0
        return tool_call(2, "write_file", {"path": "out.txt", "content": f"{2 * n}\n"})
    return tool_call(3, "submit", {"answer": "done"})


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        try:
            body = json.loads(self.rfile.read(length))
            reply, status = answer(body["messages"]), 200
        except (ValueError, KeyError) as e:
            reply, status = {"error": {"message": f"bad request: {e}"}}, 400
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
