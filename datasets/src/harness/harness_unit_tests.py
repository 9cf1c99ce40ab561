"""Unit-test mode: the task's pytest or unittest files run in the checker, where each of the
candidate's modules is a proxy (see harness_remote).

The test files are `test_*.py` and `*_test.py` directly in the tests folder (root-only).
Before anything runs they are read for constructs that cannot work through the boundary
(below); then pytest runs them if it can be imported (the guest image has Debian's 7.2.1),
else unittest. pytest runs with no cache, no plugins loaded from entry points, the tests
folder as its rootdir and confcutdir, and no configuration file but the task's own
`pytest.ini` in that folder: nothing the candidate can write is read, and nothing of the
workspace is ever on this process's sys.path. The check passes when at least one test ran
and none failed or errored (skips are allowed).

What cannot cross
-----------------
Each of these fails loudly: `isolation_limit` (exit 3) where the tests reach it on their
own, `candidate_failure` where it involves an object the candidate handed back (the
candidate chose to hand back an object rather than plain data, so it must not be able to
turn its failure into a "broken task").

- Async code: test files that use `async`, `await` or asyncio (found before running);
  awaiting or async-iterating a candidate object. Coroutines do not cross.
- Pickling (test files importing pickle, shelve, copyreg, dill, cloudpickle, found before
  running; pickling a candidate object). `copy.copy` and `copy.deepcopy` of a candidate
  object do work: they copy it in the candidate's process (deepcopy's memo is not shared
  between several candidate objects copied in one call).
- Running or loading the candidate's code any other way: test files that import
  subprocess, multiprocessing, concurrent, runpy or importlib, or that name the workspace
  path, are refused before running (the checker is root: the candidate's code must reach it
  only through the proxy).
- Subclassing a class of the candidate's module in the tests (found before running, and
  refused at run time).
- Using the candidate from a thread other than the tests' own.
- inspect on the candidate's functions, classes, modules or objects (signature,
  getsource, isfunction, getmembers, ...): they would describe the proxy.
- Non-plain objects the tests built (a Decimal, an instance of a test class, a generator)
  passed to the candidate. Plain data, the tests' functions and classes' instances of the
  candidate (proxies) cross.
- A candidate object never stands for plain data: comparing one with plain data
  (`obj == 3`, `3 in [obj]`, `obj == (1, 2)` even for a namedtuple), or an operator that
  combines one with plain data and gives plain data (`obj - 2.5` answering 0.0), fails the
  check. Comparisons between two candidate objects are the candidate's, as in-process.
- Candidate objects as dict keys and set members do work: hash() is the candidate's (an
  int), and so is == between two candidate objects; a candidate object whose hash meets a
  plain key's is compared with plain data, which fails the check (above).
- `isinstance(obj, int)` (and other checks of a built-in base) on an object whose class
  subclasses a built-in type: the proxy is no int; the check fails. C functions that test
  for built-in types (json.dumps, str.join, struct.pack) see a proxy, not its base.
- Exceptions cross by value: class (a stand-in for the candidate's, with its built-in and
  own bases and its plain class attributes), arguments, attributes and text; not methods of
  the candidate's exception classes, nor their traceback, cause or context. A candidate
  exception deriving from another module's exception (json.JSONDecodeError) is caught by
  its built-in bases only (ValueError), not by that class. SystemExit, KeyboardInterrupt,
  GeneratorExit and exceptions that are not Exceptions end the check as a candidate failure;
  StopIteration and StopAsyncIteration raised by the candidate become RuntimeError (PEP 479),
  except as the end of iterating a candidate iterator.
- The tests' failures cannot be swallowed by the candidate: an AssertionError (or the
  runner's skip or fail) raised in a function the candidate calls back is raised in the
  test once the candidate's call is over, whatever the candidate did with it; a candidate
  `__exit__` that suppresses one fails the check. `__exit__` gets no traceback.
- Plain data crosses by value, as in function-call mode: a list the candidate returns is
  a copy, so `is` between it and anything else is false, and a list the tests passed and
  the candidate kept does not follow later changes on either side (changes the candidate
  makes during the call itself are copied back). This is silent: tests that depend on
  aliasing of plain containers between the tests and the candidate, or on their identity,
  do not check what they mean to. Candidate objects (proxies) keep identity and state.
- Module-level plain values are read when the tests read them (`solution.X` is a fresh
  copy each time); values the tests assign to the module are set in the candidate's module.
- A function the tests pass, called by the candidate, that returns something that cannot
  cross fails the check (as a candidate failure: only the candidate's call reaches it).
- Generators and iterators of the candidate are proxies: iteration, next, send and close
  work, throw with a built-in exception class works. A StopIteration from a candidate's
  __getitem__ (the old iteration protocol) is a RuntimeError, not the end of the loop.
- A candidate class's proxy is iterable, sized and subscriptable as a class (for Enums):
  `isinstance(solution.SomeClass, collections.abc.Iterable)` is true for every class.
- The candidate's classes as the tests see them are local classes: `__mro__`, `__dict__`
  and `__bases__` of `solution.SomeClass` describe the proxy, not the candidate's class.
"""

import ast
import os
import sys

from harness_boundary import LOAD_TIMEOUT, CandidateFailure, IsolationLimit, report, report_failure

REFUSED_IMPORTS = {
    "asyncio": "async code (coroutines cannot cross)",
    "pickle": "pickle (candidate objects cannot be pickled)",
    "shelve": "shelve (candidate objects cannot be pickled)",
    "copyreg": "copyreg (candidate objects cannot be pickled)",
    "dill": "dill (candidate objects cannot be pickled)",
    "cloudpickle": "cloudpickle (candidate objects cannot be pickled)",
    "subprocess": "subprocess (the candidate's code runs only through the proxy)",
    "multiprocessing": "multiprocessing (the candidate's code runs only through the proxy)",
    "concurrent": "concurrent (the candidate's code runs only through the proxy)",
    "runpy": "runpy (the candidate's code runs only through the proxy)",
    "importlib": "importlib (the candidate's code runs only through the proxy)",
}


def test_files(tests_dir):
    names = sorted(n for n in os.listdir(tests_dir) if n.endswith(".py") and (n.startswith("test_") or n.endswith("_test.py")))
    return [os.path.join(tests_dir, n) for n in names if os.path.isfile(os.path.join(tests_dir, n))]


def scan(path, modules, workspace):
    """The first construct in a test file that cannot work through the boundary, as a
    message (the file's name and line, the construct), or None."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    name = os.path.basename(path)
    imported = set()  # names bound to the candidate's classes or modules
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in modules:
                    imported.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in modules:
            imported.update(alias.asname or alias.name for alias in node.names)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith)):
            return "%s line %d uses async code (coroutines cannot cross)" % (name, line)
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module]
        for target in targets:
            reason = REFUSED_IMPORTS.get(target.split(".")[0])
            if reason:
                return "%s line %d imports %s" % (name, line, reason)
        if isinstance(node, ast.Constant) and type(node.value) is str and workspace.rstrip("/") in node.value:
            return "%s line %d names the workspace (the candidate's code runs only through the proxy)" % (name, line)
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                root = base
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in imported:
                    return "%s line %d defines class %s on top of a class of the candidate's module" % (name, line, node.name)
    return None


def check_module_names(modules):
    """The proxies replace these names in sys.modules: none may be a module the checker
    itself has (the standard library, pytest)."""
    import importlib.util

    for name in modules:
        if name in sys.modules or name in sys.stdlib_module_names or importlib.util.find_spec(name) is not None:
            return "the task names the candidate module %s, which is also a module of the checker's" % name
    return None


def run(options, start_candidate_check):
    """The check of unit-test mode; returns the exit code."""
    from harness_function_call import finish, guard_inspection
    from harness_remote import install_modules

    connection = start_candidate_check({}, None)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    code = 1
    try:
        files = test_files(options.tests_dir)
        problem = check_module_names(options.modules)
        for path in files:
            problem = problem or scan(path, options.modules, options.workspace)
        if not files:
            problem = problem or "the task has no test files (test_*.py or *_test.py)"
        if problem:
            raise connection.limit_reached(problem)
        ready = connection.wait_ready(max(options.call_timeout, LOAD_TIMEOUT))
        remote = install_modules(connection, options.modules, ready.get("modules"))
        guard_inspection(remote.is_proxy, lambda name, arg: remote.limit_or_failure(
            remote.is_export(arg), "the tests call inspect.%s on the candidate's code, which lives in another process" % name))
        os.chdir(options.tests_dir)
        decided = lambda: connection.failure is not None  # noqa: E731
        if pytest_available():
            counts = run_pytest(options.tests_dir, files, decided)
        else:
            counts = run_unittest(options.tests_dir, files, decided)
        if counts["tests"] > counts["skipped"] and counts["failures"] == 0 and counts["errors"] == 0:
            code = 0
    except (IsolationLimit, CandidateFailure):
        pass  # recorded on the connection
    except BaseException as error:
        report_failure(error)
    code = finish(connection, code)
    report("summary", **counts)
    return code


def pytest_available():
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DEBUG"):
        os.environ.pop(name, None)
    try:
        import pytest  # noqa: F401
    except ImportError:
        return False
    return True


DECIDED = "the check's outcome is decided: a candidate failure stuck"


class Counter:
    """A pytest plugin that counts outcomes per test: an error in setup or teardown is an
    error, a failure of the test itself a failure, a skip (or an expected failure) a skip.
    Once `decided()` (a candidate failure stuck to the connection: it outranks everything a
    later test could find, see finish) it stops the session after the current test: every
    later test would only fail again on the sticky failure, each with a long traceback to
    format, which under TCG took up to 4 s a test. A limit of the boundary does not stop the
    session: a later candidate failure would outrank it."""

    def __init__(self, decided):
        self.counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        self.decided = decided
        self.session = None

    def pytest_sessionstart(self, session):
        self.session = session

    def pytest_runtest_logreport(self, report):
        if report.when == "setup":
            self.counts["tests"] += 1
        if report.failed:
            self.counts["failures" if report.when == "call" else "errors"] += 1
        elif report.skipped and report.when in ("setup", "call"):
            self.counts["skipped"] += 1
        if self.session is not None and self.decided():
            self.session.shouldstop = DECIDED

    def pytest_collectreport(self, report):
        if report.failed:
            self.counts["errors"] += 1


def run_pytest(tests_dir, files, decided):
    import pytest

    ini = os.path.join(tests_dir, "pytest.ini")
    arguments = ["-p", "no:cacheprovider", "-p", "no:stepwise", "--rootdir", tests_dir, "--confcutdir", tests_dir,
                 "-c", ini if os.path.isfile(ini) else os.devnull, "-q", "-rfEs"] + files
    counter = Counter(decided)
    status = pytest.main(arguments, plugins=[counter])
    if int(status) != 0 and counter.counts["failures"] == 0 and counter.counts["errors"] == 0:
        counter.counts["errors"] += 1  # interrupted, no tests, usage error: not a pass
    return counter.counts


def run_unittest(tests_dir, files, decided):
    """Without pytest: unittest's TestCases, and module-level test_* functions as plain
    function tests (without fixtures). Stops once `decided()`, as run_pytest does."""
    import importlib.util
    import unittest

    sys.path.insert(0, tests_dir)
    suite = unittest.TestSuite()

    class Result(unittest.TestResult):
        def stopTest(self, test):
            super().stopTest(test)
            if decided():
                self.stop()

    result = Result()
    for path in files:
        name = os.path.basename(path)[:-3]
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except (IsolationLimit, CandidateFailure):
            raise
        except BaseException as error:
            report_failure(error)
            result.errors.append((None, "%s did not import" % name))
            continue
        suite.addTests(unittest.defaultTestLoader.loadTestsFromModule(module))
        for attribute, value in sorted(vars(module).items()):
            if attribute.startswith("test") and callable(value) and getattr(value, "__module__", None) == name:
                suite.addTest(unittest.FunctionTestCase(value))
    suite.run(result)
    for test, text in result.failures + result.errors:
        print("%s\n%s" % (test, text), file=sys.stderr)
    return {"tests": result.testsRun, "failures": len(result.failures) + len(result.unexpectedSuccesses),
            "errors": len(result.errors), "skipped": len(result.skipped) + len(result.expectedFailures)}
