"""farm's test harness: the task's tests run here, in a trusted process, against proxies of the
candidate's code, which lives in a separate unprivileged process.

Run by the guest agent as root, in the scoring VM, with the reward file's path on standard
input:

    python3 -I harness.py [--mode function-call] --tests-dir DIR [--workspace WS] --module M --entry-point E [--call-timeout S]
    python3 -I harness.py --mode unit-tests --tests-dir DIR [--workspace WS] --module M [--module M2 ...] [--call-timeout S]

Function-call mode (harness_function_call) runs `check(candidate)` from DIR/problem.json
against the candidate's function E; unit-test mode (harness_unit_tests) runs the pytest or
unittest files in DIR against proxies of the candidate's modules. The order of events is
what keeps the candidate out of reach, in both:

1. The candidate process is forked first, while this process holds nothing secret: not the
   reward path (still unread on stdin, which the child closes), not the tests (still on
   disk, in a folder only root can read). The child drops to the candidate user (uid 1000),
   closes every descriptor but its socket, and waits (harness_candidate).
2. Then this process reads the reward path and the tests, and only then tells the candidate
   process which modules to load.
3. The tests run here, against proxies: only plain data crosses (and references: to the
   tests' functions, to the candidate's objects), rebuilt here as fresh built-in objects,
   with size and depth limits, and each call has a time limit (harness_boundary,
   harness_checker, harness_remote).
4. Only if the tests passed does this process write "1" to the reward file.

Exit codes: 0 passed (reward written), 1 failed, 3 the task cannot be checked through the
isolation boundary, 2 a malformed command line, 75 the scoring VM could not give a fresh
candidate its private view (before any of the candidate's code ran). Reports for farm are JSON lines on standard
output (see harness_boundary), which only this process holds: the candidate's standard
output is this process's standard error, and so is everything the tests print.

Zygote. Starting Python, and forking it, is most of a check's cost in a fresh VM (under
TCG each new VM translates those paths anew). So farm's templates start this file once,
before the snapshot, as a zygote (`--zygote SOCKET [--function-call-only]`, root, socket
mode 0600), which forks
the candidate's process right away (dropped to the candidate user, idle, holding nothing):
every fork of the snapshot inherits both. A check reaches the zygote through `farm-agent
--check-with-zygote`, which hands over its standard input, output and error and gets the
exit status back. In a scoring VM that runs one check, the zygote runs it itself, in either
mode, as main() would, and exits. In a scoring VM that serves many checks one after another
(`[scoring] isolation = "sandbox"`), the zygote stays pristine: for each check it forks a
check process (a session of its own) that forks a fresh candidate process in a private view
of the file system (harness_candidate.enter_private_view) and runs the check. Until a check
arrives, nothing holds anything secret: the reward path and the tests come with the check.
"""

import json
import os
import struct
import sys

# The harness's own modules sit beside this file, in a folder only root can write
# (/usr/local/lib/farm, or the tests folder's copy); `python3 -I` leaves it off the path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness_boundary import report, report_failure, take_report_channel  # noqa: E402
from harness_candidate import PrivateViewFailed, preload_private_view, start_candidate  # noqa: E402

MODES = ("function-call", "unit-tests")


class UsageError(Exception):
    pass


class Options:
    """The command line (parsed by hand: argparse would cost start-up time in every scoring
    VM)."""

    FLAGS = ("--mode", "--tests-dir", "--workspace", "--module", "--entry-point", "--call-timeout")

    def __init__(self, argv):
        values = {"--mode": "function-call", "--workspace": "/workspace", "--call-timeout": "10"}
        self.modules = []
        if len(argv) % 2:
            raise UsageError("arguments come in pairs")
        for flag, value in zip(argv[0::2], argv[1::2]):
            if flag not in self.FLAGS:
                raise UsageError("unknown argument %r" % flag)
            if flag == "--module":
                if not value.isidentifier() or value in self.modules:
                    raise UsageError("a module is a plain name, given once: %r" % value)
                self.modules.append(value)
            else:
                values[flag] = value
        self.mode = values["--mode"]
        if self.mode not in MODES:
            raise UsageError("--mode is function-call or unit-tests")
        if "--tests-dir" not in values or not self.modules:
            raise UsageError("--tests-dir and --module are required")
        if self.mode == "function-call" and ("--entry-point" not in values or len(self.modules) != 1):
            raise UsageError("function-call mode takes one --module and an --entry-point")
        if self.mode == "unit-tests" and "--entry-point" in values:
            raise UsageError("unit-test mode takes no --entry-point")
        self.tests_dir = values["--tests-dir"]
        self.workspace = values["--workspace"]
        self.module = self.modules[0]
        self.entry_point = values.get("--entry-point")
        try:
            self.call_timeout = float(values["--call-timeout"])
        except ValueError:
            raise UsageError("--call-timeout is a number of seconds")


def parse(argv):
    try:
        return Options(argv)
    except UsageError as error:
        print("harness: %s" % error, file=sys.stderr)
        os._exit(2)


def main():
    options = parse(sys.argv[1:])
    # 1. The candidate, before anything secret is in this process.
    candidate = start_candidate(stdio_to_stderr=True)
    os._exit(run_check(options, candidate, candidate_stderr=None))


def run_check(options, candidate, candidate_stderr):
    """Runs one check against a candidate process started by start_candidate; returns the
    exit code. `candidate_stderr`: a descriptor the candidate takes as its standard output
    and error (None: it keeps the one it has)."""
    import socket

    from harness_checker import Connection

    child, sock = candidate
    take_report_channel()
    # 2. Now the secrets: the reward path, then the tests (read by the mode).
    reward_path = sys.stdin.readline().strip()
    sys.stdin.close()
    if "random" in sys.modules:
        # Seeded before the snapshot (a zygote's), it would be the same in every fork: the
        # tests' random inputs come from this VM's own entropy.
        sys.modules["random"].seed()
    connections = []

    def start_candidate_check(extra, trusted_names):
        request = dict(extra, workspace=options.workspace, modules=options.modules, mode=options.mode)
        try:
            socket.send_fds(sock, [json.dumps(request).encode()], [] if candidate_stderr is None else [candidate_stderr])
        except OSError:
            pass  # a candidate that is gone shows when it does not answer
        connections.append(Connection(sock, child, options.call_timeout, trusted_names))
        return connections[-1]

    # 3. The tests.
    if options.mode == "unit-tests":
        from harness_unit_tests import run
    else:
        from harness_function_call import run
    code = run(options, start_candidate_check)
    for connection in connections:
        connection.kill()
    # 4. The verdict, only after the tests passed.
    if code == 0:
        with open(reward_path, "w") as handle:
            handle.write("1")
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def zygote(socket_path, unit_tests=True):
    """Started once by the template (root), before its snapshot. It forks the candidate's
    process at once (dropped to the candidate user, idle until a check names its modules),
    then serves checks on a unix socket. Neither holds a secret until a check (the reward
    path and the tests arrive with it).

    `unit_tests` False (`--function-call-only`, for a suite with no unit-test task) leaves
    pytest out of the preload: the template starts seconds sooner under TCG, and a unit-test
    check that comes anyway imports what it needs itself.

    The process started exits 0 once the socket listens (1 if the zygote failed): the
    zygote itself is its child, in a session of its own.

    A request is JSON sent with three descriptors (the check's standard input, output and
    error): `{"args": [...], "fork": false}` (or the arguments alone, a list) runs the check
    in this very process against the candidate forked before the snapshot, so a fresh
    scoring VM forks nothing and starts nothing, and the zygote then exits; `"fork": true`
    runs it in a forked check process with a fresh candidate, and the zygote waits for the
    next. The process that runs the check answers with its pid (4 bytes, big endian: the
    session farm kills and sweeps), then its exit status (4 bytes)."""
    ready_read, ready_write = os.pipe()
    if os.fork() != 0:
        os.close(ready_write)
        os._exit(0 if os.read(ready_read, 1) == b"1" else 1)
    os.close(ready_read)
    import socket

    import resource  # what the candidate's process needs, imported once here

    # What HumanEval-style prompts, solutions and tests import most, imported once here for
    # both processes: in a fresh fork under TCG, `from typing import List` alone costs each
    # of them about a quarter of a second. (Not `random`: a generator seeded before the
    # snapshot would be the same in every fork, and in both processes. Not `inspect` or
    # `hashlib`, which few tests use and which cost the template most.)
    import bisect, collections, copy, functools, heapq, itertools, math, operator, re, string, types, typing  # noqa: E401
    import importlib.util  # the candidate's exact-source loader

    del resource, bisect, collections, copy, functools, heapq, itertools, math, operator, re, string, types, typing
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    # The objects made so far live as long as the zygote and its children: the collector
    # need not walk them in every check (a walk also writes to every page they sit on, which
    # each fork of the snapshot would then copy).
    import gc

    gc.freeze()
    candidate = start_candidate(stdio_to_stderr=False)
    preload_checker()
    if unit_tests:
        preload_unit_tests()
    preload_private_view()
    gc.freeze()
    os.makedirs(os.path.dirname(socket_path), mode=0o700, exist_ok=True)
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    server.bind(socket_path)
    os.umask(old_umask)
    os.chmod(socket_path, 0o600)
    server.listen(1)
    os.write(ready_write, b"1")
    os.close(ready_write)
    while True:
        connection, _ = server.accept()
        try:
            message, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
        except OSError:
            connection.close()
            continue
        arguments, fork = check_request(message, fds)
        if arguments is None:
            for fd in fds:
                os.close(fd)
            connection.close()
            continue
        if not fork:
            server.close()
            serve_check(connection, fds, arguments, candidate)
        if candidate is not None:
            # A VM that serves many checks gives each a fresh candidate in a view of its own;
            # the one forked before the snapshot (which has neither) goes.
            kill_quietly(candidate[0])
            candidate[1].close()
            candidate = None
        pid = os.fork()
        if pid == 0:
            server.close()
            os.setsid()
            serve_check(connection, fds, arguments, None)
        for fd in fds:
            os.close(fd)
        connection.close()
        reap_children()


def check_request(message, fds):
    """The arguments and whether to fork, from a check request; (None, False) when it is
    not one."""
    try:
        request = json.loads(message)
    except ValueError:
        return None, False
    if type(request) is list:
        request = {"args": request, "fork": False}
    if type(request) is not dict or len(fds) != 3:
        return None, False
    arguments, fork = request.get("args"), request.get("fork", False)
    if type(arguments) is not list or any(type(a) is not str for a in arguments) or type(fork) is not bool:
        return None, False
    return arguments, fork


def serve_check(connection, fds, arguments, candidate):
    """Runs one check in this process and exits with its code: against `candidate` (the one
    forked before the snapshot), or (None) against a fresh one in a private view."""
    code = 70
    try:
        connection.sendall(struct.pack(">i", os.getpid()))
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        options = parse(arguments)
        if candidate is None:
            candidate = start_candidate(stdio_to_stderr=False, private_view=options.workspace)
        code = run_check(options, candidate, candidate_stderr=2)
    except PrivateViewFailed as error:
        # Nothing of the candidate's ran: farm's failure, said as such.
        take_report_channel()
        report("environment", str(error))
        code = 75
    except BaseException as error:
        report_failure(error)
    finally:
        try:
            connection.sendall(struct.pack(">i", code))
        except OSError:
            pass
        os._exit(code)


def kill_quietly(pid):
    try:
        os.kill(pid, 9)
    except OSError:
        pass


def reap_children():
    """Collects the check processes (and the candidate forked before the snapshot) that
    ended."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def preload_checker():
    """The checker's own modules, imported by the zygote after the candidate's process was
    forked: a check imports them by name, and a module first imported in a fork of the
    snapshot is read and compiled there, under TCG, in every check (no bytecode cache of it
    exists in the template). That was a tenth of a HumanEval rollout."""
    import harness_checker, harness_function_call  # noqa: E401,F401


def preload_unit_tests():
    """pytest and the unit-test modules, imported by the zygote after the candidate's process
    was forked (that process needs none of it), so a unit-test check finds them loaded."""
    try:
        import harness_remote, harness_unit_tests  # noqa: E401,F401
        import pytest  # noqa: F401
        import _pytest.python, _pytest.runner, _pytest.fixtures, _pytest.assertion.rewrite  # noqa: E401,F401
        import unittest  # noqa: F401
    except ImportError:
        pass


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--zygote":
        zygote(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "--zygote" and sys.argv[3] == "--function-call-only":
        zygote(sys.argv[2], unit_tests=False)
    else:
        main()
