"""The sandbox API's requests, built once for the sync and the async client.

Bodies leave out what the caller did not give: the service refuses unknown fields and fills
in its own defaults.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union
from urllib.parse import quote

from ._http import Call, new_key
from .errors import WaitTimeout
from .models import Environment, LogPage

#: A shell command line (`/bin/sh -c`), or a program and its arguments.
Command = Union[str, Sequence[str]]
#: An environment, or its id.
EnvironmentRef = Union[Environment, str]

TAR = "application/x-tar"
_BYTES = "application/octet-stream"
_EVENTS = "text/event-stream"
#: The service's exec timeout when a call gives none (seconds).
EXEC_TIMEOUT_DEFAULT = 600
#: Longest hold asked of `/logs` at a time while waiting for a build (seconds).
LOG_POLL_SECS = 30


def _id(value: str) -> str:
    return quote(value, safe="")


def _given(**fields: Any) -> Dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _secs(value: Optional[float]) -> Optional[int]:
    return None if value is None else int(math.ceil(value))


def environment_id(environment: EnvironmentRef) -> str:
    return environment.id if isinstance(environment, Environment) else environment


# Environments.


def create_context(archive: bytes) -> Call:
    return Call("POST", "/v1/contexts", content=archive, content_type=TAR, idempotency_key=new_key())


def environment_options(
    cpus: Optional[int], memory_mib: Optional[int], disk_mib: Optional[int], setup: Optional[Sequence[str]], force: bool
) -> Dict[str, Any]:
    return _given(
        cpus=cpus,
        memory_mib=memory_mib,
        disk_mib=disk_mib,
        setup=list(setup) if setup is not None else None,
        force=True if force else None,
    )


def create_environment(source: Mapping[str, Any], options: Mapping[str, Any]) -> Call:
    """`source` is `{"image": ...}` or `{"dockerfile": ...}`; `options` as `environment_options`."""
    return Call("POST", "/v1/environments", json=dict(source, **options), idempotency_key=new_key())


def dockerfile_path(context_dir: str, dockerfile: str) -> str:
    """The Dockerfile's path in its build context, checked: `dockerfile` is relative to
    `context_dir`, or absolute inside it."""
    root = os.path.abspath(context_dir)
    path = os.path.join(root, dockerfile)
    relative = os.path.relpath(path, root)
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        raise ValueError(f"the Dockerfile {dockerfile} is outside the build context {context_dir}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no Dockerfile {path}")
    return relative.replace(os.sep, "/")


def dockerfile_spec(
    context: str, path: str, build_args: Optional[Mapping[str, str]], target: Optional[str]
) -> Dict[str, Any]:
    """The `dockerfile` object of an environment whose build context was uploaded as `context`."""
    return _given(
        context=context,
        path=path,
        build_args=dict(build_args) if build_args is not None else None,
        target=target,
    )


def get_environment(environment_id: str) -> Call:
    return Call("GET", f"/v1/environments/{_id(environment_id)}")


def list_environments() -> Call:
    return Call("GET", "/v1/environments")


def delete_environment(environment_id: str) -> Call:
    return Call("DELETE", f"/v1/environments/{_id(environment_id)}")


def environment_logs(environment_id: str, offset: int, wait: float) -> Call:
    secs = _secs(wait) or 0
    return Call(
        "GET",
        f"/v1/environments/{_id(environment_id)}/logs",
        params={"offset": offset, "wait": secs},
        wait=secs,
    )


def log_page(answer: Any) -> LogPage:
    lines = [str(line) for line in answer.get("lines") or []]
    return lines, int(answer.get("next", 0)), str(answer.get("state", ""))


def listed(answer: Any, key: str) -> List[Any]:
    items = answer.get(key) if isinstance(answer, dict) else None
    return list(items) if isinstance(items, list) else []


class BuildWait:
    """How a wait for an environment's build goes on: the log offset reached, how long the
    next poll may hold, and when it is over."""

    def __init__(self, environment_id: str, timeout: Optional[float]) -> None:
        self.environment_id = environment_id
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.offset = 0
        self.ended = False

    def poll_secs(self) -> int:
        """The `wait` of the next `/logs` poll (0 once the build ended: only lines are left)."""
        if self.ended:
            return 0
        if self.deadline is None:
            return LOG_POLL_SECS
        return max(1, min(LOG_POLL_SECS, int(math.ceil(self.deadline - time.monotonic()))))

    def done(self, lines: List[str], next_offset: int, state: str) -> bool:
        """Takes a page; whether every line was read and the build ended. Raises
        `WaitTimeout` past the deadline while it builds."""
        self.offset = next_offset
        self.ended = state != "building"
        if self.ended:
            return not lines
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise WaitTimeout(f"environment {self.environment_id} is still building after {self.timeout} s")
        return False


# Sandboxes.


def create_sandbox(environment: EnvironmentRef, options: Mapping[str, Any]) -> Call:
    body = dict(_given(**options), environment=environment_id(environment))
    return Call("POST", "/v1/sandboxes", json=body, idempotency_key=new_key())


def sandbox_options(
    env: Optional[Mapping[str, str]],
    workdir: Optional[str],
    user: Optional[str],
    network: Optional[str],
    disk_mib: Optional[int],
    idle_timeout_secs: Optional[int],
    lifetime_secs: Optional[int],
    cpus: Optional[int],
    memory_mib: Optional[int],
    metadata: Optional[Mapping[str, str]],
    keep: Optional[Mapping[str, Any]] = None,
    on_timeout: Optional[str] = None,
    workspaces: Optional[Sequence[Mapping[str, Any]]] = None,
) -> Dict[str, Any]:
    return _given(
        env=dict(env) if env is not None else None,
        workdir=workdir,
        user=user,
        network=network,
        disk_mib=disk_mib,
        idle_timeout_secs=idle_timeout_secs,
        lifetime_secs=lifetime_secs,
        cpus=cpus,
        memory_mib=memory_mib,
        metadata=dict(metadata) if metadata is not None else None,
        keep=dict(keep) if keep is not None else None,
        on_timeout=on_timeout,
        workspaces=[dict(w) for w in workspaces] if workspaces is not None else None,
    )


def get_sandbox(sandbox_id: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{_id(sandbox_id)}")


def delete_sandbox(sandbox_id: str) -> Call:
    return Call("DELETE", f"/v1/sandboxes/{_id(sandbox_id)}")


def sandbox_action(sandbox_id: str, action: str) -> Call:
    """`branch` and `snapshot` make something (so they carry a key); `pause`, `resume` and
    `checkpoint` answer the same when repeated."""
    key = new_key() if action in ("branch", "snapshot") else None
    return Call("POST", f"/v1/sandboxes/{_id(sandbox_id)}/{action}", json={}, idempotency_key=key)


def program(command: Command) -> Dict[str, Any]:
    """What runs, as exec and a background process take it: `{"command"}` for a shell
    string, `{"argv"}` for a program and its arguments."""
    if isinstance(command, str):
        return {"command": command}
    argv = list(command)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("an argv command must be a non-empty list of strings")
    return {"argv": argv}


def run_body(
    command: Command, cwd: Optional[str], env: Optional[Mapping[str, str]], user: Optional[str], **more: Any
) -> Dict[str, Any]:
    """The body of a request that runs `command` (an exec, a background process): the
    `program`, then `cwd`, `env`, `user` and the request's own fields `more`, those given."""
    body = program(command)
    body.update(_given(cwd=cwd, env=dict(env) if env is not None else None, user=user, **more))
    return body


def exec_call(
    sandbox_id: str,
    command: Command,
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    user: Optional[str],
    timeout: Optional[float],
    stdin: Union[str, bytes, None],
    max_output_bytes: Optional[int],
    *,
    stream: bool,
) -> Call:
    """An exec, whole or streamed. Never sent again once it may have reached the service (the
    command may have run); a 429 or 503 is retried (it was refused before running)."""
    if isinstance(stdin, bytes):
        try:
            stdin = stdin.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError("stdin must be UTF-8 text: the exec API carries it as a JSON string") from e
    timeout_secs = _secs(timeout)
    body = run_body(command, cwd, env, user, timeout_secs=timeout_secs, stdin=stdin, max_output_bytes=max_output_bytes)
    suffix = "/exec/stream" if stream else "/exec"
    return Call(
        "POST",
        f"/v1/sandboxes/{_id(sandbox_id)}{suffix}",
        json=body,
        accept=_EVENTS if stream else None,
        resend=False,
        wait=timeout_secs if timeout_secs is not None else EXEC_TIMEOUT_DEFAULT,
    )


def write_file(sandbox_id: str, path: str, data: bytes, mode: int) -> Call:
    return Call(
        "PUT",
        f"/v1/sandboxes/{_id(sandbox_id)}/files",
        params={"path": path, "mode": format(mode, "o")},
        content=data,
        content_type=_BYTES,
    )


def read_file(sandbox_id: str, path: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{_id(sandbox_id)}/files", params={"path": path})


def put_folder(sandbox_id: str, path: str, archive: bytes) -> Call:
    return Call(
        "PUT", f"/v1/sandboxes/{_id(sandbox_id)}/folders", params={"path": path}, content=archive, content_type=TAR
    )


def get_folder(sandbox_id: str, path: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{_id(sandbox_id)}/folders", params={"path": path}, accept=TAR)


def local_mode(path: str, mode: Optional[int]) -> int:
    """`mode`, or the permission bits of the local file `path`."""
    return mode if mode is not None else os.stat(path).st_mode & 0o777
