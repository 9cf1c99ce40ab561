"""A scripted OpenAI-compatible chat model for Harbor's terminus-2 (testing only).

    python3 scripted_model.py [PORT [SCRIPT.json]]

It prints `listening on PORT` once it listens (PORT 0, the default: any free port).

POST /v1/chat/completions answers, in turn, the replies of SCRIPT (a JSON list of terminus-2
JSON replies; default: solve configs/data/harbor/hello-file). The reply is chosen by how many
assistant messages the conversation already holds, so the server keeps no state and a retried
request gets the same answer. Past the script's end it repeats the last reply. Every request is
appended to $SCRIPTED_LLM_LOG when that is set.
"""

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_SCRIPT = [
    {
        "analysis": "The task wants /app/greeting.txt with one line.",
        "plan": "Write the file with printf, then check it.",
        "commands": [
            {"keystrokes": "printf 'hello, harbor\\n' > /app/greeting.txt\n", "duration": 0.5},
            {"keystrokes": "cat /app/greeting.txt\n", "duration": 0.5},
        ],
        "task_complete": True,
    },
    # terminus-2 asks "Are you sure you want to mark the task as complete?": say it again.
    {"analysis": "The file is written.", "plan": "Done.", "commands": [], "task_complete": True},
]


class Handler(BaseHTTPRequestHandler):
    script = DEFAULT_SCRIPT

    def log_message(self, *args):  # quiet
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            return self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "farm"}]})
        self._send(404, {"error": {"message": "not found"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._send(404, {"error": {"message": f"no {self.path} here"}})
        messages = body.get("messages") or []
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        reply = self.script[min(turn, len(self.script) - 1)]
        content = json.dumps(reply, indent=2)
        log = os.environ.get("SCRIPTED_LLM_LOG")
        if log:
            with open(log, "a") as f:
                f.write(json.dumps({"turn": turn, "model": body.get("model"), "stream": body.get("stream"),
                                    "last": (messages[-1].get("content") if messages else None)}) + "\n")
        answer = {
            "id": f"chatcmpl-scripted-{turn}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or "scripted",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
        }
        if body.get("stream"):
            # Server-sent events, as OpenAI streams them (one chunk, then [DONE]).
            chunk = dict(answer, object="chat.completion.chunk",
                         choices=[{"index": 0, "delta": {"role": "assistant", "content": content}, "finish_reason": "stop"}])
            data = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self._send(200, answer)


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if len(sys.argv) > 2:
        with open(sys.argv[2]) as f:
            Handler.script = json.load(f)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
