"""Function-call mode: the task's check(candidate) runs in the checker against a proxy of the
candidate's one function (HumanEval and its kind).

The prompt (the task author's code) is executed here, so helpers it defines (an encoder
whose inverse the candidate writes, say) are taken from it, never from the candidate's
module; exception classes it defines are what the candidate's exceptions of those names
become. The candidate is a proxy: calling it sends plain data and gets plain data back;
exceptions come back as the first of their classes that the prompt defines or that is
built in (StopIteration as RuntimeError); functions the tests pass are called back; changes
the candidate makes to list, dict and set arguments are copied back.

Anything the proxy cannot carry (the tests reading the candidate's attributes, inspecting it,
passing it objects that are not plain data) ends the check with an `isolation_limit` report
and exit code 3, never with a silent fallback.
"""

import json
import os
import sys

from harness_boundary import LOAD_TIMEOUT, CandidateFailure, IsolationLimit, report, report_failure

LIMIT_EXIT = 3
TRUSTED_CALLERS = ("_pytest.", "pytest", "pluggy", "unittest", "inspect", "harness_")


class CandidateProxy:
    """Stands for the candidate's function in the tests. Calling it is all it supports."""

    __slots__ = ("_connection", "_entry_point")

    def __init__(self, connection, entry_point):
        object.__setattr__(self, "_connection", connection)
        object.__setattr__(self, "_entry_point", entry_point)

    def __call__(self, *args, **kwargs):
        return object.__getattribute__(self, "_connection").request({"op": "call"}, args, kwargs, from_tests=True)

    def __getattribute__(self, name):
        if name in ("__call__", "__class__", "__setattr__", "__reduce_ex__"):
            return object.__getattribute__(self, name)
        connection = object.__getattribute__(self, "_connection")
        raise connection.limit_reached("the tests read candidate.%s; the candidate's function lives in another process and only calls cross to it" % name)

    def __setattr__(self, name, value):
        connection = object.__getattribute__(self, "_connection")
        raise connection.limit_reached("the tests set candidate.%s; only calls cross to the candidate's process" % name)

    def __repr__(self):
        return "<candidate %s>" % object.__getattribute__(self, "_entry_point")


def guard_inspection(is_proxy, limit):
    """inspect's functions would silently describe the proxy, not the candidate: refuse.
    `limit(name, argument)` returns the exception to raise for inspect.NAME(argument)."""
    import inspect

    for name in ("signature", "getsource", "getsourcelines", "getfullargspec", "getdoc", "getmodule", "getfile",
                 "getsourcefile", "isfunction", "ismethod", "isroutine", "isbuiltin", "iscoroutinefunction",
                 "isgeneratorfunction", "unwrap", "getmembers", "getattr_static", "getclosurevars", "getcomments"):
        original = getattr(inspect, name, None)
        if original is None or getattr(original, "_farm_guarded", False):
            continue

        def guarded(*args, __original=original, __name=name, **kwargs):
            # Only the tests' own calls: pytest and unittest ask inspect about what a test
            # module imported while collecting it, and get the proxy's plain answer.
            caller = str(sys._getframe(1).f_globals.get("__name__"))
            if not caller.startswith(TRUSTED_CALLERS):
                for arg in args:
                    if is_proxy(arg):
                        raise limit(__name, arg)
            return __original(*args, **kwargs)

        guarded._farm_guarded = True
        setattr(inspect, name, guarded)


def load_problem(tests_dir):
    with open(os.path.join(tests_dir, "problem.json"), encoding="utf-8") as handle:
        problem = json.load(handle)
    return problem["prompt"], problem["test"]


def compile_prompt(prompt):
    try:
        return compile(prompt, "prompt.py", "exec")
    except SyntaxError:
        # A prompt that ends at the signature, with no docstring, has no body yet.
        return compile(prompt + "\n    pass\n", "prompt.py", "exec")


def run(options, start_candidate_check):
    """The check of function-call mode; returns the exit code. `start_candidate_check(extra)`
    sends the candidate its load request and returns the connection."""
    prompt, test = load_problem(options.tests_dir)
    namespace = {}
    exec(compile_prompt(prompt), namespace)
    connection = start_candidate_check({"entry_point": options.entry_point}, dict(namespace))
    proxy = CandidateProxy(connection, options.entry_point)
    namespace[options.entry_point] = proxy
    if "inspect" in prompt or "inspect" in test:
        # Only tests that use inspect pay for importing it (costly in a fresh VM).
        guard_inspection(lambda arg: arg is proxy, lambda name, arg: connection.limit_reached(
            "the tests call inspect.%s on the candidate, which lives in another process" % name))
    code = 1
    try:
        connection.wait_ready(max(options.call_timeout, LOAD_TIMEOUT))
        exec(compile(test, "test.py", "exec"), namespace)
        namespace["check"](proxy)
        code = 0
    except (IsolationLimit, CandidateFailure):
        pass  # recorded on the connection
    except BaseException as error:
        report_failure(error)
    return finish(connection, code)


def finish(connection, code):
    """The exit code once the tests are over, from what stuck to the connection: a candidate
    failure first (whatever the tests caught), then a limit of the boundary."""
    if connection.failure is not None:
        report("candidate_failure", connection.failure.message, connection.failure.candidate_text)
        return 1
    if connection.limit is not None:
        report("isolation_limit", "this task cannot be checked through the isolation boundary: %s" % connection.limit)
        return LIMIT_EXIT
    return code
