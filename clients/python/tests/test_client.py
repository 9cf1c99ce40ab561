"""The sync client's requests, answers, errors and retries, against a scripted service."""

import io
import json
import os
import tarfile

import httpx
import pytest

from farm_sdk import (
    BadRequest,
    BuildError,
    Busy,
    Conflict,
    ConnectionFailed,
    Environment,
    ExecResult,
    Farm,
    FarmError,
    NotFound,
    PayloadTooLarge,
    Sandbox,
    SandboxInfo,
    ServerError,
    Unauthorized,
    UnsafeArchive,
    WaitTimeout,
)
from mock_farm import ENV, SANDBOX, URL, MockFarm, body, error, tar_of


def test_url_and_token_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("FARM_URL", "http://elsewhere.test:9000/")
    monkeypatch.setenv("FARM_SERVE_TOKEN", "s3cret")
    server = MockFarm().on("GET", "/v1/environments", httpx.Response(200, json={"environments": [ENV]}))
    farm = Farm(transport=server.transport())
    assert farm.url == "http://elsewhere.test:9000"
    [env] = farm.environments.list()
    request = server.requests[0]
    assert str(request.url) == "http://elsewhere.test:9000/v1/environments"
    assert request.headers["Authorization"] == "Bearer s3cret"
    assert request.headers["User-Agent"].startswith("farm-sdk-python/")
    assert env == Environment.from_json(ENV)


def test_the_default_url_and_no_token(monkeypatch):
    monkeypatch.delenv("FARM_URL", raising=False)
    monkeypatch.delenv("FARM_SERVE_TOKEN", raising=False)
    server = MockFarm().on("GET", "/v1/sandboxes", httpx.Response(200, json={"sandboxes": [SANDBOX]}))
    farm = Farm(transport=server.transport())
    assert farm.url == "http://127.0.0.1:8765"
    assert [s.id for s in farm.sandboxes.list()] == ["sb-1"]
    assert "Authorization" not in server.requests[0].headers


def test_models_keep_unknown_fields_and_tolerate_missing_ones():
    env = Environment.from_json(dict(ENV, new_field=[1, 2]))
    assert env.ready and env.snapshot == "snap-1" and env.raw["new_field"] == [1, 2]
    info = SandboxInfo.from_json({"id": "sb-2", "extra": True})
    assert info.id == "sb-2" and info.state == "" and info.cpus is None and info.raw["extra"] is True
    result = ExecResult.from_json({"exit_code": 0, "stdout": "hi\n", "future": 1})
    assert result.ok and result.stdout == "hi\n" and not result.timed_out
    assert not ExecResult.from_json({"exit_code": None, "timed_out": True}).ok
    assert not ExecResult.from_json({"exit_code": 3}).ok


def test_an_existing_environment_is_returned_without_waiting():
    server = MockFarm().on("POST", "/v1/environments", httpx.Response(200, json=ENV))
    env = server.farm().environments.create(image="python:3.12-slim", cpus=2, setup=["mkdir -p /logs"])
    assert env.id == "env-1" and env.ready
    assert server.paths() == ["POST /v1/environments"]
    assert body(server.requests[0]) == {"image": "python:3.12-slim", "cpus": 2, "setup": ["mkdir -p /logs"]}
    assert server.requests[0].headers["Idempotency-Key"]


def test_a_build_is_waited_for_through_its_logs():
    building = dict(ENV, state="building", snapshot=None)
    server = (
        MockFarm()
        .on("POST", "/v1/environments", httpx.Response(202, json=building))
        .on(
            "GET",
            "/v1/environments/env-1/logs",
            httpx.Response(200, json={"lines": ["FROM python:3.12-slim"], "next": 1, "state": "building"}),
            httpx.Response(200, json={"lines": ["RUN pip install x"], "next": 2, "state": "ready"}),
            httpx.Response(200, json={"lines": [], "next": 2, "state": "ready"}),
        )
        .on("GET", "/v1/environments/env-1", httpx.Response(200, json=ENV))
    )
    lines = []
    env = server.farm().environments.create(image="python:3.12-slim", force=True, on_log=lines.append)
    assert env.ready and env.snapshot == "snap-1"
    assert lines == ["FROM python:3.12-slim", "RUN pip install x"]
    assert body(server.requests[0]) == {"image": "python:3.12-slim", "force": True}
    polls = [dict(r.url.params) for r in server.sent("GET", "/v1/environments/env-1/logs")]
    assert polls == [{"offset": "0", "wait": "30"}, {"offset": "1", "wait": "30"}, {"offset": "2", "wait": "0"}]
    # A long poll may hold the answer: the read timeout covers it.
    assert server.requests[1].extensions["timeout"]["read"] == 600 + 30


def test_a_failed_build_raises_build_error_with_where_it_failed():
    failed = dict(
        ENV,
        state="failed",
        snapshot=None,
        error={"message": "a step failed", "dockerfile_line": 7, "instruction": "RUN make",
               "output_tail": "make: *** no rule to make target"},
    )
    server = (
        MockFarm()
        .on("POST", "/v1/environments", httpx.Response(202, json=dict(ENV, state="building")))
        .on("GET", "/v1/environments/env-1/logs", httpx.Response(200, json={"lines": [], "next": 0, "state": "failed"}))
        .on("GET", "/v1/environments/env-1", httpx.Response(200, json=failed))
    )
    with pytest.raises(BuildError) as caught:
        server.farm().environments.create(image="python:3.12-slim")
    e = caught.value
    assert isinstance(e, FarmError)
    assert (e.dockerfile_line, e.instruction, e.output_tail) == (7, "RUN make", "make: *** no rule to make target")
    assert e.environment.id == "env-1" and e.environment.failed
    assert "env-1 failed to build: a step failed (Dockerfile line 7: RUN make)" in str(e)
    assert "no rule to make target" in str(e)


def test_an_answer_that_is_already_failed_raises_when_waiting_only():
    failed = dict(ENV, state="failed", error={"message": "bad image"})
    server = MockFarm().on("POST", "/v1/environments", httpx.Response(200, json=failed))
    with pytest.raises(BuildError, match="bad image"):
        server.farm().environments.create(image="nope:1")
    assert server.farm().environments.create(image="nope:1", wait=False).failed


def test_waiting_past_the_timeout_raises_wait_timeout():
    server = (
        MockFarm()
        .on("POST", "/v1/environments", httpx.Response(202, json=dict(ENV, state="building")))
        .on("GET", "/v1/environments/env-1/logs", httpx.Response(200, json={"lines": [], "next": 0, "state": "building"}))
    )
    with pytest.raises(WaitTimeout) as caught:
        server.farm().environments.create(image="python:3.12-slim", timeout=0)
    assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, FarmError)


def test_env_wait_and_logs_from_the_environment_object():
    server = (
        MockFarm()
        .on("GET", "/v1/environments/env-1", httpx.Response(200, json=dict(ENV, state="building")), httpx.Response(200, json=ENV))
        .on("GET", "/v1/environments/env-1/logs", httpx.Response(200, json={"lines": ["a", "b"], "next": 2, "state": "ready"}),
            httpx.Response(200, json={"lines": [], "next": 2, "state": "ready"}))
    )
    farm = server.farm()
    env = farm.environments.get("env-1")
    assert env.building
    assert env.logs(offset=0, wait=5) == (["a", "b"], 2, "ready")
    assert dict(server.requests[1].url.params) == {"offset": "0", "wait": "5"}
    assert env.wait() is env and env.ready and env.snapshot == "snap-1"


def test_from_dockerfile_uploads_the_context_then_creates(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY app.py /app/\n")
    (tmp_path / "app.py").write_text("print(1)\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(tmp_path / "sub" / "run.sh", 0o755)
    server = (
        MockFarm()
        .on("POST", "/v1/contexts", httpx.Response(201, json={"context": "ctx-3b1f", "files": 3, "bytes": 10240}))
        .on("POST", "/v1/environments", httpx.Response(200, json=ENV))
    )
    env = server.farm().environments.from_dockerfile(
        str(tmp_path), build_args={"V": "1"}, target="app", memory_mib=2048
    )
    assert env.id == "env-1"
    upload, create = server.requests
    assert upload.headers["Content-Type"] == "application/x-tar" and upload.headers["Idempotency-Key"]
    with tarfile.open(fileobj=io.BytesIO(upload.content)) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["Dockerfile", "app.py", "sub", "sub/run.sh"]
        assert all(m.mtime == 0 for m in members)
        assert tar.getmember("sub/run.sh").mode == 0o755
        assert tar.extractfile("app.py").read() == b"print(1)\n"
    assert body(create) == {
        "dockerfile": {"context": "ctx-3b1f", "path": "Dockerfile", "build_args": {"V": "1"}, "target": "app"},
        "memory_mib": 2048,
    }
    assert create.headers["Idempotency-Key"] != upload.headers["Idempotency-Key"]


def test_from_dockerfile_checks_the_context_before_uploading(tmp_path):
    server = MockFarm()
    farm = server.farm()
    with pytest.raises(FileNotFoundError):
        farm.environments.from_dockerfile(str(tmp_path))
    (tmp_path / "Dockerfile").write_text("FROM python\n")
    with pytest.raises(ValueError, match="outside the build context"):
        farm.environments.from_dockerfile(str(tmp_path), dockerfile="../Dockerfile")
    os.symlink("Dockerfile", tmp_path / "link")
    with pytest.raises(ValueError, match="is a link"):
        farm.environments.from_dockerfile(str(tmp_path))
    assert server.requests == []


def test_environment_get_and_delete():
    server = MockFarm().on("DELETE", "/v1/environments/env-1", httpx.Response(200, json={})).on(
        "DELETE", "/v1/environments/env-2", error(409, "a sandbox made from it is live")
    )
    farm = server.farm()
    farm.environments.delete("env-1")
    with pytest.raises(Conflict, match="a sandbox made from it is live"):
        farm.environments.delete("env-2")


def test_a_sandbox_is_created_with_only_the_options_given():
    server = MockFarm().on("POST", "/v1/sandboxes", httpx.Response(201, json=SANDBOX))
    farm = server.farm()
    sb = farm.sandboxes.create(Environment.from_json(ENV), env={"API": "x"}, network="pypi", metadata={"trial": "7"})
    assert isinstance(sb, Sandbox) and sb.id == "sb-1"
    assert body(server.requests[0]) == {"environment": "env-1", "env": {"API": "x"}, "network": "pypi",
                                        "metadata": {"trial": "7"}}
    Sandbox.create("env-9", farm=farm, idle_timeout_secs=300)
    assert body(server.requests[1]) == {"environment": "env-9", "idle_timeout_secs": 300}
    keys = {r.headers["Idempotency-Key"] for r in server.requests}
    assert len(keys) == 2


def test_busy_is_retried_after_retry_after_with_the_same_idempotency_key():
    server = MockFarm().on(
        "POST",
        "/v1/sandboxes",
        error(503, "memory reserve reached", retry_after="2"),
        error(429, "max_sessions live", retry_after="3600"),
        httpx.Response(201, json=SANDBOX),
    )
    sb = server.farm().sandboxes.create("env-1")
    assert sb.id == "sb-1"
    assert len(server.requests) == 3
    assert len({r.headers["Idempotency-Key"] for r in server.requests}) == 1
    assert server.sleeps == [2.0, 60.0]  # Retry-After honoured, and capped


def test_a_transport_error_is_retried_with_the_same_key_and_backoff():
    server = MockFarm().on(
        "POST", "/v1/environments", httpx.ReadError("reset by peer"), httpx.ConnectError("refused"),
        httpx.Response(200, json=ENV),
    )
    server.farm().environments.create(image="python")
    assert len(server.requests) == 3
    assert len({r.headers["Idempotency-Key"] for r in server.requests}) == 1
    assert len(server.sleeps) == 2 and 0.25 <= server.sleeps[0] <= 0.5 and 0.5 <= server.sleeps[1] <= 1.0


def test_retries_end_with_the_last_error():
    server = MockFarm().on("GET", "/v1/sandboxes/sb-1", error(503, "full", retry_after="1"))
    with pytest.raises(Busy) as caught:
        server.farm(retries=2).sandboxes.get("sb-1")
    assert caught.value.retry_after == 1.0 and caught.value.attempts == 3
    assert "(after 3 attempts)" in str(caught.value)
    assert len(server.requests) == 3
    server = MockFarm().on("GET", "/v1/sandboxes/sb-1", httpx.ConnectError("refused"))
    with pytest.raises(ConnectionFailed) as failed:
        server.farm(retries=1).sandboxes.get("sb-1")
    assert not failed.value.sent and "refused" in str(failed.value) and failed.value.status is None
    assert len(server.requests) == 2


def test_retries_zero_sends_once():
    server = MockFarm().on("GET", "/v1/sandboxes/sb-1", error(503, "full"))
    with pytest.raises(Busy):
        server.farm(retries=0).sandboxes.get("sb-1")
    assert len(server.requests) == 1 and server.sleeps == []


def test_a_conflict_on_a_key_being_admitted_is_retried():
    server = MockFarm().on(
        "POST",
        "/v1/sandboxes",
        error(409, "a request with this key is being admitted: retry", field="Idempotency-Key", retry_after="1"),
        httpx.Response(201, json=SANDBOX),
    )
    assert server.farm().sandboxes.create("env-1").id == "sb-1"
    assert server.sleeps == [1.0]
    # A 409 without Retry-After is an answer, not a reason to retry.
    server = MockFarm().on("POST", "/v1/sandboxes", error(409, "the environment is building"))
    with pytest.raises(Conflict):
        server.farm().sandboxes.create("env-1")
    assert len(server.requests) == 1


def test_errors_by_status_carry_the_servers_text():
    cases = [
        (400, BadRequest), (422, BadRequest), (401, Unauthorized), (404, NotFound), (409, Conflict),
        (413, PayloadTooLarge), (429, Busy), (503, Busy), (500, ServerError), (502, ServerError), (418, FarmError),
    ]
    for status, kind in cases:
        server = MockFarm().on("POST", "/v1/sandboxes", error(status, "unknown field `foo`", field="env.foo"))
        with pytest.raises(kind) as caught:
            server.farm(retries=0).sandboxes.create("env-1")
        e = caught.value
        assert (e.status, e.message, e.field, e.method, e.path) == (status, "unknown field `foo`", "env.foo", "POST", "/v1/sandboxes")
        assert str(e) == f"POST /v1/sandboxes: {status} unknown field `foo` (field: env.foo)"
    server = MockFarm().on("GET", "/v1/sandboxes", httpx.Response(502, text="<html>bad gateway</html>"))
    with pytest.raises(ServerError, match="bad gateway"):
        server.farm(retries=0).sandboxes.list()


def test_a_quota_refusal_names_the_quota():
    body = {"error": "over the tenant's quota live: the limit is 2 and 2 is in use",
            "quota": {"name": "live", "limit": 2, "used": 2}}
    server = MockFarm().on("POST", "/v1/sandboxes", httpx.Response(429, json=body))
    with pytest.raises(Busy) as caught:
        server.farm(retries=0).sandboxes.create("env-1")
    assert caught.value.quota == {"name": "live", "limit": 2, "used": 2}
    server = MockFarm().on("POST", "/v1/sandboxes", error(503, "memory"))
    with pytest.raises(Busy) as caught:
        server.farm(retries=0).sandboxes.create("env-1")
    assert caught.value.quota is None


def exec_answer(**fields):
    answer = {"exit_code": 0, "signal": None, "timed_out": False, "stdout": "1\n", "stderr": "",
              "stdout_truncated": False, "stderr_truncated": False, "output_cap_bytes": 1048576, "duration_ms": 412}
    answer.update(fields)
    return httpx.Response(200, json=answer)


def test_exec_sends_a_shell_command_or_an_argv():
    server = MockFarm().on("POST", "/v1/sandboxes/sb-1/exec", exec_answer())
    sb = Sandbox(server.farm(), "sb-1")
    result = sb.exec("pytest -q", cwd="/app", env={"CI": "1"}, user="root", timeout=59.5, stdin=b"in",
                     max_output_bytes=1024)
    assert result.ok and result.stdout == "1\n" and result.duration_ms == 412 and result.output_cap_bytes == 1048576
    assert body(server.requests[0]) == {"command": "pytest -q", "cwd": "/app", "env": {"CI": "1"}, "user": "root",
                                        "timeout_secs": 60, "stdin": "in", "max_output_bytes": 1024}
    assert server.requests[0].extensions["timeout"]["read"] == 600 + 60
    sb.exec(["python3", "-c", "print(1)"])
    assert body(server.requests[1]) == {"argv": ["python3", "-c", "print(1)"]}
    assert "Idempotency-Key" not in server.requests[1].headers
    with pytest.raises(ValueError):
        sb.exec([])
    with pytest.raises(ValueError, match="UTF-8"):
        sb.exec("cat", stdin=b"\xff")


def test_exec_results_that_did_not_exit_cleanly():
    server = MockFarm().on("POST", "/v1/sandboxes/sb-1/exec",
                           exec_answer(exit_code=None, timed_out=True, stdout="x" * 10, stdout_truncated=True))
    result = Sandbox(server.farm(), "sb-1").exec("sleep 1000", timeout=1)
    assert not result.ok and result.timed_out and result.exit_code is None and result.stdout_truncated


def test_exec_is_not_sent_again_once_it_may_have_run():
    server = MockFarm().on("POST", "/v1/sandboxes/sb-1/exec", httpx.ReadError("connection reset"), exec_answer())
    with pytest.raises(ConnectionFailed) as caught:
        Sandbox(server.farm(), "sb-1").exec("make install")
    assert caught.value.sent and len(server.requests) == 1
    server = MockFarm().on("POST", "/v1/sandboxes/sb-1/exec", httpx.ReadTimeout("timed out"), exec_answer())
    with pytest.raises(ConnectionFailed):
        Sandbox(server.farm(), "sb-1").exec("make install")
    assert len(server.requests) == 1


def test_exec_is_retried_when_refused_before_running():
    server = MockFarm().on(
        "POST", "/v1/sandboxes/sb-1/exec", error(503, "memory low", retry_after="1"), httpx.ConnectError("refused"),
        exec_answer(),
    )
    assert Sandbox(server.farm(), "sb-1").exec("true").ok
    assert len(server.requests) == 3 and server.sleeps[0] == 1.0


def test_kill_is_idempotent():
    server = MockFarm().on("DELETE", "/v1/sandboxes/sb-1", httpx.Response(200, json=SANDBOX), error(404, "no such sandbox"))
    sb = Sandbox(server.farm(), "sb-1")
    sb.kill()
    sb.kill()
    assert server.paths() == ["DELETE /v1/sandboxes/sb-1"] * 2
    server = MockFarm().on("DELETE", "/v1/sandboxes/sb-1", error(500, "the VM would not stop"))
    with pytest.raises(ServerError):
        Sandbox(server.farm(), "sb-1").kill()


def test_the_context_manager_kills_on_exit_and_on_exception():
    server = (
        MockFarm()
        .on("POST", "/v1/sandboxes", httpx.Response(201, json=SANDBOX))
        .on("POST", "/v1/sandboxes/sb-1/exec", exec_answer())
        .on("DELETE", "/v1/sandboxes/sb-1", httpx.Response(200, json=SANDBOX))
    )
    farm = server.farm()
    with farm.sandboxes.create("env-1") as sb:
        sb.exec("true")
    assert server.paths()[-1] == "DELETE /v1/sandboxes/sb-1"
    with pytest.raises(KeyError):
        with farm.sandboxes.create("env-1") as sb:
            raise KeyError("boom")
    assert server.paths()[-1] == "DELETE /v1/sandboxes/sb-1"
    assert len(server.sent("DELETE", "/v1/sandboxes/sb-1")) == 2


def test_a_failed_kill_does_not_hide_the_exception_that_left_the_block():
    server = (
        MockFarm()
        .on("POST", "/v1/sandboxes", httpx.Response(201, json=SANDBOX))
        .on("DELETE", "/v1/sandboxes/sb-1", error(500, "cannot stop"))
    )
    farm = server.farm(retries=0)
    with pytest.raises(KeyError):
        with farm.sandboxes.create("env-1"):
            raise KeyError("the real failure")
    with pytest.raises(ServerError):
        with farm.sandboxes.create("env-1"):
            pass


def test_files_write_and_read():
    server = (
        MockFarm()
        .on("PUT", "/v1/sandboxes/sb-1/files", httpx.Response(200, json={}))
        .on("GET", "/v1/sandboxes/sb-1/files", httpx.Response(200, content=b"\x00binary\xff"))
    )
    sb = Sandbox(server.farm(), "sb-1")
    sb.files.write("/app/x.py", "print('é')\n")
    sb.files.write("/app/run.sh", b"#!/bin/sh\n", mode=0o755)
    first, second = server.requests
    assert dict(first.url.params) == {"path": "/app/x.py", "mode": "644"}
    assert first.content == "print('é')\n".encode() and first.headers["Content-Type"] == "application/octet-stream"
    assert dict(second.url.params) == {"path": "/app/run.sh", "mode": "755"}
    assert sb.files.read("/bin/x") == b"\x00binary\xff"
    assert dict(server.requests[2].url.params) == {"path": "/bin/x"}


def test_files_upload_and_download_single_files(tmp_path):
    local = tmp_path / "tool.sh"
    local.write_bytes(b"echo hi\n")
    os.chmod(local, 0o750)
    server = (
        MockFarm()
        .on("PUT", "/v1/sandboxes/sb-1/files", httpx.Response(200, json={}))
        .on("GET", "/v1/sandboxes/sb-1/files", httpx.Response(200, content=b"out"), error(404, "no such file"))
    )
    sb = Sandbox(server.farm(), "sb-1")
    sb.files.upload_file(str(local), "/usr/local/bin/tool")
    assert dict(server.requests[0].url.params) == {"path": "/usr/local/bin/tool", "mode": "750"}
    assert server.requests[0].content == b"echo hi\n"
    sb.files.download_file("/out.txt", str(tmp_path / "new" / "out.txt"))
    assert (tmp_path / "new" / "out.txt").read_bytes() == b"out"
    with pytest.raises(NotFound):
        sb.files.download_file("/missing", str(tmp_path / "missing"))
    assert sorted(os.listdir(tmp_path)) == ["new", "tool.sh"]  # no partial file left


def test_folders_round_trip(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("x = 1\n")
    (src / "top.txt").write_text("top\n")
    os.symlink("pkg/mod.py", src / "alias.py")
    uploaded = {}

    def keep(request):
        uploaded["tar"] = request.content
        return httpx.Response(200, json={})

    server = (
        MockFarm()
        .on("PUT", "/v1/sandboxes/sb-1/folders", keep)
        .on("GET", "/v1/sandboxes/sb-1/folders", lambda r: httpx.Response(200, content=uploaded["tar"]))
    )
    sb = Sandbox(server.farm(), "sb-1")
    sb.files.upload_dir(str(src), "/app")
    put = server.requests[0]
    assert dict(put.url.params) == {"path": "/app"} and put.headers["Content-Type"] == "application/x-tar"
    sb.files.download_dir("/app", str(tmp_path / "copy"))
    assert dict(server.requests[1].url.params) == {"path": "/app"}
    copy = tmp_path / "copy"
    assert (copy / "pkg" / "mod.py").read_text() == "x = 1\n" and (copy / "top.txt").read_text() == "top\n"
    assert os.readlink(copy / "alias.py") == "pkg/mod.py"


def test_download_dir_refuses_an_archive_that_escapes(tmp_path):
    evil = tar_of([(tarfile.TarInfo("ok.txt"), b"fine"), (tarfile.TarInfo("../escaped.txt"), b"gotcha")])
    server = MockFarm().on("GET", "/v1/sandboxes/sb-1/folders", httpx.Response(200, content=evil))
    with pytest.raises(UnsafeArchive, match=r"\.\./escaped\.txt"):
        Sandbox(server.farm(), "sb-1").files.download_dir("/app", str(tmp_path / "dest"))
    assert not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path / "dest" / "ok.txt").exists()  # every name is checked before extracting


def test_branch_pause_resume_snapshot():
    server = (
        MockFarm()
        .on("POST", "/v1/sandboxes/sb-1/branch", httpx.Response(201, json=dict(SANDBOX, id="sb-2")))
        .on("POST", "/v1/sandboxes/sb-1/pause", httpx.Response(200, json=dict(SANDBOX, state="paused")))
        .on("POST", "/v1/sandboxes/sb-1/resume", httpx.Response(200, json=SANDBOX))
        .on("POST", "/v1/sandboxes/sb-1/snapshot", httpx.Response(201, json=dict(ENV, id="env-2")))
        .on("GET", "/v1/sandboxes/sb-1", httpx.Response(200, json=SANDBOX))
    )
    farm = server.farm()
    sb = farm.sandboxes.get("sb-1")
    branch = sb.branch()
    assert isinstance(branch, Sandbox) and branch.id == "sb-2" and branch.farm is farm
    assert sb.pause().state == "paused"
    assert sb.resume().state == "running"
    env = sb.snapshot()
    assert isinstance(env, Environment) and env.id == "env-2" and env.ready
    assert sb.info().environment == "env-1"
    by_path = {r.url.path: r for r in server.requests}
    assert by_path["/v1/sandboxes/sb-1/branch"].headers["Idempotency-Key"]
    assert by_path["/v1/sandboxes/sb-1/snapshot"].headers["Idempotency-Key"]
    assert "Idempotency-Key" not in by_path["/v1/sandboxes/sb-1/pause"].headers
    assert "Idempotency-Key" not in by_path["/v1/sandboxes/sb-1/resume"].headers
    assert json.loads(by_path["/v1/sandboxes/sb-1/pause"].content) == {}


def test_ids_are_quoted_in_paths():
    server = MockFarm().on("GET", "/v1/sandboxes/a/b", httpx.Response(200, json=SANDBOX))  # matched decoded
    server.farm().sandboxes.get("a/b")
    assert server.requests[0].url.raw_path == b"/v1/sandboxes/a%2Fb"


def test_a_base_url_with_a_path_is_kept():
    server = MockFarm().on("GET", "/farm/v1/sandboxes", httpx.Response(200, json={"sandboxes": []}))
    farm = Farm(f"{URL}/farm/", transport=server.transport())
    assert farm.sandboxes.list() == []
    assert str(server.requests[0].url) == f"{URL}/farm/v1/sandboxes"
