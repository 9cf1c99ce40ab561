"""E2B's own SDK (`e2b` from PyPI, unmodified) against `farm serve`, set up only as E2B's
documentation sets up a self-hosted server: E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL.

    e2b_check.py URL A_KEY B_KEY TEMPLATE

A_KEY and B_KEY are two tenants' farm keys (`farm_HEX`, given to the SDK as `e2b_HEX`);
TEMPLATE is an environment both made. Prints one JSON line of what it saw; any failed check
raises.
"""

import asyncio
import base64
import hashlib
import json
import os
import sys
import time
import urllib.parse

import httpx

URL, A_KEY, B_KEY, TEMPLATE = sys.argv[1:5]
os.environ["E2B_API_URL"] = URL
os.environ["E2B_SANDBOX_URL"] = URL


def as_e2b(key):
    assert key.startswith("farm_"), key
    return "e2b_" + key[len("farm_"):]


os.environ["E2B_API_KEY"] = as_e2b(A_KEY)

from e2b import AsyncSandbox, PtySize, Sandbox, SandboxQuery, SandboxState  # noqa: E402 (after the settings it reads)
from e2b import CommandExitException, InvalidArgumentException, NotFoundException, TimeoutException  # noqa: E402

seen = {}

# --- A, the sync client: create, commands in the foreground and background, files, info,
# list with a metadata and state filter, timeout, pause and resume through connect, kill.
sbx = Sandbox.create(template=TEMPLATE, timeout=600, metadata={"team": "a b", "run": "1"}, envs={"GREETING": "hej"})
run = sbx.commands.run('echo "$GREETING"; echo err >&2')
assert (run.stdout, run.stderr, run.exit_code) == ("hej\n", "err\n", 0), run
streamed = []
run = sbx.commands.run("for i in 1 2 3; do echo line $i; sleep 0.1; done", on_stdout=streamed.append)
assert "".join(streamed) == "line 1\nline 2\nline 3\n" and run.stdout == "".join(streamed), (streamed, run)
try:
    sbx.commands.run("echo partial; exit 3")
    raise AssertionError("exit 3 did not raise")
except CommandExitException as e:
    assert e.exit_code == 3 and e.stdout == "partial\n", e
handle = sbx.commands.run("sleep 0.2; echo later", background=True)
assert handle.pid > 0
waited = handle.wait()
assert waited.stdout == "later\n" and waited.exit_code == 0, waited
sbx.files.write("/tmp/a.txt", "one")
assert sbx.files.read("/tmp/a.txt") == "one"
sbx.files.write("/tmp/b.bin", b"\x00\x01two")
assert bytes(sbx.files.read("/tmp/b.bin", format="bytes")) == b"\x00\x01two"
# The filesystem calls (envd's Connect RPCs).
assert sbx.files.exists("/tmp/a.txt") and not sbx.files.exists("/tmp/none")
entry = sbx.files.get_info("/tmp/a.txt")
assert (entry.name, entry.type.value, entry.size, entry.path) == ("a.txt", "file", 3, "/tmp/a.txt"), entry
assert sbx.files.make_dir("/tmp/d/e") is True and sbx.files.make_dir("/tmp/d/e") is False
sbx.files.write("/tmp/d/e/f.txt", "deep")
names = sorted(e.path for e in sbx.files.list("/tmp/d", depth=2))
assert names == ["/tmp/d/e", "/tmp/d/e/f.txt"], names
moved = sbx.files.rename("/tmp/d/e/f.txt", "/tmp/d/g.txt")
assert moved.path == "/tmp/d/g.txt" and sbx.files.read("/tmp/d/g.txt") == "deep", moved
sbx.files.remove("/tmp/d")
assert not sbx.files.exists("/tmp/d")
# A watched folder: what was created, written and removed since the last poll.
sbx.files.make_dir("/tmp/w")
watcher = sbx.files.watch_dir("/tmp/w")
sbx.files.write("/tmp/w/new.txt", "1")
assert {(e.name, e.type.value) for e in watcher.get_new_events()} == {("new.txt", "create")}
sbx.files.write("/tmp/w/new.txt", "22")
assert {(e.name, e.type.value) for e in watcher.get_new_events()} == {("new.txt", "write")}
sbx.files.remove("/tmp/w/new.txt")
assert {(e.name, e.type.value) for e in watcher.get_new_events()} == {("new.txt", "remove")}
assert watcher.get_new_events() == []
watcher.stop()
# A listing past its bound is refused whole, not cut short.
sbx.commands.run("mkdir /tmp/many && cd /tmp/many && seq 1 10001 | xargs touch")
sbx.commands.run("rm /tmp/many/1")
assert len(sbx.files.list("/tmp/many", depth=1)) == 10000, "ten thousand entries are listed"
sbx.commands.run("touch /tmp/many/1")
try:
    sbx.files.list("/tmp/many", depth=1)
    raise AssertionError("a listing of 10001 entries was answered")
except InvalidArgumentException as e:
    assert "entries below" in str(e), e
# Commands as another guest user (E2B's `user=`).
assert sbx.commands.run("id -un", user="nobody").stdout == "nobody\n"
assert sbx.commands.run("id -un").stdout == "root\n"
# A background process: listed while it runs, fed its standard input, killed.
cat = sbx.commands.run("cat", background=True, stdin=True)
assert cat.pid in [p.pid for p in sbx.commands.list()], sbx.commands.list()
line = sbx.commands.run("head -n 1", background=True, stdin=True)
sbx.commands.send_stdin(line.pid, "fed\n")
assert line.wait().stdout == "fed\n"
assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
try:
    sbx.commands.run("sleep 30", timeout=2)
    raise AssertionError("a command past its timeout did not raise")
except TimeoutException:
    pass
sleeper = sbx.commands.run("sleep 600", background=True)
assert sleeper.kill() is True
try:
    sleeper.wait()
    raise AssertionError("a killed command ended well")
except CommandExitException as e:
    assert e.exit_code != 0, e
assert sleeper.pid not in [p.pid for p in sbx.commands.list()]
assert sbx.commands.kill(cat.pid) is True
info = sbx.get_info()
assert info.sandbox_id == sbx.sandbox_id and info.template_id == TEMPLATE and info.metadata["team"] == "a b", info
assert info.state.value == "running", info
listed = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"team": "a b"})).next_items()]
assert listed == [sbx.sandbox_id], listed
assert Sandbox.list(query=SandboxQuery(metadata={"team": "nobody"})).next_items() == []
sbx.set_timeout(300)
assert sbx.pause() is True
assert Sandbox.get_info(sbx.sandbox_id).state.value == "paused"
assert [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()] == [sbx.sandbox_id]
resumed = Sandbox.connect(sbx.sandbox_id)
assert resumed.files.read("/tmp/a.txt") == "one", "the resumed sandbox has its files"
assert resumed.commands.run("echo back").stdout == "back\n"
# A terminal: made, resized, typed into, its output as it comes; and a running command
# joined by pid (its output from then on).
term = resumed.pty.create(PtySize(rows=24, cols=80))
resumed.pty.resize(term.pid, PtySize(rows=30, cols=100))
resumed.pty.send_stdin(term.pid, b"stty size; echo pty-$((6*7)); exit\n")
chunks = []
term.wait(on_pty=lambda data: chunks.append(bytes(data)))
shown = b"".join(chunks).decode(errors="replace")
assert "pty-42" in shown and "30 100" in shown, shown
later = resumed.commands.run("sleep 1; echo joined", background=True)
assert resumed.commands.connect(later.pid).wait().stdout == "joined\n"
a_id = resumed.sandbox_id
a_token = resumed._envd_access_token
# get_host(port): a server the sandbox started, reached at the host name the SDK makes (a
# name of farm's port listener: `{port}-{id}.{key}.localhost:PORT`, which a browser resolves
# to loopback; here the request goes to 127.0.0.1 with that name as its Host).
resumed.commands.run("python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp", background=True)
a_host = resumed.get_host(8000)
assert a_host.startswith(f"8000-{a_id}."), a_host
listener = a_host.rsplit(":", 1)[1]


def through(host):
    return httpx.get(f"http://127.0.0.1:{listener}/a.txt", headers={"Host": host}, timeout=30)


for _ in range(300):  # a wait for the server to listen, not a claim on its speed
    served = through(a_host)
    if served.status_code == 200:
        break
    time.sleep(0.2)
assert served.status_code == 200 and served.text == "one", (served.status_code, served.text)
nothing = through(resumed.get_host(8001))
assert nothing.status_code == 502, (nothing.status_code, nothing.text)
# Signed file URLs (download_url, upload_url): a plain client with no header at all; the
# signature (of the path, the operation, the user and the expiry, with the sandbox's token)
# names the sandbox.
plain = httpx.Client(timeout=60)
assert plain.get(resumed.download_url("/tmp/a.txt")).content == b"one"
uploaded = plain.post(resumed.upload_url("/tmp/up.txt"), files={"file": ("any-name.txt", b"uploaded")})
assert uploaded.status_code == 200, (uploaded.status_code, uploaded.text)
assert resumed.files.read("/tmp/up.txt") == "uploaded"
assert plain.get(resumed.download_url("/tmp/a.txt", use_signature_expiration=600)).content == b"one"


def signed(path, operation, expiration=None, token=a_token, **extra):
    raw = f"{path}:{operation}::{token}" + (f":{expiration}" if expiration is not None else "")
    signature = "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
    query = {"path": path, "signature": signature, **extra}
    if expiration is not None:
        query["signature_expiration"] = str(expiration)
    return URL + "/files?" + urllib.parse.urlencode(query)


assert plain.get(signed("/tmp/a.txt", "read")).content == b"one", "the test signs as the SDK does"
read_url = signed("/tmp/a.txt", "read")
signed_refusals = {
    # Another path under the signature of /tmp/a.txt.
    "other_path": plain.get(read_url.replace(urllib.parse.quote("/tmp/a.txt", safe=""), urllib.parse.quote("/etc/shadow", safe=""))),
    # A second path after the signed one (the handler and the check read one value a key).
    "two_paths": plain.get(read_url + "&path=%2Fetc%2Fshadow"),
    # A read URL used to write.
    "read_as_write": plain.post(read_url, files={"file": ("a.txt", b"overwritten")}),
    # Expired.
    "expired": plain.get(signed("/tmp/a.txt", "read", int(time.time()) - 5)),
    # An upload with no path (its parts would name where to write).
    "no_path": plain.post(signed("", "write"), files={"file": ("/tmp/a.txt", b"overwritten")}),
    # A forged signature, and one made with a tenant's key.
    "forged": plain.get(signed("/tmp/a.txt", "read", token=a_token[:-1] + ("0" if a_token[-1] != "0" else "1"))),
    "key_signed": plain.get(signed("/tmp/a.txt", "read", token=A_KEY)),
}
statuses = {name: r.status_code for name, r in signed_refusals.items()}
assert all(code in (400, 401) for code in statuses.values()), statuses
assert all(r.content != b"one" and a_id not in r.text for r in signed_refusals.values()), statuses
assert resumed.files.read("/tmp/a.txt") == "one", "no refused upload wrote"
seen["signed"] = "ok"
# E2B's fork (farm's branch: memory, processes and files as they are) and snapshot (a farm
# environment, the template of later creates), where the SDK has them (2.63, not 2.45).
if hasattr(resumed, "fork"):
    origin = Sandbox.create(template=TEMPLATE)
    origin.files.write("/tmp/state", "before")
    forks = origin.fork(count=2)
    assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks
    assert len({f.sandbox_id for f in forks} | {origin.sandbox_id}) == 3
    assert [f.files.read("/tmp/state") for f in forks] == ["before", "before"]
    forks[0].files.write("/tmp/state", "diverged")
    assert forks[1].files.read("/tmp/state") == "before" and origin.files.read("/tmp/state") == "before"
    for f in forks:
        assert f.kill() is True
    snap = origin.create_snapshot()
    assert snap.snapshot_id, snap
    from_snap = Sandbox.create(template=snap.snapshot_id)
    assert from_snap.files.read("/tmp/state") == "before", "a create of the snapshot has its files"
    assert from_snap.kill() is True and origin.kill() is True
    seen["fork"] = "ok"
seen["sync"] = "ok"

# --- B: A's sandbox is a sandbox that never was, whatever B calls.
b_env = dict(api_key=as_e2b(B_KEY))
for call in (lambda: Sandbox.connect(a_id, **b_env), lambda: Sandbox.get_info(a_id, **b_env)):
    try:
        call()
        raise AssertionError("B reached A's sandbox")
    except NotFoundException:
        pass
assert Sandbox.kill(a_id, **b_env) is False, "B killed A's sandbox"
if hasattr(Sandbox, "fork"):
    try:
        Sandbox.fork(a_id, **b_env)
        raise AssertionError("B forked A's sandbox")
    except NotFoundException:
        pass
assert [s.sandbox_id for s in Sandbox.list(**b_env).next_items()] == []
b_sbx = Sandbox.create(template=TEMPLATE, **b_env)
# Another sandbox's host key, a forged one, or A's key for B's sandbox opens no port.
a_key_label = a_host.split(".")[1]
b_key_label = b_sbx.get_host(8000).split(".")[1]
assert a_key_label != b_key_label
for host in (
    a_host.replace(a_key_label, b_key_label),
    a_host.replace(a_key_label, a_key_label[:-1] + ("0" if a_key_label[-1] != "0" else "1")),
    a_host.replace(a_id, b_sbx.sandbox_id),
    a_host.replace(a_key_label, a_token[:32]),
):
    refused = through(host)
    assert refused.status_code == 404 and "one" not in refused.text, (host, refused.status_code, refused.text)
seen["b"] = "ok"

# --- By hand: a sandbox's access token opens its own in-sandbox routes and nothing else.
http = httpx.Client(base_url=URL, timeout=60)


def envd(sandbox, token, path="/files", **kw):
    headers = {"E2b-Sandbox-Id": sandbox, "E2b-Sandbox-Port": "49983"}
    if token is not None:
        headers["X-Access-Token"] = token
    headers.update(kw.pop("headers", {}))
    return http.request(kw.pop("method", "GET"), path, headers=headers, **kw)


def envelope(message):
    body = json.dumps(message).encode()
    return b"\x00" + len(body).to_bytes(4, "big") + body


assert envd(a_id, a_token, params={"path": "/tmp/a.txt"}).content == b"one"
refusals = {
    # A's token, B's sandbox (file read, and a process started in it).
    "a_token_b_sandbox": envd(b_sbx.sandbox_id, a_token, params={"path": "/etc/hostname"}),
    "a_token_b_start": envd(
        b_sbx.sandbox_id,
        a_token,
        "/process.Process/Start",
        method="POST",
        content=envelope({"process": {"cmd": "/bin/true"}}),
        headers={"Content-Type": "application/connect+json"},
    ),
    # No token, a forged one, a tenant's key in its place.
    "no_token": envd(a_id, None, params={"path": "/tmp/a.txt"}),
    "forged": envd(a_id, a_token[:-1] + ("0" if a_token[-1] != "0" else "1"), params={"path": "/tmp/a.txt"}),
    "key_as_token": envd(a_id, A_KEY, params={"path": "/tmp/a.txt"}),
    "api_key_header": envd(a_id, None, params={"path": "/tmp/a.txt"}, headers={"X-API-KEY": as_e2b(A_KEY)}),
    # The token on farm's own API, and on E2B's REST API: it is no key.
    "token_on_farm_api": http.post(
        f"/v1/sandboxes/{a_id}/exec",
        json={"command": "cat /tmp/a.txt"},
        headers={"X-Access-Token": a_token, "E2b-Sandbox-Id": a_id},
    ),
    "token_on_rest_api": http.get(f"/sandboxes/{a_id}", headers={"X-Access-Token": a_token, "E2b-Sandbox-Id": a_id}),
}
statuses = {name: r.status_code for name, r in refusals.items()}
assert all(code == 401 for code in statuses.values()), statuses
for name, r in refusals.items():
    body = r.json()
    # E2B's routes answer in E2B's error shape (farm's own API in its own), naming no sandbox.
    text = body["error"] if name == "token_on_farm_api" else body["message"]
    assert name == "token_on_farm_api" or isinstance(body.get("code"), (int, str)), (name, body)
    assert a_id not in text and b_sbx.sandbox_id not in text, (name, body)
# A watcher is its sandbox's: B's sandbox, with B's own token, cannot poll or remove A's.
a_watcher = resumed.files.watch_dir("/tmp")
b_token = b_sbx._envd_access_token
for rpc in ("GetWatcherEvents", "RemoveWatcher"):
    r = envd(b_sbx.sandbox_id, b_token, f"/filesystem.Filesystem/{rpc}", method="POST", json={"watcherId": a_watcher._watcher_id})
    assert r.status_code == 404 and r.json()["code"] == "not_found", (rpc, r.status_code, r.text)
a_watcher.stop()
# Every body is read strictly, once: a key twice, or bytes after the value, is refused (two
# readers could take it differently).
twice = http.post(
    "/v2/sandboxes",
    content=b'{"templateID": "%s", "templateID": "base"}' % TEMPLATE.encode(),
    headers={"X-API-KEY": as_e2b(A_KEY), "Content-Type": "application/json"},
)
assert twice.status_code == 400 and twice.json()["code"] == 400, (twice.status_code, twice.text)
trailing = envd(
    a_id,
    a_token,
    "/filesystem.Filesystem/Stat",
    method="POST",
    content=b'{"path": "/tmp/a.txt"} {"path": "/etc/shadow"}',
    headers={"Content-Type": "application/json"},
)
assert trailing.status_code == 400 and trailing.json()["code"] == "invalid_argument", (trailing.status_code, trailing.text)
dup_rpc = envd(
    a_id,
    a_token,
    "/filesystem.Filesystem/Stat",
    method="POST",
    content=b'{"path": "/tmp/a.txt", "path": "/etc/shadow"}',
    headers={"Content-Type": "application/json"},
)
assert dup_rpc.status_code == 400, (dup_rpc.status_code, dup_rpc.text)
bad = envd(a_id, a_token, "/process.Process/Start", method="POST", content=b"\x00\x00\x00", headers={"Content-Type": "application/connect+json"})
assert bad.status_code == 400 and bad.json()["code"] == "invalid_argument", (bad.status_code, bad.text)
seen["refusals"] = statuses

# --- A create naming no template: E2B's `base`, an environment of `[serve.e2b] templates`
# (the python image by default) made for the caller on first use.
default = Sandbox.create()
assert default.commands.run("python3 -c 'print(6 * 7)'").stdout == "42\n"
assert default.kill() is True
seen["base"] = "ok"

# --- The async client.


async def main():
    a = await AsyncSandbox.create(template=TEMPLATE)
    out = await a.commands.run("echo async")
    await a.files.write("/tmp/c", b"async bytes")
    got = await a.files.read("/tmp/c", format="bytes")
    assert out.stdout == "async\n" and bytes(got) == b"async bytes", (out, got)
    assert (await a.get_info()).state.value == "running"
    # The async client's watcher: a stream of the folder's changes.
    await a.files.make_dir("/tmp/aw")
    got = []
    handle = await a.files.watch_dir("/tmp/aw", on_event=got.append)
    await a.files.write("/tmp/aw/f", "x")
    for _ in range(200):  # a wait for the event, not a claim on its speed
        if ("f", "create") in {(e.name, e.type.value) for e in got}:
            break
        await asyncio.sleep(0.1)
    assert ("f", "create") in {(e.name, e.type.value) for e in got}, got
    await handle.stop()
    assert await a.kill() is True


asyncio.run(main())
seen["async"] = "ok"

# --- Volumes (farm's workspaces): what a sandbox wrote there is kept when it is killed, and
# the next sandbox mounting it finds it; one writer at a time.
from e2b import Volume  # noqa: E402

vol = Volume.create("e2b-data")
assert "e2b-data" in [v.name for v in Volume.list()]
writer = Sandbox.create(template=TEMPLATE, volume_mounts={"/data": vol})
writer.files.write("/data/kept.txt", "kept")
try:
    Sandbox.create(template=TEMPLATE, volume_mounts={"/data": vol})
    raise AssertionError("a second writer was let in")
except Exception as e:  # the SDK's exception for a 409
    assert "held writable" in str(e), e
assert writer.kill() is True
reader = Sandbox.create(template=TEMPLATE, volume_mounts={"/data": "e2b-data"})
assert reader.files.read("/data/kept.txt") == "kept"
assert reader.kill() is True
assert Volume.destroy(vol.volume_id) is True
assert Volume.destroy(vol.volume_id) is False, "a destroyed volume is gone"
seen["volumes"] = "ok"

assert resumed.kill() is True
assert Sandbox.kill(a_id) is False, "a killed sandbox is gone"
assert b_sbx.kill() is True
print(json.dumps(seen))
