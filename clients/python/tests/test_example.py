"""examples/farm_client.py, run on the SDK against a scripted `farm serve`."""

import importlib.util
import io
import json
import os
import subprocess
import sys

import httpx
import pytest

import farm_sdk.fleet

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "farm_client.py")


def load_example():
    spec = importlib.util.spec_from_file_location("farm_client_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    writes = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # leave no __pycache__ in examples/
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes
    return module


class FakeServe:
    """Just enough of `farm serve` for the example: every rollout passes; the session's
    branch writes the right answer, the original a wrong one."""

    def __init__(self):
        self.rows = []
        self.files = {}

    def __call__(self, request):
        path, method = request.url.path, request.method
        if path == "/v1/capacity":
            return httpx.Response(200, json={"slots": 2, "in_flight": 0, "queued": 0, "warm": 0, "queue_limit": 8,
                                             "sessions": 0, "max_sessions": 4, "memory": {}})
        if (method, path) == ("POST", "/v1/rollouts"):
            assert request.headers["Idempotency-Key"]
            groups = []
            for i, item in enumerate(json.loads(request.content)["items"]):
                ids = [f"{item['task_id']}-{j}" for j in range(item["n"])]
                groups.append({"group_id": f"g{i}", "task_id": item["task_id"], "suite": "s", "rollout_ids": ids})
                self.rows += [{"rollout_id": r, "status": "passed", "reward": 1.0} for r in ids]
            return httpx.Response(202, json={"groups": groups})
        if path == "/v1/results":
            cursor = int(request.url.params["cursor"])
            if "arrow" in request.headers.get("Accept", ""):
                import pyarrow
                import pyarrow.ipc

                table = pyarrow.Table.from_pylist(self.rows)
                sink = io.BytesIO()
                with pyarrow.ipc.new_stream(sink, table.schema) as writer:
                    writer.write_table(table)
                return httpx.Response(200, content=sink.getvalue())
            rows = self.rows[cursor:]
            text = "".join(json.dumps(dict(r, cursor=cursor + i)) + "\n" for i, r in enumerate(rows))
            return httpx.Response(200, text=text, headers={"farm-next-cursor": str(len(self.rows))})
        if (method, path) == ("POST", "/v1/sessions"):
            return httpx.Response(201, json={"session_id": "s1", "rollout_id": "r-s1"})
        session, action = path.split("/")[3:5]
        if action == "branch":
            self.files["s2"] = dict(self.files.get(session, {}))
            return httpx.Response(201, json={"session_id": "s2", "parent": session})
        if action == "exec":
            command = json.loads(request.content)["command"]
            files = self.files.setdefault(session, {})
            out = ""
            if command == "cat n.txt":
                out = "21\n"
            elif command.startswith("echo 41"):
                files["out.txt"] = "41"
            elif command.startswith("echo $(("):
                files["out.txt"] = "42"
            elif command == "cat out.txt":
                out = files.get("out.txt", "") + "\n"
            return httpx.Response(200, json={"step": {"stdout": out, "exit_code": 0}, "ended": False})
        if action == "submit":
            passed = self.files.get(session, {}).get("out.txt") == "42"
            return httpx.Response(200, json={"rollout_id": f"r-{session}", "status": "passed" if passed else "failed",
                                             "reward": 1.0 if passed else 0.0})
        return httpx.Response(404, json={"error": f"no route {method} {path}"})


def test_the_example_runs_its_steps_on_the_sdk(monkeypatch, capsys):
    example = load_example()
    assert example.Fleet is farm_sdk.fleet.Fleet and example.lost_in_restart is farm_sdk.fleet.lost_in_restart
    transport = httpx.MockTransport(FakeServe())
    monkeypatch.setattr(example, "Fleet", lambda urls, token: farm_sdk.fleet.Fleet(urls, token, transport=transport))
    monkeypatch.setattr(sys, "argv", ["farm_client.py", "--farm", "http://serve.test:8765", "--model-url",
                                      "http://model.test/v1", "--tasks", "double", "answer", "--n", "2"])
    example.main()
    printed = capsys.readouterr().out
    assert "submitted 4 rollouts in 2 groups to 1 endpoint(s)" in printed
    assert "task double: passed:1.0, passed:1.0" in printed
    assert "task answer: passed:1.0, passed:1.0" in printed
    assert "arrow: 4 rows" in printed or "arrow: pyarrow not installed, skipped" in printed
    assert "sees n.txt = 21" in printed
    assert "session original: out.txt = 41, failed reward 0.0" in printed
    assert "session branch: out.txt = 42, passed reward 1.0" in printed


def test_the_example_runs_as_a_script_from_the_checkout():
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, EXAMPLE, "--help"], capture_output=True, text=True, env=env, timeout=60)
    if done.returncode != 0 and "No module named 'httpx'" in done.stderr:
        pytest.skip("httpx is not installed for this interpreter")
    assert done.returncode == 0, done.stderr
    assert "--model-url" in done.stdout
