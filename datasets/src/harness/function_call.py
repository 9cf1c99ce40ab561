"""farm's function-call test harness: the task's check() runs here, in a trusted process,
against a proxy of the candidate's function, which lives in a separate unprivileged process.

Run by the guest agent as root, in the scoring VM:

    python3 -I harness.py --tests-dir DIR --module solution --entry-point NAME --call-timeout S

with the reward file's path on standard input. The order of events is what keeps the
candidate out of reach:

1. The candidate process is forked first, while this process holds nothing secret: not the
   reward path (still unread on stdin, which the child closes), not the tests (still on
   disk, in a folder only root can read). The child drops to the candidate user (uid 1000),
   closes every descriptor but its two pipes, and only then imports the candidate's module.
2. Then this process reads the reward path and the problem (prompt, tests). The prompt is
   the task author's code, so helpers it defines (an encoder whose inverse the candidate
   writes, say) are taken from it, never from the candidate's module.
3. check(candidate) runs here. The candidate is a proxy: each call sends plain data (numbers,
   strings, bytes, booleans, None, and lists, tuples, dicts, sets and frozensets of those)
   over a pipe and gets plain data back, rebuilt here as fresh built-in objects, so nothing
   the candidate returns carries behaviour (custom equality, hashing, repr) into this
   process. Exceptions the candidate raises come back as the nearest built-in exception
   type. Functions the tests pass (lambdas, key functions) stay here and are called back.
   Changes the candidate makes to list, dict and set arguments are copied back into the
   caller's objects. Every call has a time limit.
4. Only if check() returns does this process write "1" to the reward file.

Anything the proxy cannot carry (the tests reading the candidate's attributes, inspecting it,
passing it objects that are not plain data) ends the check with a line starting with
"farm-harness:" and exit code 3, never with a silent fallback. Those lines go to standard
output, which only this process holds (the candidate's standard output is this process's
standard error), so the candidate cannot write one.

Zygote. Starting Python, and forking it, is most of a check's cost in a fresh VM (under
TCG each new VM translates those paths anew). So farm's templates start this file once,
before the snapshot, as a zygote (`--zygote SOCKET`, root, socket mode 0600), which forks
the candidate's process right away (dropped to the candidate user, idle, holding nothing):
every fork of the snapshot inherits both. A check reaches the zygote through `farm-agent
--check-with-zygote`, which hands over its standard input, output and error and gets the
exit status back; the zygote runs the check itself, as main() would, and exits (a scoring
VM runs one check). Until then it holds nothing secret either: the reward path and the
tests arrive only with the check.
"""

import builtins
import json
import os
import select
import signal
import struct
import sys
import time

CANDIDATE_UID = 1000
MAX_MESSAGE = 16 << 20
MAX_DEPTH = 100
MAX_PROCESSES = 512
LIMIT_EXIT = 3


class IsolationLimit(BaseException):
    """The tests need something the isolation boundary cannot carry."""


class CandidateFailure(BaseException):
    """The candidate process timed out, died, broke the protocol or returned something that
    is not plain data. A BaseException, so a test's `except Exception` cannot swallow it."""


class BadMessage(Exception):
    pass


class NotPlain(Exception):
    pass


# ----------------------------------------------------------------------------------------
# Plain data <-> JSON-ready tagged lists.

class Callbacks:
    """Functions that cross as references. The checker registers the tests' functions; the
    candidate side knows the stubs it made for them and sends those back as the same
    references."""

    def __init__(self, register):
        self.functions = []
        self.register = register

    def ref(self, function):
        for index, known in enumerate(self.functions):
            if known is function:
                return index
        if not self.register:
            raise NotPlain("a function that did not come from the tests")
        self.functions.append(function)
        return len(self.functions) - 1


def encode(value, callbacks=None, depth=0):
    """Encodes plain data. Exact types only: a subclass of int or list is not plain data.
    With `callbacks` (a Callbacks), functions cross as references."""
    kind = type(value)
    if value is None:
        return ["N"]
    if kind is bool:
        return ["B", value]
    if kind is int:
        return ["i", format(value, "x")]
    if kind is float:
        return ["f", float.hex(value)]
    if kind is complex:
        return ["c", float.hex(value.real), float.hex(value.imag)]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        import base64

        return ["y", base64.b64encode(value).decode("ascii")]
    if depth >= MAX_DEPTH:
        raise NotPlain("a value nested more than %d levels deep" % MAX_DEPTH)
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[kind]
        return [tag, [encode(item, callbacks, depth + 1) for item in value]]
    if kind is dict:
        return ["d", [[encode(k, callbacks, depth + 1), encode(v, callbacks, depth + 1)] for k, v in value.items()]]
    if callbacks is not None and callable(value) and not isinstance(value, type):
        return ["fn", callbacks.ref(value)]
    raise NotPlain("a value of type %s.%s" % (kind.__module__, kind.__qualname__))


def decode(node, make_callback=None, depth=0):
    """Rebuilds plain data from its encoding, refusing anything malformed."""
    if type(node) is not list or not node or type(node[0]) is not str:
        raise BadMessage("not an encoded value")
    tag, rest = node[0], node[1:]
    if depth > MAX_DEPTH:
        raise BadMessage("nested too deeply")
    try:
        if tag == "N" and not rest:
            return None
        if tag == "B" and len(rest) == 1 and type(rest[0]) is bool:
            return rest[0]
        if tag == "i" and len(rest) == 1 and type(rest[0]) is str:
            return int(rest[0], 16)
        if tag == "f" and len(rest) == 1 and type(rest[0]) is str:
            return float.fromhex(rest[0])
        if tag == "c" and len(rest) == 2 and type(rest[0]) is str and type(rest[1]) is str:
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
        if tag == "s" and len(rest) == 1 and type(rest[0]) is str:
            return rest[0]
        if tag == "y" and len(rest) == 1 and type(rest[0]) is str:
            import base64

            return base64.b64decode(rest[0], validate=True)
        if tag in ("l", "t", "S", "F") and len(rest) == 1 and type(rest[0]) is list:
            items = [decode(item, make_callback, depth + 1) for item in rest[0]]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d" and len(rest) == 1 and type(rest[0]) is list:
            result = {}
            for pair in rest[0]:
                if type(pair) is not list or len(pair) != 2:
                    raise BadMessage("a dict entry is not a pair")
                result[decode(pair[0], make_callback, depth + 1)] = decode(pair[1], make_callback, depth + 1)
            return result
        if tag == "fn" and make_callback is not None and len(rest) == 1 and type(rest[0]) is int:
            return make_callback(rest[0])
    except (ValueError, TypeError, OverflowError, RecursionError) as error:
        raise BadMessage("bad %r value: %s" % (tag, error))
    raise BadMessage("unknown or malformed tag %r" % (tag,))


def merge(original, new):
    """Copies `new` into `original` in place, keeping the identity of nested containers
    where their types match (so a list of rows mutated row by row stays the same rows)."""
    if type(original) is list and type(new) is list:
        for i in range(min(len(original), len(new))):
            if type(original[i]) in (list, dict, set) and type(original[i]) is type(new[i]):
                merge(original[i], new[i])
            else:
                original[i] = new[i]
        if len(new) < len(original):
            del original[len(new):]
        else:
            original.extend(new[len(original):])
    elif type(original) is dict and type(new) is dict:
        for key in [k for k in original if k not in new]:
            del original[key]
        for key, value in new.items():
            if key in original and type(original[key]) in (list, dict, set) and type(original[key]) is type(value):
                merge(original[key], value)
            else:
                original[key] = value
    elif type(original) is set and type(new) is set:
        original.clear()
        original.update(new)


def exception_message(error):
    """The names of an exception's classes (most derived first) and its arguments as plain
    data. The checker raises the first of those names that the prompt defines or that is a
    built-in exception."""
    names = [klass.__name__ for klass in type(error).__mro__][:32]
    try:
        args = encode(list(error.args))
    except (NotPlain, RecursionError):
        try:
            args = encode([str(error)[:2000]])
        except Exception:
            args = encode(["(an exception whose text could not be read)"])
    return {"op": "raise", "types": names, "args": args}


# Built-in exceptions the checker will not raise on the candidate's behalf: they would stop
# the checker itself rather than fail a call.
NOT_REPLAYED = {"SystemExit", "KeyboardInterrupt", "GeneratorExit", "BaseException", "BaseExceptionGroup"}


def rebuild_exception(message, trusted_names=None):
    """The exception to raise for a "raise" message: the first of its class names that the
    prompt (trusted code) defines as an exception class, or that is a built-in exception."""
    names = message.get("types")
    if type(names) is not list or not names or any(type(n) is not str for n in names):
        raise BadMessage("an exception without class names")
    klass = None
    for name in names:
        if name in NOT_REPLAYED:
            return CandidateFailure("the candidate raised %s, which ends the check" % names[0])
        found = (trusted_names or {}).get(name)
        if not (isinstance(found, type) and issubclass(found, Exception)):
            found = getattr(builtins, name, None)
        if isinstance(found, type) and issubclass(found, BaseException):
            klass = found
            break
    if klass is None:
        return CandidateFailure("the candidate raised %s, which is no exception the checker knows" % names[0][:200])
    args = decode(message.get("args", ["l", []]))
    if type(args) is not list:
        raise BadMessage("exception arguments are not a list")
    try:
        return klass(*args)
    except Exception:
        return klass(*[str(a) for a in args])


# ----------------------------------------------------------------------------------------
# Framing over pipes.

class Channel:
    def __init__(self, read_fd, write_fd):
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.buffer = b""

    def send(self, message):
        data = json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii")
        if len(data) > MAX_MESSAGE:
            raise NotPlain("a message of %d bytes, over the %d-byte limit" % (len(data), MAX_MESSAGE))
        payload = struct.pack(">I", len(data)) + data
        while payload:
            written = os.write(self.write_fd, payload)
            payload = payload[written:]

    def _read_exact(self, count, deadline):
        while len(self.buffer) < count:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError()
                ready, _, _ = select.select([self.read_fd], [], [], remaining)
                if not ready:
                    raise TimeoutError()
            chunk = os.read(self.read_fd, max(65536, count - len(self.buffer)))
            if not chunk:
                raise EOFError()
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def receive(self, deadline=None):
        (length,) = struct.unpack(">I", self._read_exact(4, deadline))
        if length > MAX_MESSAGE:
            raise BadMessage("a message of %d bytes, over the limit" % length)
        try:
            message = json.loads(self._read_exact(length, deadline))
        except (ValueError, RecursionError) as error:
            raise BadMessage("a message that is not JSON: %s" % error)
        if type(message) is not dict or type(message.get("op")) is not str:
            raise BadMessage("a message without an op")
        return message


# ----------------------------------------------------------------------------------------
# The candidate side (forked child).

def drop_to_candidate(keep, stdio_to_stderr):
    """Makes this process the candidate: own session, no descriptors but `keep`, standard
    input from /dev/null, standard output into standard error (or both to /dev/null until a
    check hands it one), no core dumps, bounded processes, uid and gid 1000 with no groups."""
    os.setsid()
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    if stdio_to_stderr:
        os.dup2(2, 1)
    else:
        os.dup2(null, 1)
        os.dup2(null, 2)
    os.close(null)
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
    os.setgroups([])
    os.setresgid(CANDIDATE_UID, CANDIDATE_UID, CANDIDATE_UID)
    os.setresuid(CANDIDATE_UID, CANDIDATE_UID, CANDIDATE_UID)
    if os.getresuid() != (CANDIDATE_UID,) * 3 or os.getresgid() != (CANDIDATE_UID,) * 3:
        os._exit(71)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"})


def start_candidate(stdio_to_stderr):
    """Forks the candidate's process, which drops to the candidate user at once and waits
    for a "load" message; returns its pid and the checker's end of their socket. It is
    forked before this process holds anything secret."""
    import socket

    checker_end, candidate_end = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        try:
            checker_end.close()
            candidate_main(candidate_end, stdio_to_stderr)
        except EOFError:
            pass  # the checker is done with the candidate
        except BaseException as error:
            report_failure(error)
        finally:
            os._exit(70)
    candidate_end.close()
    return pid, checker_end


def candidate_main(sock, stdio_to_stderr):
    drop_to_candidate({sock.fileno()}, stdio_to_stderr)
    import socket

    # Wait for the check: which module to load, and (from a zygote) the standard error to use.
    message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
    if not message:
        raise EOFError()
    for fd in fds:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    request = json.loads(message)
    workspace, module_name, entry_point = request["workspace"], request["module"], request["entry_point"]
    channel = Channel(sock.fileno(), sock.fileno())
    try:
        os.chdir(workspace)
        sys.path.insert(0, workspace)
        # Exactly the source file the task names, compiled here: not a package or anything
        # else on the path with its name, and no cached bytecode beside it (an unchecked
        # hash-based .pyc would otherwise stand in for the source), as the reference harness
        # executes that file's text.
        import types

        path = os.path.join(workspace, module_name + ".py")
        with open(path, "rb") as handle:
            source = handle.read()
        module = types.ModuleType(module_name)
        module.__file__ = path
        sys.modules[module_name] = module
        exec(compile(source, path, "exec"), module.__dict__)
        function = getattr(module, entry_point)
    except BaseException as error:
        detail = "%s: %s" % (type(error).__name__, str(error)[:1000])
        channel.send({"op": "error", "message": "the candidate's module %s did not load: %s" % (module_name, detail)})
        os._exit(0)
    channel.send({"op": "ready"})
    endpoint = Endpoint(channel, call_target=function)
    while True:
        message = channel.receive()
        endpoint.serve(message)


class Endpoint:
    def __init__(self, channel, call_target=None, deadline=lambda: None, trusted_names=None):
        self.channel = channel
        self.call_target = call_target  # the candidate's function (child side)
        # The tests' functions (checker side, registered as they are passed) or the stubs
        # standing for them (candidate side).
        self.callbacks = Callbacks(register=call_target is None)
        self.deadline = deadline
        self.trusted_names = trusted_names

    # Child side: run a call from the checker.
    def serve(self, message):
        op = message["op"]
        if op == "call" and self.call_target is not None:
            self.run_call(message)
        else:
            self.channel.send({"op": "raise", "types": ["RuntimeError"], "args": encode(["unexpected message %r" % op])})

    def run_call(self, message):
        def make_callback(index):
            while len(self.callbacks.functions) <= index:
                self.callbacks.functions.append(None)
            if self.callbacks.functions[index] is None:
                def callback(*args, **kwargs):
                    message = {"op": "callback", "id": index, "args": encode(list(args), self.callbacks), "kwargs": encode(dict(kwargs), self.callbacks)}
                    self.channel.send(message)
                    return self.wait_reply()
                self.callbacks.functions[index] = callback
            return self.callbacks.functions[index]

        try:
            args = decode(message.get("args"), make_callback)
            kwargs = decode(message.get("kwargs"), make_callback)
        except BadMessage as error:
            self.channel.send({"op": "raise", "types": ["RuntimeError"], "args": encode([str(error)])})
            return
        sent_args = message.get("args")[1]
        try:
            value = self.call_target(*args, **kwargs)
            try:
                reply = {"op": "return", "value": encode(value)}
            except (NotPlain, RecursionError) as error:
                reply = {"op": "not_plain", "what": "returned %s" % error}
        except BaseException as error:  # the candidate's exceptions are data for the checker
            reply = exception_message(error)
        try:
            mutated = []
            for index, arg in enumerate(args):
                if type(arg) in (list, dict, set):
                    encoded = encode(arg, self.callbacks)
                    if encoded != sent_args[index]:
                        mutated.append([["i", format(index, "x")], encoded])
            for name, arg in kwargs.items():
                if type(arg) in (list, dict, set):
                    mutated.append([["s", name], encode(arg, self.callbacks)])
            reply["mutated"] = mutated
        except (NotPlain, RecursionError) as error:
            reply = {"op": "not_plain", "what": "left %s in an argument" % error}
        try:
            self.channel.send(reply)
        except NotPlain as error:
            self.channel.send({"op": "not_plain", "what": "answered with %s" % error})

    def wait_reply(self):
        """Waits for the answer to a request this side sent, serving nested requests."""
        while True:
            message = self.channel.receive(self.deadline())
            op = message["op"]
            if op == "return":
                return decode(message.get("value"))
            if op == "raise":
                raise rebuild_exception(message, self.trusted_names)
            if op == "call" and self.call_target is not None:
                self.run_call(message)
            elif op == "callback" and self.call_target is None:
                self.run_callback(message)
            else:
                raise BadMessage("unexpected %r while waiting for an answer" % op)

    # Checker side: run one of the tests' functions for the candidate.
    def run_callback(self, message):
        index = message.get("id")
        if type(index) is not int or not 0 <= index < len(self.callbacks.functions):
            raise BadMessage("a callback to an unknown function")
        args = decode(message.get("args"))
        kwargs = decode(message.get("kwargs"))
        if type(args) is not list or type(kwargs) is not dict or any(type(k) is not str for k in kwargs):
            raise BadMessage("malformed callback arguments")
        try:
            value = self.callbacks.functions[index](*args, **kwargs)
        except Exception as error:  # an exception of the tests' own function goes to the candidate
            self.channel.send(exception_message(error))
            return
        try:
            self.channel.send({"op": "return", "value": encode(value, self.callbacks)})
        except NotPlain as error:
            raise IsolationLimit("a function the tests passed to the candidate returned %s, which is not plain data" % error)


# ----------------------------------------------------------------------------------------
# The checker side.

class CandidateProxy:
    """Stands for the candidate's function in the tests. Calling it is all it supports."""

    __slots__ = ("_connection", "_entry_point")

    def __init__(self, connection, entry_point):
        object.__setattr__(self, "_connection", connection)
        object.__setattr__(self, "_entry_point", entry_point)

    def __call__(self, *args, **kwargs):
        return object.__getattribute__(self, "_connection").call(args, kwargs)

    def __getattribute__(self, name):
        if name in ("__call__", "__class__", "__setattr__", "__reduce_ex__"):
            return object.__getattribute__(self, name)
        raise IsolationLimit(
            "the tests read candidate.%s; the candidate's function lives in another process and only calls cross to it" % name
        )

    def __setattr__(self, name, value):
        raise IsolationLimit("the tests set candidate.%s; only calls cross to the candidate's process" % name)

    def __repr__(self):
        return "<candidate %s>" % object.__getattribute__(self, "_entry_point")


class Connection:
    def __init__(self, channel, child_pid, call_timeout, trusted_names):
        self.channel = channel
        self.child_pid = child_pid
        self.call_timeout = call_timeout
        self.call_deadline = None
        self.trusted_names = trusted_names
        self.endpoint = Endpoint(channel, deadline=lambda: self.call_deadline, trusted_names=trusted_names)
        self.dead = None
        self.load_error = None

    def wait_ready(self, timeout):
        try:
            message = self.channel.receive(time.monotonic() + timeout)
        except TimeoutError:
            self.kill("the candidate's module did not load within %s s" % timeout)
            return
        except (EOFError, BadMessage) as error:
            self.kill("the candidate process failed before it was ready (%s)" % (error or type(error).__name__))
            return
        if message["op"] == "error" and type(message.get("message")) is str:
            self.kill(message["message"][:2000])
            self.load_error = self.dead
        elif message["op"] != "ready":
            self.kill("the candidate process sent %r instead of ready" % message["op"])

    def kill(self, reason):
        if self.dead is None:
            self.dead = reason
        try:
            os.killpg(self.child_pid, signal.SIGKILL)
        except OSError:
            pass

    def call(self, args, kwargs):
        if self.dead is not None:
            raise CandidateFailure(self.dead)
        outermost = self.call_deadline is None
        if outermost:
            self.call_deadline = time.monotonic() + self.call_timeout
            self.endpoint.callbacks = Callbacks(register=True)
        try:
            try:
                encoded_args = encode(list(args), self.endpoint.callbacks)
                encoded_kwargs = encode(dict(kwargs), self.endpoint.callbacks)
            except NotPlain as error:
                raise IsolationLimit("the tests passed the candidate %s, which is not plain data" % error)
            self.channel.send({"op": "call", "args": encoded_args, "kwargs": encoded_kwargs})
            return self._finish(args, kwargs)
        except TimeoutError:
            self.kill("a call to the candidate ran past its %s s limit" % self.call_timeout)
            raise CandidateFailure(self.dead)
        except (EOFError, OSError):
            self.kill("the candidate process died during a call")
            raise CandidateFailure(self.dead)
        except BadMessage as error:
            self.kill("the candidate process broke the protocol: %s" % error)
            raise CandidateFailure(self.dead)
        finally:
            if outermost:
                self.call_deadline = None

    def _finish(self, args, kwargs):
        while True:
            message = self.channel.receive(self.call_deadline)
            op = message["op"]
            if op == "callback":
                self.endpoint.run_callback(message)
                continue
            if op == "not_plain":
                what = message.get("what") if type(message.get("what")) is str else "something"
                raise CandidateFailure("the candidate %s, which is not plain data" % what[:500])
            if op not in ("return", "raise"):
                raise BadMessage("unexpected %r in answer to a call" % op)
            self._copy_back(message.get("mutated", []), args, kwargs)
            if op == "return":
                return decode(message.get("value"))
            raise rebuild_exception(message, self.trusted_names)

    def _copy_back(self, mutated, args, kwargs):
        if type(mutated) is not list:
            raise BadMessage("malformed argument changes")
        for entry in mutated:
            if type(entry) is not list or len(entry) != 2:
                raise BadMessage("malformed argument change")
            where, value = decode(entry[0]), decode(entry[1])
            if type(where) is int and 0 <= where < len(args):
                merge(args[where], value)
            elif type(where) is str and where in kwargs:
                merge(kwargs[where], value)
            else:
                raise BadMessage("a change to an argument that does not exist")


def guard_inspection(proxy):
    """inspect's functions would silently describe the proxy, not the candidate: refuse."""
    import inspect

    for name in ("signature", "getsource", "getsourcelines", "getfullargspec", "getdoc", "getmodule", "getfile",
                 "isfunction", "ismethod", "isroutine", "isbuiltin", "iscoroutinefunction", "isgeneratorfunction",
                 "unwrap", "getmembers", "getattr_static", "getclosurevars"):
        original = getattr(inspect, name, None)
        if original is None:
            continue

        def guarded(*args, __original=original, __name=name, **kwargs):
            if any(arg is proxy for arg in args):
                raise IsolationLimit("the tests call inspect.%s on the candidate, which lives in another process" % __name)
            return __original(*args, **kwargs)

        setattr(inspect, name, guarded)


def report(message):
    """A line for farm (see the module's docstring): on standard output, which the candidate
    does not hold."""
    print("farm-harness: %s" % message, file=sys.stdout, flush=True)


def report_failure(error):
    """Prints where the check failed: the frames in the tests and the exception, without the
    traceback module (importing it costs more than the rest of a failing check)."""
    lines = []
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        lines.append('  File "%s", line %d, in %s' % (code.co_filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    try:
        text = str(error)[:2000]
    except BaseException:
        text = "(an exception whose text could not be read)"
    print("Traceback (most recent call last):\n%s\n%s%s" % ("\n".join(lines[-6:]), type(error).__name__, ": " + text if text else ""), file=sys.stderr)


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


class Options:
    """--tests-dir DIR --module NAME --entry-point NAME [--workspace DIR] [--call-timeout S]
    (parsed by hand: argparse would cost start-up time in every scoring VM)."""

    def __init__(self, argv):
        values = {"--workspace": "/workspace", "--call-timeout": "10"}
        if len(argv) % 2:
            raise SystemExit("farm-harness: arguments come in pairs: %r" % (argv,))
        for flag, value in zip(argv[0::2], argv[1::2]):
            if flag not in ("--tests-dir", "--workspace", "--module", "--entry-point", "--call-timeout"):
                raise SystemExit("farm-harness: unknown argument %r" % flag)
            values[flag] = value
        missing = [f for f in ("--tests-dir", "--module", "--entry-point") if f not in values]
        if missing:
            raise SystemExit("farm-harness: missing %s" % ", ".join(missing))
        self.tests_dir = values["--tests-dir"]
        self.workspace = values["--workspace"]
        self.module = values["--module"]
        self.entry_point = values["--entry-point"]
        self.call_timeout = float(values["--call-timeout"])


def main():
    options = Options(sys.argv[1:])
    # 1. The candidate, before anything secret is in this process.
    candidate = start_candidate(stdio_to_stderr=True)
    os._exit(run_check(options, candidate, candidate_stderr=None))


def run_check(options, candidate, candidate_stderr):
    """Runs one check against a candidate process started by start_candidate; returns the
    exit code. `candidate_stderr`: a descriptor the candidate takes as its standard output
    and error (None: it keeps the one it has)."""
    import socket

    child, sock = candidate
    connection = None
    # 2. Now the secrets: the reward path, then the problem.
    reward_path = sys.stdin.readline().strip()
    sys.stdin.close()
    if "random" in sys.modules:
        # Seeded before the snapshot (a zygote's), it would be the same in every fork: the
        # tests' random inputs come from this VM's own entropy.
        sys.modules["random"].seed()
    prompt, test = load_problem(options.tests_dir)
    namespace = {}
    exec(compile_prompt(prompt), namespace)
    request = json.dumps({"workspace": options.workspace, "module": options.module, "entry_point": options.entry_point}).encode()
    try:
        socket.send_fds(sock, [request], [] if candidate_stderr is None else [candidate_stderr])
    except OSError:
        pass  # a candidate that is gone shows when it does not answer
    connection = Connection(Channel(sock.fileno(), sock.fileno()), child, options.call_timeout, dict(namespace))
    proxy = CandidateProxy(connection, options.entry_point)
    namespace[options.entry_point] = proxy
    if "inspect" in prompt or "inspect" in test:
        # Only tests that use inspect pay for importing it (costly in a fresh VM).
        guard_inspection(proxy)

    # 3. The check.
    connection.wait_ready(max(options.call_timeout, 30.0))
    code = 1
    try:
        if connection.load_error is not None:
            raise CandidateFailure(connection.load_error)
        exec(compile(test, "test.py", "exec"), namespace)
        namespace["check"](proxy)
        code = 0
    except IsolationLimit as error:
        report("this task cannot be checked through the isolation boundary: %s" % error)
        code = LIMIT_EXIT
    except CandidateFailure as error:
        report(str(error))
    except BaseException as error:
        report_failure(error)
    finally:
        connection.kill("the check is over")
    # 4. The verdict, only after check() returned.
    if code == 0:
        with open(reward_path, "w") as handle:
            handle.write("1")
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def zygote(socket_path):
    """Started once by the template (root), before its snapshot. It forks the candidate's
    process at once (dropped to the candidate user, idle until a check names its module),
    then serves one check on a unix socket, in this very process: every fork of the
    snapshot finds both processes started, so a check forks nothing and starts nothing.
    Neither holds a secret until the check (the reward path and the tests arrive with it).

    The process started exits 0 once the socket listens (1 if the zygote failed): the
    zygote itself is its child, in a session of its own.

    The request is the harness arguments as a JSON list, sent with three descriptors (the
    check's standard input, output and error); the answer is the exit status (4 bytes, big
    endian). A scoring VM runs one check, so the zygote then exits."""
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

    del resource, bisect, collections, copy, functools, heapq, itertools, math, operator, re, string, types, typing
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    candidate = start_candidate(stdio_to_stderr=False)
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
    connection, _ = server.accept()
    server.close()
    code = 70
    try:
        message, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
        if len(fds) != 3:
            os._exit(2)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        arguments = json.loads(message)
        if type(arguments) is not list or any(type(a) is not str for a in arguments):
            os._exit(2)
        code = run_check(Options(arguments), candidate, candidate_stderr=2)
    except BaseException as error:
        report_failure(error)
    finally:
        try:
            connection.sendall(struct.pack(">i", code))
        except OSError:
            pass
        os._exit(code)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--zygote":
        zygote(sys.argv[2])
    else:
        main()
