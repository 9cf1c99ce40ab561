"""OpenEnv's own client (`openenv` from PyPI, unmodified) against a real `farm serve` of
configs/serve.toml: reset, steps, bad actions, a submit that scores, a branch through
reset(branch_of=...), many clients at once, and a disconnect that ends its session.

Run by farm/tests/protocols.rs: python openenv_check.py URL TOKEN. Prints "ok: ..." lines and
exits non-zero at the first claim that does not hold.
"""

import json
import sys
import threading
import urllib.error
import urllib.request

from openenv.core import GenericEnvClient

URL, TOKEN = sys.argv[1], sys.argv[2]
BASE = URL + "/v1/openenv"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def client(token=TOKEN):
    headers = {"Authorization": f"Bearer {token}"}
    # Scoring a submit runs a check in a fresh VM: room for a loaded machine.
    return GenericEnvClient(base_url=BASE, headers=headers, message_timeout_s=600).sync()


def get(path, token=TOKEN):
    request = urllib.request.Request(URL + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def expect_error(code, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except RuntimeError as e:
        assert f"code: {code}" in str(e), f"expected {code}, got {e}"
        return str(e)
    raise AssertionError(f"expected a {code} error")


# The HTTP routes.
assert get("/v1/openenv/health") == {"status": "healthy"}
schema = get("/v1/openenv/schema")
assert {"action", "observation", "state"} <= set(schema), schema
kinds = sorted(o["properties"]["kind"]["const"] for o in schema["action"]["oneOf"])
assert kinds == ["exec", "submit", "write_file"], kinds
meta = get("/v1/openenv/metadata")
assert meta["name"] == "farm" and isinstance(meta["description"], str), meta
assert meta["suites"] == [{"name": "serve-sample", "tasks": ["answer", "double"]}], meta
try:
    get("/v1/openenv/health", token="wrong")
    raise AssertionError("a wrong token was let in")
except urllib.error.HTTPError as e:
    assert e.code == 401, e
print("ok: health, schema, metadata; a wrong token gets 401")

# The WebSocket refuses a wrong token at the upgrade.
try:
    with client(token="wrong") as env:
        env.reset(task_id="double")
    raise AssertionError("a wrong token opened a session")
except (ConnectionError, RuntimeError, OSError) as e:
    print(f"ok: a wrong token cannot connect ({type(e).__name__})")

# A page of another site cannot open the socket (browsers send its Origin; CORS does not
# cover WebSockets), even where the service has no token to stop it.
from websockets.exceptions import InvalidStatus  # noqa: E402 - openenv's own dependency
from websockets.sync.client import connect as ws_connect  # noqa: E402

try:
    ws_connect(BASE.replace("http", "ws", 1) + "/ws", origin="http://evil.example", additional_headers=AUTH).close()
    raise AssertionError("a foreign Origin opened the socket")
except InvalidStatus as e:
    assert e.response.status_code == 403, e
with ws_connect(BASE.replace("http", "ws", 1) + "/ws", origin=URL, additional_headers=AUTH) as ws:
    ws.send("not json")
    assert json.loads(ws.recv())["data"]["code"] == "INVALID_JSON"
    ws.send(json.dumps({"type": "dance"}))
    assert json.loads(ws.recv())["data"]["code"] == "UNKNOWN_TYPE"
print("ok: a foreign Origin gets 403 at the upgrade; the service's own origin, bad frames named")

# One episode: reset, steps, a bad action, a submit that passes.
with client() as env:
    expect_error("SESSION_ERROR", env.step, {"kind": "exec", "command": "true"})
    r = env.reset(task_id="double", seed=7, episode_id="ep-1")
    assert r.reward is None and r.done is False, r
    assert "n.txt" in r.observation["text"] and r.observation["task_id"] == "double", r.observation
    s = env.state()
    assert s["episode_id"] == "ep-1" and s["step_count"] == 0 and s["session_id"], s
    r = env.step({"kind": "exec", "command": "cat n.txt"})
    assert r.observation["stdout"].strip() == "21" and r.observation["exit_code"] == 0, r.observation
    assert r.reward is None and r.done is False, r
    msg = expect_error("VALIDATION_ERROR", env.step, {"kind": "exec", "cmd": "ls"})
    assert "cmd" in msg, msg
    expect_error("VALIDATION_ERROR", env.step, {"kind": "rm", "path": "/"})
    r = env.step({"kind": "exec", "command": "exit 3"})
    assert r.observation["exit_code"] == 3 and r.done is False, r.observation
    r = env.step({"kind": "write_file", "path": "out.txt", "content": "42\n"})
    assert r.done is False, r
    r = env.step({"kind": "submit"})
    assert r.done is True and r.reward == 1.0, r
    assert r.observation["status"] == "passed", r.observation
    assert env.state()["step_count"] == 4 and env.state()["done"] is True
    expect_error("SESSION_ERROR", env.step, {"kind": "exec", "command": "true"})
    # A second episode on the same connection: a fresh fork (out.txt is not there).
    r = env.reset(task_id="double")
    assert env.state()["episode_id"] != "ep-1"
    r = env.step({"kind": "exec", "command": "test -e out.txt; echo $?"})
    assert r.observation["stdout"].strip() == "1", r.observation
    env.step({"kind": "write_file", "path": "out.txt", "content": "41"})
    r = env.step({"kind": "submit"})
    assert r.done is True and r.reward == 0.0 and r.observation["status"] == "failed", r
    # The answer task: submit carries the answer.
    env.reset(task_id="answer")
    r = env.step({"kind": "submit", "answer": "42"})
    assert r.reward == 1.0, r
    msg = expect_error("VALIDATION_ERROR", lambda: env.reset(task="double"))
    assert "task" in msg, msg
print("ok: reset, exec, write_file, submit scored (1.0, then 0.0 on a fresh fork), bad actions named")

# A reset without a submit, on the same connection: the first episode's session ends and its
# VM is reset in place for the next one (same task snapshot; farm_vm_resets_total counts it),
# and nothing the first episode left is there: not its file, not its detached process.
def resets():
    request = urllib.request.Request(URL + "/metrics", headers=AUTH)
    with urllib.request.urlopen(request, timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith('farm_vm_resets_total{outcome="reset"}'):
                return float(line.split()[-1])
    raise AssertionError("/metrics has no farm_vm_resets_total")


LOOK = "test -e planted.txt; echo $?; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 1000'"
with client() as env:
    env.reset(task_id="double")
    env.step({"kind": "exec", "command": "echo planted > planted.txt; setsid sleep 1000 > /dev/null 2>&1 < /dev/null &"})
    r = env.step({"kind": "exec", "command": LOOK})
    assert r.observation["stdout"].split() == ["0", "1"], r.observation
    before = resets()
    r = env.reset(task_id="double")
    assert "n.txt" in r.observation["text"], r.observation
    assert resets() == before + 1, (before, resets())
    r = env.step({"kind": "exec", "command": LOOK})
    assert r.observation["stdout"].split() == ["1", "0"], r.observation
    # A reset that names no task of the suite is refused before the episode ends.
    msg = expect_error("VALIDATION_ERROR", env.reset, task_id="no-such-task")
    assert "task_id" in msg, msg
    r = env.step({"kind": "exec", "command": "cat n.txt"})
    assert r.observation["stdout"].strip() == "21", r.observation
print("ok: a reset on the same connection resets the episode's VM in place, nothing of it left; a bad one keeps the episode")

# A branch: a prepared state, continued exactly by another connection.
with client() as a, client() as b:
    a.reset(task_id="double")
    a.step({"kind": "write_file", "path": "out.txt", "content": "42"})
    parent = a.state()["session_id"]
    b.reset(branch_of=parent)
    r = b.step({"kind": "exec", "command": "cat out.txt"})
    assert r.observation["stdout"].strip() == "42", r.observation
    assert b.state()["step_count"] == 2, b.state()  # the parent's write, then the cat
    a.step({"kind": "write_file", "path": "out.txt", "content": "40"})
    assert b.step({"kind": "submit"}).reward == 1.0
    assert a.step({"kind": "submit"}).reward == 0.0
    expect_error("SESSION_ERROR", b.reset, branch_of="s-no-such-session")
    msg = expect_error("VALIDATION_ERROR", b.reset, branch_of=parent, seed=3)
    assert "seed" in msg, msg
    # Branching the connection's own session: the new one continues it, the old one ends.
    a.reset(task_id="double")
    a.step({"kind": "write_file", "path": "out.txt", "content": "42"})
    own = a.state()["session_id"]
    a.reset(branch_of=own)
    assert a.state()["session_id"] != own and a.state()["step_count"] == 1, a.state()
    assert a.step({"kind": "exec", "command": "cat out.txt"}).observation["stdout"].strip() == "42"
    assert not any(s["session_id"] == own for s in get("/v1/sessions")["sessions"]), "the old one ended"
print("ok: reset(branch_of=...) continues a live session's state, its own too; the two diverge")

# Many clients at once, each its own session.
N = 6
rewards = [None] * N
errors = []


def run(i):
    try:
        with client() as env:
            env.reset(task_id="double", seed=i)
            content = "42" if i % 2 == 0 else str(i)
            env.step({"kind": "write_file", "path": "out.txt", "content": content})
            rewards[i] = env.step({"kind": "submit"}).reward
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(f"client {i}: {e!r}")


threads = [threading.Thread(target=run, args=(i,)) for i in range(N)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
assert rewards == [1.0 if i % 2 == 0 else 0.0 for i in range(N)], rewards
print(f"ok: {N} clients at once, rewards {rewards}")

# Three ways to leave without submitting; each session must end (the test checks the ids).
left = []
env = client()
env.connect()
env.reset(task_id="double")
left.append(env.state()["session_id"])
assert any(s["session_id"] == left[0] for s in get("/v1/sessions")["sessions"])
env.disconnect()  # a close message

url = BASE.replace("http", "ws", 1) + "/ws"
ws = ws_connect(url, additional_headers=AUTH)
ws.send(json.dumps({"type": "reset", "data": {"task_id": "double"}}))
left.append(json.loads(ws.recv())["data"]["observation"]["session_id"])
ws.socket.close()  # the TCP connection drops: no close frame

ws = ws_connect(url, additional_headers=AUTH)
ws.send(json.dumps({"type": "reset", "data": {"task_id": "double"}}))
left.append(json.loads(ws.recv())["data"]["observation"]["session_id"])
ws.send(json.dumps({"type": "step", "data": {"kind": "exec", "command": "sleep 3"}}))
ws.send(json.dumps({"type": "close"}))  # while the step runs
ws.close()
print(f"ok: left sessions {left} by close, a dropped connection and a close during a step")
print(json.dumps({"left": left}))
