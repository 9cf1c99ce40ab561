"""The checker's end of the boundary: one connection to the candidate's process, with the time
limits, the callbacks into the tests, and the failures that stick.

Every request the tests make through a proxy is one exchange: the request goes out, and the
candidate's process answers with a value, an exception, or first with calls back into the
tests' functions (served here, in this process). The outermost request of a test's call
gets `call_timeout` seconds for its whole tree of nested callbacks and requests; past it the
candidate's process is killed and the check has failed.

Failures stick. A CandidateFailure or an IsolationLimit is recorded on the connection when
it is raised, so the verdict does not depend on whether a test's `except BaseException` (or
`pytest.raises(BaseException)`) caught it. After a CandidateFailure the candidate's process
is killed and every later request fails at once.
"""

import _thread
import os
import signal
import time

from harness_boundary import (BadMessage, CandidateFailure, IsolationLimit, NotPlain, build_exception, decode,
                              encode, exception_message, first_known_class, merge)


class Callbacks:
    """The tests' functions the candidate may call back, registered as they are passed and
    kept for the whole check (a candidate may store one and call it in a later call: the same
    index always means the same function)."""

    def __init__(self):
        self.functions = []
        self.indexes = {}

    def ref(self, function):
        index = self.indexes.get(id(function))
        if index is None:
            index = len(self.functions)
            self.functions.append(function)  # kept alive, so its id stays its own
            self.indexes[id(function)] = index
        return index


class Connection:
    """`decode_other(tag, rest, depth)` decodes the candidate's references (unit-test mode),
    `encode_other(value, depth)` the checker's; `raise_hook(message)` rebuilds an exception
    the candidate raised."""

    def __init__(self, sock, child_pid, call_timeout, trusted_names=None):
        from harness_boundary import Channel

        self.sock = sock
        self.channel = Channel(sock.fileno())
        self.child_pid = child_pid
        self.call_timeout = call_timeout
        self.deadline = None
        self.trusted_names = trusted_names or {}
        self.callbacks = Callbacks()
        self.failure = None
        self.limit = None
        self.thread = _thread.get_ident()
        self.decode_other = None
        self.encode_hook = None
        self.raise_hook = None
        self.on_classes = None

    # Sticky outcomes.
    def fail(self, message, candidate_text=None):
        """Records (the first) candidate failure, kills the candidate's process, and returns
        the exception for the caller to raise."""
        error = CandidateFailure(message, candidate_text)
        if self.failure is None:
            self.failure = error
        self.kill()
        return error

    def limit_reached(self, message):
        error = IsolationLimit(message)
        if self.limit is None:
            self.limit = error
        return error

    def kill(self):
        try:
            os.killpg(self.child_pid, signal.SIGKILL)
        except OSError:
            pass

    def wait_ready(self, timeout):
        """Waits for the candidate's modules to load; returns the ready message."""
        try:
            message = self.channel.receive(time.monotonic() + timeout)
        except TimeoutError:
            raise self.fail("the candidate's module did not load within the time limit")
        except (EOFError, OSError, BadMessage):
            raise self.fail("the candidate's process ended or broke the protocol before its module loaded")
        if message["op"] == "error":
            raise self.fail("the candidate's module did not load", message.get("text"))
        if message["op"] != "ready":
            raise self.fail("the candidate's process sent something else than ready", message["op"])
        return message

    # Encoding the tests' values.
    def encode_other(self, value, depth):
        if self.encode_hook is not None:
            found = self.encode_hook(value, depth)
            if found is not NotImplemented:
                return found
        if callable(value) and not isinstance(value, type):
            import types

            return ["fn", self.callbacks.ref(value), isinstance(value, types.FunctionType)]
        raise NotPlain("a value of type %s.%s" % (type(value).__module__, type(value).__qualname__))

    def decode(self, node):
        return decode(node, self._decode_other)

    def _decode_other(self, tag, rest, depth):
        if tag == "fn" and len(rest) == 1 and type(rest[0]) is int and 0 <= rest[0] < len(self.callbacks.functions):
            return self.callbacks.functions[rest[0]]
        if self.decode_other is not None:
            return self.decode_other(tag, rest, depth)
        return NotImplemented

    # One request.
    def request(self, fields, args, kwargs, from_tests):
        """Sends a request (`fields`: its op and action) with `args` and `kwargs` and returns
        the candidate's answer, or raises its exception. `from_tests`: the tests reach this
        request on their own (they call a function or class of the candidate's module by
        name), so arguments that cannot cross are the task's limit; otherwise the request
        acts on something the candidate handed back, and the limit is the candidate's."""
        if self.failure is not None:
            raise self.failure
        if _thread.get_ident() != self.thread:
            raise self.limit_reached("the tests use the candidate from another thread; its process answers one request at a time")
        outermost = self.deadline is None
        if outermost:
            self.deadline = time.monotonic() + self.call_timeout
        try:
            try:
                message = dict(fields, args=encode(list(args), self.encode_other), kwargs=encode(dict(kwargs), self.encode_other))
            except NotPlain as error:
                if from_tests and error.candidate_text is None:
                    raise self.limit_reached("the tests passed the candidate %s, which is not plain data" % error.what)
                raise self.fail("the tests passed something that cannot cross to an object the candidate handed back",
                                error.candidate_text or error.what)
            self.channel.send(message)
            return self._finish(args, kwargs, ends_iteration=fields.get("action") == "next")
        except TimeoutError:
            raise self.fail("a call to the candidate ran past its time limit")
        except (EOFError, OSError):
            raise self.fail("the candidate's process died during a call")
        except BadMessage as error:
            raise self.fail("the candidate's process broke the protocol: %s" % error.message, error.candidate_text)
        finally:
            if outermost:
                self.deadline = None

    def _finish(self, args, kwargs, ends_iteration):
        """The candidate's answer to one request. `ends_iteration`: the request is next() on
        a candidate iterator, the one request that "stop" (the end of the iteration) may
        answer. Anywhere else a "stop" would raise a real StopIteration in the tests, which
        ends their loop (`all(map(...))`) early: a breach of the protocol, never a value."""
        aborted = None
        while True:
            message = self.channel.receive(self.deadline)
            if "classes" in message and self.on_classes is not None:
                self.on_classes(message["classes"])
            op = message["op"]
            if op == "callback":
                if aborted is not None:
                    self.channel.send({"op": "raise", "types": ["BaseException"], "args": ["l", []]})
                else:
                    aborted = self.run_callback(message)
                continue
            if aborted is not None:
                # The tests' function ended with an exception the candidate must not see
                # (a failed assertion, the runner's own): now that the call is over, it goes
                # on in the tests, whatever the candidate answered.
                raise aborted
            if op == "not_plain":
                what = message.get("what")
                raise self.fail("the candidate produced something that is not plain data", what if type(what) is str else None)
            if op not in ("return", "raise", "stop"):
                raise BadMessage("an unexpected message in answer to a call", op)
            if op == "stop" and not ends_iteration:
                raise BadMessage("the end of an iteration in answer to a request that is not next()")
            self._copy_back(message.get("mutated", []), args, kwargs)
            if op == "return":
                return self.decode(message.get("value"))
            if op == "stop":
                raise StopIteration(self.decode(message.get("value")))
            raise self.rebuild_exception(message)

    def rebuild_exception(self, message):
        if self.raise_hook is not None:
            return self.raise_hook(message)
        klass, failure = first_known_class(message.get("types"), self.trusted_names)
        if failure is not None:
            raise self.fail(failure.message, failure.candidate_text)
        arguments = decode(message.get("args", ["l", []]))
        if type(arguments) is not list:
            raise BadMessage("exception arguments that are not a list")
        return build_exception(klass, arguments)

    def _copy_back(self, mutated, args, kwargs):
        if type(mutated) is not list:
            raise BadMessage("malformed argument changes")
        for entry in mutated:
            if type(entry) is not list or len(entry) != 2:
                raise BadMessage("a malformed argument change")
            where, value = decode(entry[0]), self.decode(entry[1])
            if type(where) is int and 0 <= where < len(args) and type(args[where]) is type(value):
                merge(args[where], value)
            elif type(where) is str and where in kwargs and type(kwargs[where]) is type(value):
                merge(kwargs[where], value)
            else:
                raise BadMessage("a change to an argument that does not exist")

    def run_callback(self, message):
        """Runs one of the tests' functions for the candidate. Returns the exception to raise
        in the tests once the candidate's call is over, if the function ended with one the
        candidate must not be able to catch (an AssertionError, or anything that is not an
        Exception: the runner's skip and fail, a failure of a nested request)."""
        index = message.get("id")
        if type(index) is not int or not 0 <= index < len(self.callbacks.functions):
            raise BadMessage("a callback to an unknown function")
        args = self.decode(message.get("args"))
        kwargs = self.decode(message.get("kwargs"))
        if type(args) is not list or type(kwargs) is not dict or any(type(k) is not str for k in kwargs):
            raise BadMessage("malformed callback arguments")
        try:
            value = self.callbacks.functions[index](*args, **kwargs)
        except (AssertionError, BaseException) as error:
            if isinstance(error, Exception) and not isinstance(error, AssertionError):
                self.channel.send(exception_message(error))
                return None
            self.channel.send({"op": "raise", "types": ["BaseException"], "args": ["l", []]})
            return error
        try:
            self.channel.send({"op": "return", "value": encode(value, self.encode_other)})
        except NotPlain as error:
            # Only reached if the candidate calls this function: its choice, so its failure.
            raise self.fail("a function of the tests, called by the candidate, returned something that cannot cross",
                            error.candidate_text)
        return None
