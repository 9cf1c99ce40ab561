"""E2B's code interpreter SDK (`e2b-code-interpreter` from PyPI, unmodified) against `farm
serve`, set up only as E2B's documentation sets up a self-hosted server: E2B_API_KEY,
E2B_API_URL, E2B_SANDBOX_URL.

    e2b_interpreter_check.py URL A_KEY B_KEY PLAIN_TEMPLATE

A_KEY and B_KEY are two tenants' farm keys; PLAIN_TEMPLATE an environment of A's with no
interpreter. Prints one JSON line of what it saw; any failed check raises.
"""

import asyncio
import base64
import json
import os
import sys

import httpx

URL, A_KEY, B_KEY, PLAIN = sys.argv[1:5]
os.environ["E2B_API_URL"] = URL
os.environ["E2B_SANDBOX_URL"] = URL


def as_e2b(key):
    assert key.startswith("farm_"), key
    return "e2b_" + key[len("farm_"):]


os.environ["E2B_API_KEY"] = as_e2b(A_KEY)

from e2b_code_interpreter import AsyncSandbox, Sandbox  # noqa: E402 (after the settings it reads)
from e2b import TimeoutException  # noqa: E402

seen = {}

# --- A, the sync client. No template: E2B's code-interpreter-v1, farm's code-interpreter
# image with its kernel warm in the snapshot.
sbx = Sandbox.create(timeout=600)
# State between runs.
first = sbx.run_code("x = 41")
assert first.error is None and first.results == [] and first.execution_count == 1, first
assert sbx.run_code("x + 1").text == "42"
# Output as it comes, to the callbacks and in the logs.
out, err = [], []
run = sbx.run_code(
    "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)",
    on_stdout=out.append,
    on_stderr=err.append,
)
assert run.logs.stdout == ["to stdout\n"] and run.logs.stderr == ["to stderr\n"], run.logs
assert [m.line for m in out] == ["to stdout\n"] and [m.line for m in err] == ["to stderr\n"], (out, err)
# Results by MIME type: a figure's PNG, a DataFrame's HTML.
run = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
pngs = [r.png for r in run.results if r.png]
assert len(pngs) == 1 and base64.b64decode(pngs[0]).startswith(b"\x89PNG"), run.results
run = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
frame = run.results[0]
assert frame.is_main_result and "<table" in frame.html and "a  b" in frame.text, frame
# An error: its name, value and traceback, and the kernel goes on.
run = sbx.run_code("def f():\n    return 1 / 0\nf()")
assert (run.error.name, run.error.value) == ("ZeroDivisionError", "division by zero"), run.error
assert "f()" in run.error.traceback and "ZeroDivisionError" in run.error.traceback, run.error.traceback
assert sbx.run_code("x").text == "41"
# Variables for one run only.
assert sbx.run_code("import os\nos.environ.get('ONLY_NOW')", envs={"ONLY_NOW": "yes"}).text == "'yes'"
assert sbx.run_code("os.environ.get('ONLY_NOW')").text is None
# Contexts: a kernel of its own, in its own folder.
ctx = sbx.create_code_context(cwd="/tmp")
assert (ctx.language, ctx.cwd) == ("python", "/tmp"), ctx
assert sbx.run_code("import os\nos.getcwd()", context=ctx).text == "'/tmp'"
assert sbx.run_code("x", context=ctx).error.name == "NameError"
assert ctx.id in {c.id for c in sbx.list_code_contexts()}
sbx.run_code("y = 1", context=ctx)
sbx.restart_code_context(ctx)
assert sbx.run_code("y", context=ctx).error.name == "NameError"
# A kernel that dies is started again, and the run says so.
sbx.run_code("z = 1", context=ctx)
died = sbx.run_code("import os\nos._exit(1)", context=ctx)
assert died.error.name == "DeadKernelError", died
assert sbx.run_code("z", context=ctx).error.name == "NameError"
assert sbx.run_code("2 + 2", context=ctx).text == "4"
# A client that gives up interrupts its run: the kernel is free for the next one at once (were
# the ten minutes' sleep still running, the next run would time out behind it).
try:
    sbx.run_code("import time\ntime.sleep(600)", timeout=5)
    raise AssertionError("a run past its timeout did not raise")
except TimeoutException:
    pass
assert sbx.run_code("x", timeout=120).text == "41"
sbx.remove_code_context(ctx)
assert ctx.id not in {c.id for c in sbx.list_code_contexts()}
seen["sync"] = "ok"

# --- farm's branch (E2B's fork): the kernel's live state is in both copies, which diverge.
sbx.run_code("shared = [1, 2]")
(child,) = sbx.fork(count=1, timeout=600)
assert not isinstance(child, Exception), child
assert child.run_code("shared.append(3)\nshared").text == "[1, 2, 3]"
assert sbx.run_code("shared").text == "[1, 2]"
assert child.run_code("x + 1").text == "42"
assert child.kill() is True
seen["branch"] = "ok"

# --- Pause and resume: the kernel, and its state, come back.
assert sbx.pause() is True
resumed = Sandbox.connect(sbx.sandbox_id)
assert resumed.run_code("x + 1").text == "42"
seen["pause"] = "ok"

# --- Refusals, with raw requests as a hostile client would make them.
http = httpx.Client(base_url=URL, timeout=60)
a_id, a_token = resumed.sandbox_id, resumed._envd_access_token
b = Sandbox.create(api_key=as_e2b(B_KEY), timeout=600)
b_token = b._envd_access_token


def interpreter(sandbox, path="/execute", method="POST", token=None, traffic=None, **kw):
    headers = {"E2b-Sandbox-Id": sandbox, "E2b-Sandbox-Port": "49999"}
    if token is not None:
        headers["X-Access-Token"] = token
    if traffic is not None:
        headers["E2B-Traffic-Access-Token"] = traffic
    headers.update(kw.pop("headers", {}))
    return http.request(method, path, headers=headers, **kw)


run = {"code": "x", "context_id": None, "language": None, "env_vars": None}
# The traffic token alone opens the interpreter (the SDK sends no X-Access-Token on contexts).
ok = interpreter(a_id, "/contexts", "GET", traffic=a_token)
assert ok.status_code == 200 and ok.json()[0]["id"] == "default", ok.text
refusals = {
    # B's token on A's sandbox, on both headers and every route.
    "b_token_a_execute": interpreter(a_id, token=b_token, json=run),
    "b_traffic_a_contexts": interpreter(a_id, "/contexts", "GET", traffic=b_token),
    "b_traffic_a_new_context": interpreter(a_id, "/contexts", traffic=b_token, json={}),
    "b_traffic_a_restart": interpreter(a_id, "/contexts/default/restart", traffic=b_token),
    "b_traffic_a_remove": interpreter(a_id, "/contexts/" + "0" * 32, "DELETE", traffic=b_token),
    # No token, a forged one, a tenant's key (either tenant's) in its place.
    "no_token": interpreter(a_id, json=run),
    "forged": interpreter(a_id, token=a_token[:-1] + ("0" if a_token[-1] != "0" else "1"), json=run),
    "a_key_as_token": interpreter(a_id, token=A_KEY, json=run),
    "api_key_header": interpreter(a_id, json=run, headers={"X-API-KEY": as_e2b(A_KEY)}),
    "bearer_key": interpreter(a_id, json=run, headers={"Authorization": "Bearer " + A_KEY}),
}
statuses = {name: r.status_code for name, r in refusals.items()}
assert all(code == 401 for code in statuses.values()), statuses
for name, r in refusals.items():
    assert r.json()["code"] == 401 and a_id not in r.json()["message"], (name, r.text)
# Bodies are read strictly and bounded before anything reaches the guest.
strict = {
    "code_twice": interpreter(a_id, token=a_token, content=b'{"code": "1", "code": "x"}'),
    "trailing": interpreter(a_id, token=a_token, content=b'{"code": "1"} {"code": "2"}'),
    "unknown_key": interpreter(a_id, token=a_token, json={**run, "user": "root"}),
    "huge_code": interpreter(a_id, token=a_token, json={**run, "code": "#" * ((1 << 20) + 1)}),
    "context_path": interpreter(a_id, "/contexts/..%2F..%2Fexecute/restart", traffic=a_token),
    "context_in_body": interpreter(a_id, token=a_token, json={**run, "context_id": "../health"}),
}
statuses = {name: r.status_code for name, r in strict.items()}
assert all(code in (400, 404, 413) for code in statuses.values()), statuses
assert resumed.run_code("x").text == "41", "the refusals changed nothing"
# A sandbox with no interpreter says so (its port 49999 has nothing listening).
plain = Sandbox.create(template=PLAIN, timeout=600)
none = interpreter(plain.sandbox_id, token=plain._envd_access_token, json=run)
assert none.status_code == 502 and "no code interpreter" in none.json()["message"], none.text
assert plain.kill() is True
seen["refusals"] = len(refusals) + len(strict)


# --- The async client.
async def main():
    a = await AsyncSandbox.create(timeout=600)
    await a.run_code("y = 2")
    assert (await a.run_code("y * 21")).text == "42"
    got = []
    run = await a.run_code("print('async out')", on_stdout=got.append)
    assert run.logs.stdout == ["async out\n"] and [m.line for m in got] == ["async out\n"], (run, got)
    assert any(c.id == "default" for c in await a.list_code_contexts())
    assert await a.kill() is True


asyncio.run(main())
seen["async"] = "ok"

assert resumed.kill() is True
assert b.kill() is True
print(json.dumps(seen))
