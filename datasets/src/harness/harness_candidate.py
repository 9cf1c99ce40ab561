"""The candidate's process: forked from the checker before anything secret exists, dropped
to the candidate user, it loads the candidate's modules and serves the checker's requests.

Nothing here is trusted by the checker: whatever this process sends is decoded there as data
and checked. What it does hold is the candidate's objects. In function-call mode it answers
calls of one function, with plain data only. In unit-test mode it keeps a table of the
objects it handed out (a handle each, kept alive so the handle and the object's identity
stay stable for the whole check) and performs on them the operations the checker's proxies
stand for: calls, attribute reads and writes, operators, iteration, conversions.
"""

import builtins
import json
import operator
import os
import sys

from harness_boundary import (ENDS_ITERATION, BadMessage, Channel, NotPlain, decode, encode, exception_message,
                              report_failure)

CANDIDATE_UID = 1000
MAX_PROCESSES = 512
MAX_HANDLES = 200000

# Special methods whose presence on a candidate class decides what its proxy supports (the
# checker gives a remote class's proxy exactly those of them the class has, so `len()`,
# `callable()` and the collections.abc checks answer as they would in-process).
PROTOCOLS = (
    "__len__", "__iter__", "__next__", "__reversed__", "__contains__", "__getitem__", "__setitem__", "__delitem__",
    "__call__", "__enter__", "__exit__", "__index__", "__int__", "__float__", "__complex__", "__bytes__", "__round__",
    "__trunc__", "__floor__", "__ceil__", "__abs__", "__neg__", "__pos__", "__invert__", "__fspath__",
    "__length_hint__", "__await__", "__aiter__", "__anext__", "__aenter__", "__aexit__",
    "__add__", "__sub__", "__mul__", "__matmul__", "__truediv__", "__floordiv__", "__mod__", "__divmod__", "__pow__",
    "__lshift__", "__rshift__", "__and__", "__xor__", "__or__",
    "__radd__", "__rsub__", "__rmul__", "__rmatmul__", "__rtruediv__", "__rfloordiv__", "__rmod__", "__rdivmod__",
    "__rpow__", "__rlshift__", "__rrshift__", "__rand__", "__rxor__", "__ror__",
    "__iadd__", "__isub__", "__imul__", "__imatmul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
    "__ilshift__", "__irshift__", "__iand__", "__ixor__", "__ior__",
)


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


def start_candidate(stdio_to_stderr, private_view=None):
    """Forks the candidate's process, which drops to the candidate user at once and waits
    for the check's request; returns its pid and the checker's end of their socket. It is
    forked before this process holds anything secret. With `private_view` (the workspace),
    it first enters a file system view of its own (enter_private_view): a scoring VM that
    serves more checks keeps nothing of this one's."""
    import socket

    checker_end, candidate_end = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        try:
            checker_end.close()
            if private_view is not None:
                enter_private_view(private_view)
            candidate_main(candidate_end, stdio_to_stderr, announce=private_view is not None)
        except EOFError:
            pass  # the checker is done with the candidate
        except BaseException as error:
            report_failure(error)
        finally:
            os._exit(70)
    candidate_end.close()
    if private_view is not None:
        wait_for_private_view(checker_end, pid)
    return pid, checker_end


# Mount flags and the clone flag of a mount namespace (<sys/mount.h>, <sched.h>).
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
# Left as they are: process and device views, whose contents no process can leave behind.
SPECIAL_MOUNTS = ("/proc", "/sys", "/dev", "/dev/pts")
# Fresh and private to the candidate: where an unprivileged process expects to write.
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")


def preload_private_view():
    """ctypes, imported once in the zygote: each check's candidate enters its view with it."""
    try:
        import ctypes  # noqa: F401
    except ImportError:
        pass


def enter_private_view(workspace):
    """Makes this process (still root, about to become the candidate) see the file system
    through a mount namespace of its own: every mount read-only but the workspace, and fresh
    tmpfs at /tmp, /var/tmp and /dev/shm that die with the namespace. So nothing it writes
    outlives it anywhere but in the workspace, which the guest agent removes after the
    check. Raises OSError (the check then fails as the harness's, never silently unsandboxed)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)

    def call(result, what):
        if result != 0:
            error = ctypes.get_errno()
            raise OSError(error, "the candidate's private view: %s: %s" % (what, os.strerror(error)))

    def mount(source, target, fstype, flags, data=None):
        encode = lambda text: None if text is None else text.encode()  # noqa: E731
        call(libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), "mount %s" % target)

    call(libc.unshare(CLONE_NEWNS), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    workspace = os.path.realpath(workspace)
    mount(workspace, workspace, None, MS_BIND)
    for target in mount_points():
        if target == workspace or target in SPECIAL_MOUNTS:
            continue
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    for target in SCRATCH:
        # A scratch folder that holds the workspace stays read-only instead: a fresh tmpfs
        # there would hide the workspace.
        if os.path.isdir(target) and not workspace.startswith(target.rstrip("/") + "/"):
            mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")


def mount_points():
    """Every mount point this process sees, from /proc/self/mountinfo (octal escapes decoded)."""
    points = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            field = line.split()[4]
            points.append(re_unescape(field))
    return points


def re_unescape(field):
    """Decodes mountinfo's octal escapes (\\040 for a space, and so on)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and len(field[i + 1 : i + 4]) == 3:
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


class PrivateViewFailed(Exception):
    """The candidate's process could not enter its private view (before any of the
    candidate's code was loaded): the scoring VM's failure, not the candidate's."""


def wait_for_private_view(checker_end, pid):
    """Waits until the candidate's process says it entered its view and dropped to the
    candidate user (one byte, b"V", before it loads anything of the candidate's)."""
    checker_end.settimeout(60)
    try:
        ready = checker_end.recv(1) == b"V"
    except OSError:
        ready = False
    checker_end.settimeout(None)
    if not ready:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
        raise PrivateViewFailed("the candidate's process could not enter its private view of the file system")


class ExactSource:
    """Serves the modules the task names from exactly their source files: not a package or
    anything else on the path with that name, and no cached bytecode (an unchecked
    hash-based .pyc would otherwise stand in for the source)."""

    def __init__(self, workspace, names):
        self.paths = {name: os.path.join(workspace, name + ".py") for name in names}

    def find_spec(self, name, path=None, target=None):
        if name not in self.paths:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, self, origin=self.paths[name])

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        path = self.paths[module.__name__]
        with open(path, "rb") as handle:
            source = handle.read()
        module.__file__ = path
        exec(compile(source, path, "exec"), module.__dict__)


def candidate_main(sock, stdio_to_stderr, announce=False):
    drop_to_candidate({sock.fileno()}, stdio_to_stderr)
    if announce:
        sock.sendall(b"V")
    import socket

    # Wait for the check: what to load, and (from a zygote) the standard error to use.
    message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
    if not message:
        raise EOFError()
    for fd in fds:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    request = json.loads(message)
    channel = Channel(sock.fileno())
    unit_tests = request["mode"] == "unit-tests"
    try:
        os.chdir(request["workspace"])
        sys.path.insert(0, request["workspace"])
        sys.meta_path.insert(0, ExactSource(request["workspace"], request["modules"]))
        import importlib

        modules = [importlib.import_module(name) for name in request["modules"]]
        target = None if unit_tests else getattr(modules[0], request["entry_point"])
    except BaseException as error:
        try:
            detail = "%s: %s" % (type(error).__name__, str(error)[:1000])
        except BaseException:
            detail = type(error).__name__
        channel.send({"op": "error", "text": detail})
        os._exit(0)
    server = Server(channel, target, unit_tests)
    channel.send({"op": "ready", "modules": [server.handle(m) for m in modules]})
    while True:
        server.serve(channel.receive())


class Server:
    """Answers the checker's requests. `target` is the function of function-call mode;
    without it (unit-test mode) requests name their objects by handle."""

    def __init__(self, channel, target, unit_tests):
        self.channel = channel
        self.target = target
        self.unit_tests = unit_tests
        self.objects = {}
        self.handles = {}
        self.described = set()
        self.classes = []  # descriptions to send with the next message
        self.stubs = {}  # callback index -> the stub standing for the checker's function
        self.stub_ids = {}

    # Handles and class descriptions.
    def handle(self, value):
        found = self.handles.get(id(value))
        if found is not None:
            return found
        if len(self.objects) >= MAX_HANDLES:
            raise NotPlain("more than %d objects handed to the checker" % MAX_HANDLES)
        number = len(self.objects) + 1
        self.objects[number] = value
        self.handles[id(value)] = number
        return number

    def class_ref(self, klass, described=False):
        """A class as the checker knows it: a built-in one by name (unless `described`: the
        class of an object handed over, for which the checker makes a proxy class), any other
        by handle, described in the same message the first time."""
        if not described and getattr(builtins, getattr(klass, "__name__", ""), None) is klass:
            return ["bt", klass.__name__]
        number = self.handle(klass)
        if number not in self.described:
            self.described.add(number)
            exception = issubclass(klass, BaseException)
            bases = [self.class_ref(b) for b in klass.__bases__ if b is not object and (not exception or issubclass(b, BaseException))]
            builtin_bases = [b.__name__ for b in klass.__mro__[:-1] if getattr(builtins, b.__name__, None) is b]
            self.classes.append({
                "id": number, "name": str(klass.__name__), "qualname": str(getattr(klass, "__qualname__", klass.__name__)),
                "module": str(getattr(klass, "__module__", "")), "exception": exception, "bases": bases,
                "protocols": [name for name in PROTOCOLS if defines(klass, name)],
                "hashable": getattr(klass, "__hash__", None) is not None, "builtin_based": bool(builtin_bases),
            })
            if exception:
                self.classes[-1]["attrs"] = plain_class_attributes(klass)
        return ["k", number]

    def encode_other(self, value, depth):
        if not self.unit_tests:
            stub = self.stub_ids.get(id(value))
            if stub is not None:
                return ["fn", stub]
            raise NotPlain("a value of type %s.%s" % (type(value).__module__, type(value).__qualname__))
        stub = self.stub_ids.get(id(value))
        if stub is not None:
            return ["fn", stub]
        if isinstance(value, type):
            return self.class_ref(value)
        if isinstance(value, BaseException):
            return self.exception_value(value)
        return ["h", self.handle(value), self.class_ref(type(value), described=True)]

    def exception_value(self, error):
        attrs = []
        for key, value in list(getattr(error, "__dict__", {}).items())[:64]:
            if type(key) is str and not key.startswith("__"):
                try:
                    attrs.append([key, encode(value, self.encode_other)])
                except (NotPlain, RecursionError):
                    pass
        try:
            args = encode(list(error.args), self.encode_other)
        except (NotPlain, RecursionError):
            args = encode([])
        try:
            text = str(error)[:2000]
        except BaseException:
            text = ""
        return ["x", self.class_ref(type(error)), args, attrs, text]

    def encode(self, value):
        return encode(value, self.encode_other)

    def decode_other(self, tag, rest, depth):
        if tag == "fn" and len(rest) == 2 and type(rest[0]) is int and type(rest[1]) is bool:
            return self.stub(rest[0], rest[1])
        if tag == "h" and len(rest) == 1 and rest[0] in self.objects:
            return self.objects[rest[0]]
        if tag == "bt" and len(rest) == 1 and isinstance(getattr(builtins, str(rest[0]), None), type):
            return getattr(builtins, rest[0])
        if tag == "mref" and len(rest) == 2 and rest[0] in self.objects and type(rest[1]) is str:
            return getattr(self.objects[rest[0]], rest[1])
        if tag == "x" and len(rest) == 2:
            klass = decode(rest[0], self.decode_other, depth + 1)
            if not (isinstance(klass, type) and issubclass(klass, BaseException)):
                raise BadMessage("not an exception class")
            error = klass.__new__(klass)
            error.args = tuple(decode(rest[1], self.decode_other, depth + 1))
            return error
        return NotImplemented

    def decode(self, node):
        return decode(node, self.decode_other)

    def send(self, message):
        if self.classes:
            message["classes"], self.classes = self.classes, []
        self.channel.send(message)

    # Callbacks: the tests' functions, called back in the checker.
    def stub(self, index, is_function):
        if index not in self.stubs:
            server = self

            def call_back(*args, **kwargs):
                server.send({"op": "callback", "id": index, "args": server.encode(list(args)), "kwargs": server.encode(dict(kwargs))})
                return server.wait_reply()

            if is_function:
                stub = call_back  # binds as a method when stored on a class, as a function would
            else:
                stub = CallableStub(call_back)
            self.stubs[index] = stub
            self.stub_ids[id(stub)] = index
        return self.stubs[index]

    def wait_reply(self):
        """Waits for the answer to a callback, serving the checker's nested requests."""
        while True:
            message = self.channel.receive()
            op = message["op"]
            if op == "return":
                return self.decode(message.get("value"))
            if op == "raise":
                raise checker_exception(message, self.decode)
            self.serve(message)

    # Requests.
    def serve(self, message):
        op = message["op"]
        if op == "call" and self.target is not None:
            self.run(message, "call")
        elif op == "do" and self.unit_tests and type(message.get("action")) is str:
            self.run(message, message["action"])
        else:
            self.send({"op": "raise", "types": ["RuntimeError"], "args": encode(["unexpected message"])})

    def run(self, message, action):
        try:
            args = self.decode(message.get("args"))
            kwargs = self.decode(message.get("kwargs", ["d", []]))
            if type(args) is not list or type(kwargs) is not dict:
                raise BadMessage("malformed arguments")
        except (BadMessage, KeyError) as error:
            self.send({"op": "raise", "types": ["RuntimeError"], "args": encode([str(error)])})
            return
        sent = message.get("args")[1]
        try:
            if self.target is not None:
                value = self.target(*args, **kwargs)
            else:
                value = perform(action, args, kwargs)
            if action == "getattr" and is_own_method(value, args[0]):
                reply = {"op": "return", "value": ["m", self.handle(args[0]), args[1]]}
            else:
                try:
                    reply = {"op": "return", "value": self.encode(value)}
                except (NotPlain, RecursionError) as error:
                    reply = {"op": "not_plain", "what": "returned %s" % error}
        except ENDS_ITERATION_TYPES as error:
            if action == "next" and isinstance(error, StopIteration):
                reply = {"op": "stop", "value": self.safe_encode(error.value)}
            else:
                reply = self.raise_message(error)
        except BaseException as error:  # the candidate's exceptions are data for the checker
            reply = self.raise_message(error)
        try:
            mutated = []
            for index, arg in enumerate(args):
                if type(arg) in (list, dict, set):
                    encoded = self.encode(arg)
                    if encoded != sent[index]:
                        mutated.append([["i", format(index, "x")], encoded])
            for name, arg in kwargs.items():
                if type(arg) in (list, dict, set):
                    mutated.append([["s", name], self.encode(arg)])
            reply["mutated"] = mutated
        except (NotPlain, RecursionError) as error:
            reply = {"op": "not_plain", "what": "left %s in an argument" % error}
        try:
            self.send(reply)
        except NotPlain as error:
            self.send({"op": "not_plain", "what": "answered with %s" % error})

    def safe_encode(self, value):
        try:
            return self.encode(value)
        except (NotPlain, RecursionError):
            return encode(None)

    def raise_message(self, error):
        message = exception_message(error, self.encode_other if self.unit_tests else None)
        if self.unit_tests:
            try:
                message["exception"] = self.exception_value(error)
            except (NotPlain, RecursionError):
                pass
        return message


ENDS_ITERATION_TYPES = (StopIteration, StopAsyncIteration)
assert tuple(t.__name__ for t in ENDS_ITERATION_TYPES) == ENDS_ITERATION


class CallableStub:
    """Stands for a callable of the tests that is not a plain function (a mock, a bound
    method): like those, it does not bind as a method when stored on a class."""

    __slots__ = ("_call",)

    def __init__(self, call):
        self._call = call

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)


def checker_exception(message, decode_value):
    """An exception the tests' function raised, rebuilt here (this side trusts nothing it
    does not already hold, and needs no more than the built-in classes)."""
    for name in message.get("types") or []:
        klass = getattr(builtins, str(name), None)
        if isinstance(klass, type) and issubclass(klass, BaseException):
            try:
                return klass(*decode_value(message.get("args", ["l", []])))
            except Exception:
                return klass()
    return RuntimeError("an exception of the tests")


def defines(klass, name):
    """Whether instances of `klass` have the special method `name`: looked up in the class and
    its bases only, as Python does (getattr on the class would also find its metaclass's:
    every class has type's __call__ and __or__, and its instances none of them)."""
    for base in klass.__mro__:
        if name in vars(base):
            return vars(base)[name] is not None
    return False


def plain_class_attributes(klass):
    """The public class attributes of an exception class that are plain data."""
    found = []
    for key, value in list(vars(klass).items())[:64]:
        if type(key) is str and not key.startswith("_"):
            try:
                found.append([key, encode(value)])
            except (NotPlain, RecursionError):
                pass
    return found


def is_own_method(value, owner):
    """A method bound to `owner` as getattr found it: it crosses as (owner, name), so reading
    a method leaves no object behind in the table."""
    return getattr(value, "__self__", None) is owner and callable(value) and not isinstance(owner, type(sys))


def _exit(obj, exception):
    kind = type(exception) if exception is not None else None
    return type(obj).__exit__(obj, kind, exception, None)


def _deepcopy(obj):
    import copy

    return copy.deepcopy(obj)


def _copy(obj):
    import copy

    return copy.copy(obj)


def _math(name):
    def apply(obj):
        import math

        return getattr(math, name)(obj)

    return apply


# What the checker's proxies stand for: each takes the decoded arguments (the candidate's
# objects in place of handles).
ACTIONS = {
    "call": lambda f, *a, **k: f(*a, **k),
    "callmethod": lambda obj, name, *a, **k: getattr(obj, name)(*a, **k),
    "getattr": getattr, "setattr": setattr, "delattr": delattr,
    "methodattr": lambda obj, name, attr: getattr(getattr(obj, name), attr),
    "getitem": operator.getitem, "setitem": operator.setitem, "delitem": operator.delitem,
    "contains": operator.contains,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "bool": bool, "len": len, "hash": hash, "str": str, "repr": repr, "format": format, "dir": dir,
    "iter": iter, "next": next, "reversed": reversed, "index": operator.index, "int": int, "float": float,
    "complex": complex, "bytes": bytes, "round": round, "length_hint": operator.length_hint, "fspath": os.fspath,
    "neg": operator.neg, "pos": operator.pos, "abs": abs, "invert": operator.invert,
    "trunc": _math("trunc"), "floor": _math("floor"), "ceil": _math("ceil"),
    "enter": lambda obj: type(obj).__enter__(obj), "exit": _exit, "copy": _copy, "deepcopy": _deepcopy,
    "divmod": divmod, "pow": pow,
}
for _name in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "lshift", "rshift", "and", "xor", "or"):
    ACTIONS[_name] = getattr(operator, _name + "_" if _name in ("and", "or") else _name)
    ACTIONS["i" + _name] = getattr(operator, "i" + _name)
ACTIONS["ipow"] = operator.ipow


def perform(action, args, kwargs):
    function = ACTIONS.get(action)
    if function is None:
        raise RuntimeError("unknown action")
    return function(*args, **kwargs)
