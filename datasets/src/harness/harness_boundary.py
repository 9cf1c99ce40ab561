"""The isolation boundary both harness modes share: plain data and its encoding, the framing
of messages, the errors that end a check, and the report farm reads.

Plain data is numbers, strings, bytes, booleans, None, and lists, tuples, dicts, sets and
frozensets of those, exact types only (a subclass of int is not plain). It crosses as
tagged JSON and is rebuilt as fresh built-in objects, so nothing the candidate sends
carries behaviour into the checker. The other tags (references to the tests' functions, to
candidate objects, exceptions) belong to one side each and are decoded by that side's
hooks; the core here refuses them.

Reports. Each line farm reads is `farm-harness: ` and one JSON object:

    {"kind": "isolation_limit" | "candidate_failure" | "environment", "message": M, "candidate_text": T}
    {"kind": "summary", "tests": N, "failures": N, "errors": N, "skipped": N}   (unit tests)

`message` is built only from this harness's own text and from what the checker knows (names
in the tests); anything the candidate's process sent goes in `candidate_text` (or nowhere),
so a candidate cannot make its failure read like the harness's (or like a broken task's).
The lines go to a duplicate of the standard output taken when the check starts; standard
output itself then points at standard error, so what the tests print (a candidate's string,
say) cannot start a line of the report either.
"""

import base64
import json
import os
import select
import struct
import sys
import time

MAX_MESSAGE = 16 << 20
MAX_DEPTH = 100
MAX_TEXT = 500
# Seconds the candidate's modules get to load at least (the call limit, when longer): room for
# a loaded machine; the check's own time limit, set by farm, still bounds the whole check.
LOAD_TIMEOUT = 120.0


class IsolationLimit(BaseException):
    """The tests need something the isolation boundary cannot carry: the task's doing, so the
    check ends with exit code 3. Raised only where the tests reach the limit on their own,
    never while handling a value the candidate produced (see CandidateFailure)."""


class CandidateFailure(BaseException):
    """The candidate timed out, died, broke the protocol, did not load, or produced something
    that cannot stand where the tests use it. A BaseException, so a test's `except Exception`
    cannot swallow it (and the connection remembers it, so a broader `except` cannot
    either). `message` is the harness's text; `candidate_text` what the candidate supplied."""

    def __init__(self, message, candidate_text=None):
        super().__init__(message)
        self.message = message
        self.candidate_text = candidate_text


class BadMessage(Exception):
    """The candidate's process sent something malformed."""

    def __init__(self, message, candidate_text=None):
        super().__init__(message)
        self.message = message
        self.candidate_text = candidate_text


class NotPlain(Exception):
    """A value that is not plain data (and no hook took it). `what` is the checker's own
    wording; `candidate_text` is set when the value's description came from the candidate."""

    def __init__(self, what, candidate_text=None):
        super().__init__(what)
        self.what = what
        self.candidate_text = candidate_text


def clip(text):
    """Candidate-supplied text for a report: a string, at most MAX_TEXT characters."""
    if text is None:
        return None
    if type(text) is not str:
        text = repr(text) if type(text) in (int, bytes) else "(not text)"
    return text[:MAX_TEXT]


# ----------------------------------------------------------------------------------------
# Reports.

_report_fd = None


def take_report_channel():
    """Keeps the check's standard output for reports alone and points descriptor 1 and
    sys.stdout at standard error for everything else (the tests' prints, pytest's output)."""
    global _report_fd
    sys.stdout.flush()
    _report_fd = os.dup(1)
    os.set_inheritable(_report_fd, False)
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def report(kind, message=None, candidate_text=None, **fields):
    """One line for farm (see the module's docstring)."""
    line = {"kind": kind}
    if kind != "summary":
        line["message"] = message
        line["candidate_text"] = clip(candidate_text)
    line.update(fields)
    data = ("farm-harness: %s\n" % json.dumps(line, ensure_ascii=True)).encode("ascii")
    sys.stderr.flush()
    fd = _report_fd if _report_fd is not None else 1
    while data:
        data = data[os.write(fd, data):]


def report_failure(error, stream=None):
    """Prints where a check failed, to standard error, without the traceback module
    (importing it costs more than the rest of a failing check)."""
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
    print("Traceback (most recent call last):\n%s\n%s%s" % ("\n".join(lines[-6:]), type(error).__name__, ": " + text if text else ""),
          file=stream or sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------
# Plain data <-> JSON-ready tagged lists.

PLAIN_TAGS = {list: "l", tuple: "t", set: "S", frozenset: "F"}
TAG_TYPES = {"l": list, "t": tuple, "S": set, "F": frozenset}


def encode(value, other=None, depth=0):
    """Encodes plain data, exact types only. `other(value, depth)` encodes what is not plain
    (a side's references) or raises NotPlain; without it anything else is NotPlain."""
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
        return ["y", base64.b64encode(value).decode("ascii")]
    if depth >= MAX_DEPTH:
        raise NotPlain("a value nested more than %d levels deep" % MAX_DEPTH)
    tag = PLAIN_TAGS.get(kind)
    if tag is not None:
        return [tag, [encode(item, other, depth + 1) for item in value]]
    if kind is dict:
        return ["d", [[encode(k, other, depth + 1), encode(v, other, depth + 1)] for k, v in value.items()]]
    if other is not None:
        return other(value, depth)
    raise NotPlain("a value of type %s.%s" % (kind.__module__, kind.__qualname__))


def decode(node, other=None, depth=0):
    """Rebuilds plain data from its encoding, refusing anything malformed. `other(tag, rest,
    depth)` decodes a side's own tags; it returns NotImplemented for a tag it does not know."""
    if type(node) is not list or not node or type(node[0]) is not str:
        raise BadMessage("a message holds something that is not an encoded value")
    tag, rest = node[0], node[1:]
    if depth > MAX_DEPTH:
        raise BadMessage("a message nests values too deeply")
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
            return base64.b64decode(rest[0], validate=True)
        if tag in TAG_TYPES and len(rest) == 1 and type(rest[0]) is list:
            return TAG_TYPES[tag]([decode(item, other, depth + 1) for item in rest[0]])
        if tag == "d" and len(rest) == 1 and type(rest[0]) is list:
            result = {}
            for pair in rest[0]:
                if type(pair) is not list or len(pair) != 2:
                    raise BadMessage("a dict entry in a message is not a pair")
                key = decode(pair[0], other, depth + 1)
                result[key] = decode(pair[1], other, depth + 1)
            return result
        if other is not None:
            value = other(tag, rest, depth)
            if value is not NotImplemented:
                return value
    except (ValueError, TypeError, OverflowError, RecursionError) as error:
        raise BadMessage("a message holds a malformed value", "%s: %s" % (tag, error))
    raise BadMessage("a message holds an unknown or malformed tag", tag)


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


# ----------------------------------------------------------------------------------------
# Framing over a socket.

class Channel:
    """Length-prefixed JSON messages over one descriptor."""

    def __init__(self, fd):
        self.fd = fd
        self.buffer = b""

    def send(self, message):
        data = json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii")
        if len(data) > MAX_MESSAGE:
            raise NotPlain("a message of %d bytes, over the %d-byte limit" % (len(data), MAX_MESSAGE))
        payload = struct.pack(">I", len(data)) + data
        while payload:
            payload = payload[os.write(self.fd, payload):]

    def _read_exact(self, count, deadline):
        while len(self.buffer) < count:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError()
                ready, _, _ = select.select([self.fd], [], [], remaining)
                if not ready:
                    raise TimeoutError()
            chunk = os.read(self.fd, max(65536, count - len(self.buffer)))
            if not chunk:
                raise EOFError()
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def receive(self, deadline=None):
        (length,) = struct.unpack(">I", self._read_exact(4, deadline))
        if length > MAX_MESSAGE:
            raise BadMessage("a message over the size limit")
        try:
            message = json.loads(self._read_exact(length, deadline))
        except (ValueError, RecursionError):
            raise BadMessage("a message that is not JSON")
        if type(message) is not dict or type(message.get("op")) is not str:
            raise BadMessage("a message without an op")
        return message


# ----------------------------------------------------------------------------------------
# Exceptions as messages.

# Built-in exceptions never raised on the candidate's behalf: they would stop the checker
# (or the tests' iteration) rather than fail a call.
ENDS_THE_CHECK = ("SystemExit", "KeyboardInterrupt", "GeneratorExit")
ENDS_ITERATION = ("StopIteration", "StopAsyncIteration")


def exception_message(error, encode_other=None):
    """An exception as a "raise" message: the names of its classes (most derived first) and
    its arguments as plain data (or, with `encode_other`, also references)."""
    names = [klass.__name__ for klass in type(error).__mro__][:32]
    try:
        args = encode(list(error.args), encode_other)
    except (NotPlain, RecursionError):
        try:
            args = encode([str(error)[:2000]])
        except Exception:
            args = encode(["(an exception whose text could not be read)"])
    return {"op": "raise", "types": names, "args": args}


def first_known_class(names, trusted_names=None):
    """The class to raise for a "raise" message's class names: the first that the prompt
    (trusted code) defines as an exception class or that is a built-in exception. Returns
    (class, None) or (None, CandidateFailure)."""
    import builtins

    if type(names) is not list or not names or any(type(n) is not str for n in names):
        raise BadMessage("an exception without class names")
    for name in names:
        found = (trusted_names or {}).get(name)
        if not (isinstance(found, type) and issubclass(found, Exception)):
            found = getattr(builtins, name, None)
        if not (isinstance(found, type) and issubclass(found, BaseException)):
            continue
        if issubclass(found, (SystemExit, KeyboardInterrupt, GeneratorExit)) or found in (BaseException, BaseExceptionGroup):
            return None, CandidateFailure("the candidate raised an exception that ends the check", names[0])
        return found, None
    return None, CandidateFailure("the candidate raised an exception of a class the checker does not know", names[0])


def build_exception(klass, args):
    """An instance of `klass` from plain arguments. StopIteration and StopAsyncIteration
    never cross as themselves (they would end a loop of the tests early, as `all(map(...))`
    over a candidate that raises it): they become RuntimeError, as PEP 479 does in
    generators."""
    if issubclass(klass, (StopIteration, StopAsyncIteration)):
        return RuntimeError("the candidate raised %s" % ("StopIteration" if issubclass(klass, StopIteration) else "StopAsyncIteration"))
    try:
        return klass(*args)
    except Exception:
        return klass(*[str(a) for a in args])
