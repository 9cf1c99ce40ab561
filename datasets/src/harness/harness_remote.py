"""Unit-test mode's proxies: the candidate's modules, functions, classes and objects as the
tests in the checker see them, while the real ones live in the candidate's process.

- A candidate module is a ProxyModule in sys.modules: reading a name fetches it (plain data
  as a fresh copy, anything else as a proxy), setting one sets it in the candidate's module
  (the tests' functions cross as callbacks, so monkeypatching works), `import *` takes the
  names the module would give.
- A candidate object crosses as a handle; here it is a proxy, one per handle for the whole
  check (so `is` between proxies is the candidate's identity, and a method returning self
  gives the same proxy). Its class is a local class made for the candidate's class, with
  the candidate's hierarchy among its own classes (isinstance works) and exactly the special
  methods the candidate's class has (len, iter, getitem, call, context managers, operators,
  ...), each performing the same operation in the candidate's process, where any reflection
  happens. Attribute reads and writes go there too.
- A candidate exception crosses by value: an instance of a local stand-in class named like
  the candidate's, whose bases follow the candidate's MRO among its own exception classes and
  the built-in ones (so `except IndexError` catches an `EmptyError(IndexError)`), with its
  arguments, its attributes and its text.

Comparisons and operators never let a candidate object stand for plain data: comparing one
with plain data (`obj == 3`, `3 in [obj]`) fails the check, and an operator combining one
with the tests' plain data must give back a candidate object. Otherwise an object whose
`__eq__` is always true, or whose `__sub__` answers 0 to whatever the tests subtract, would
pass any test expecting a plain answer. Between two candidate objects the candidate decides,
as it would in-process (that is what a test of its `__eq__` tests).
"""

import builtins
import keyword
import sys
import types

from harness_boundary import (ENDS_THE_CHECK, BadMessage, NotPlain, build_exception, decode,
                              encode, first_known_class)

MAX_CLASSES = 10000
# Names a test runner reads from a test module as directions, never taken from the candidate
# by a star import: module fixtures, the load_tests protocol, marks, plugins; and prefixes
# of what pytest and unittest collect as tests.
RUNNER_NAMES = frozenset(("load_tests", "setUpModule", "tearDownModule", "setup_module", "teardown_module",
                          "setup_function", "teardown_function", "setup", "teardown", "pytestmark", "pytest_plugins"))
RUNNER_PREFIXES = ("test", "Test", "pytest")
# What an exception's own attributes may not replace (unittest calls with_traceback, say).
BASE_NAMES = frozenset(dir(BaseException))
_current = None  # the check's Remote: one check per process


def remote():
    return _current


class RemoteType(type):
    """The metaclass of the local classes standing for the candidate's classes."""

    def __new__(mcs, name, bases, namespace, _farm_internal=False):
        if not _farm_internal:
            export = any(remote().is_export(base) for base in bases)
            message = "the tests define class %s on top of a class of the candidate's module, which lives in another process" % name
            raise remote().limit_or_failure(export, message)
        return super().__new__(mcs, name, bases, namespace)

    def __init__(cls, name, bases, namespace, _farm_internal=False):
        super().__init__(name, bases, namespace)

    def __call__(cls, *args, **kwargs):
        return remote().do("call", (cls,) + args, kwargs, subject=cls)

    def __getattr__(cls, name):
        if name.startswith("_farm"):
            raise AttributeError(name)
        return remote().do("getattr", (cls, name))

    def __setattr__(cls, name, value):
        remote().do("setattr", (cls, name, value), subject=cls)

    def __delattr__(cls, name):
        remote().do("delattr", (cls, name))

    def __dir__(cls):
        return remote().typed("dir", (cls,), list)

    def __iter__(cls):  # an Enum's members, say
        return remote().do("iter", (cls,))

    def __len__(cls):
        return remote().typed("len", (cls,), int)

    def __getitem__(cls, key):
        return remote().do("getitem", (cls, key))

    def __contains__(cls, item):
        return remote().typed("contains", (cls, item), bool)

    def __repr__(cls):
        return "<class '%s.%s'>" % (cls.__module__, cls.__qualname__)


class RemoteObject(metaclass=RemoteType, _farm_internal=True):
    """The base of every candidate object's proxy. The handle is its one slot; everything
    else is looked up in the candidate's process."""

    __slots__ = ("_farm_handle", "__weakref__")

    def __getattr__(self, name):
        if name.startswith("_farm"):
            raise AttributeError(name)
        return remote().do("getattr", (self, name))

    def __setattr__(self, name, value):
        remote().do("setattr", (self, name, value), subject=self)

    def __delattr__(self, name):
        remote().do("delattr", (self, name))

    def __bool__(self):
        return remote().typed("bool", (self,), bool)

    def __str__(self):
        return remote().typed("str", (self,), str)

    def __repr__(self):
        return remote().typed("repr", (self,), str)

    def __format__(self, spec):
        return remote().typed("format", (self, spec), str)

    def __dir__(self):
        return remote().typed("dir", (self,), list)

    def __copy__(self):
        return remote().do("copy", (self,))

    def __deepcopy__(self, memo):
        return remote().do("deepcopy", (self,))

    def __reduce_ex__(self, protocol):
        raise remote().connection.fail("the tests pickle an object the candidate handed back; it lives in another process")

    def __reduce__(self):
        raise remote().connection.fail("the tests pickle an object the candidate handed back; it lives in another process")

    def __hash__(self):
        return remote().typed("hash", (self,), int)


def _comparison(action):
    def compare(self, other):
        return remote().operate(action, (self, other), comparison=True)
    compare.__name__ = "__%s__" % action
    return compare


for _action in ("eq", "ne", "lt", "le", "gt", "ge"):
    type.__setattr__(RemoteObject, "__%s__" % _action, _comparison(_action))


def _binary(action, reflected):
    def apply(self, other):
        return remote().operate(action, (other, self) if reflected else (self, other), comparison=False)
    return apply


def _typed(action, kind):
    def apply(self, *args):
        return remote().typed(action, (self,) + args, kind)
    return apply


def _plain(action):
    def apply(self, *args):
        return remote().do(action, (self,) + args)
    return apply


def _coroutine(self, *args):
    raise remote().connection.fail("the tests await or iterate asynchronously an object of the candidate; coroutines cannot cross")


def _next(self):
    return remote().do("next", (self,))


def _call(self, *args, **kwargs):
    return remote().do("call", (self,) + args, kwargs, subject=self)


def _exit(self, kind, error, traceback):
    return remote().exit(self, error)


def _pow(self, other, modulo=None):
    if modulo is None:
        return remote().operate("pow", (self, other), comparison=False)
    return remote().do("pow", (self, other, modulo))


def _foreign_class(self):
    raise remote().connection.fail("the tests check the class of a candidate object that subclasses a built-in type; "
                                   "its proxy is no instance of that type")


# What a candidate class's proxy gets for each special method the class has.
PROTOCOL_METHODS = {
    "__len__": _typed("len", int), "__iter__": _plain("iter"), "__next__": _next, "__reversed__": _plain("reversed"),
    "__contains__": _typed("contains", bool), "__getitem__": _plain("getitem"), "__setitem__": _plain("setitem"),
    "__delitem__": _plain("delitem"), "__call__": _call, "__enter__": _plain("enter"), "__exit__": _exit,
    "__index__": _typed("index", int), "__int__": _typed("int", int), "__float__": _typed("float", float),
    "__complex__": _typed("complex", complex), "__bytes__": _typed("bytes", bytes), "__round__": _plain("round"),
    "__trunc__": _plain("trunc"), "__floor__": _plain("floor"), "__ceil__": _plain("ceil"), "__abs__": _plain("abs"),
    "__neg__": _plain("neg"), "__pos__": _plain("pos"), "__invert__": _plain("invert"),
    "__fspath__": _typed("fspath", (str, bytes)), "__length_hint__": _typed("length_hint", int),
    "__await__": _coroutine, "__aiter__": _coroutine, "__anext__": _coroutine, "__aenter__": _coroutine,
    "__aexit__": _coroutine, "__pow__": _pow, "__rpow__": _binary("pow", True),
}
for _action in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "divmod", "lshift", "rshift", "and",
                "xor", "or"):
    PROTOCOL_METHODS["__%s__" % _action] = _binary(_action, False)
    PROTOCOL_METHODS["__r%s__" % _action] = _binary(_action, True)
    if _action != "divmod":
        PROTOCOL_METHODS["__i%s__" % _action] = _binary("i" + _action, False)
PROTOCOL_METHODS["__ipow__"] = _binary("ipow", False)


class RemoteMethod:
    """A method of a candidate object, as the tests read it (`stack.push`): calling it calls
    the method there; reading it left nothing behind in the candidate's table."""

    __slots__ = ("_farm_owner", "_farm_name")

    def __init__(self, owner, name):
        self._farm_owner = owner
        self._farm_name = name

    def __call__(self, *args, **kwargs):
        return remote().do("callmethod", (self._farm_owner, self._farm_name) + args, kwargs, subject=self._farm_owner)

    def __getattr__(self, name):
        if name.startswith("_farm"):
            raise AttributeError(name)
        return remote().do("methodattr", (self._farm_owner, self._farm_name, name))

    def __eq__(self, other):
        if type(other) is not RemoteMethod:
            return NotImplemented
        return self._farm_owner is other._farm_owner and self._farm_name == other._farm_name

    def __hash__(self):
        return hash((id(self._farm_owner), self._farm_name))

    def __repr__(self):
        return "<bound method %s of a candidate object>" % self._farm_name

    def __reduce_ex__(self, protocol):
        raise remote().connection.fail("the tests pickle a method of the candidate; it lives in another process")


class ProxyModule(types.ModuleType):
    """A candidate module in the tests' sys.modules."""

    # Module attributes the import machinery and inspect read: answered here, so that they
    # never reach the candidate (inspect.getmodule reads every module's __file__).
    LOCAL = ("__file__", "__path__", "__cached__", "__builtins__", "__warningregistry__")

    def __init__(self, name, handle):
        super().__init__(name)
        object.__setattr__(self, "_farm_handle", handle)

    def __getattr__(self, name):
        if name.startswith("_farm") or name in ProxyModule.LOCAL:
            raise AttributeError(name)
        if name == "__all__":
            # What `from solution import *` takes; the importer's names are its caller's.
            return remote().star_names(self, sys._getframe(1).f_globals)
        value = remote().do("getattr", (self, name))
        remote().mark_export(value)
        return value

    def __setattr__(self, name, value):
        if name.startswith("__") and name.endswith("__"):
            object.__setattr__(self, name, value)
        else:
            remote().do("setattr", (self, name, value), subject=self)

    def __delattr__(self, name):
        remote().do("delattr", (self, name))

    def __dir__(self):
        return remote().typed("dir", (self,), list)

    def __repr__(self):
        return "<candidate module %r>" % self.__name__


def _stand_in_str(self):
    text = self.__dict__.get("_farm_text")
    return text if type(text) is str else BaseException.__str__(self)


class Remote:
    """The check's proxies and the candidate's classes, decoded as the candidate hands them
    over, and the rules that keep its objects from standing for plain data."""

    def __init__(self, connection):
        global _current
        _current = self
        self.connection = connection
        self.proxies = {}
        self.classes = {}
        self.handle_of = {}  # id(local class or proxy module) -> handle
        self.derived = set()  # ids of local classes made from the candidate's descriptions
        self.exports = set()
        self.crossed = {}  # id -> exception, for exceptions that came from the candidate
        connection.decode_other = self.decode_other
        connection.encode_hook = self.encode_hook
        connection.raise_hook = self.raise_hook
        connection.on_classes = self.add_classes

    # Requests.
    def do(self, action, args, kwargs=None, subject=None):
        return self.connection.request({"op": "do", "action": action}, args, kwargs or {}, self.is_export(subject))

    def typed(self, action, args, kind):
        value = self.do(action, args)
        if type(value) not in (kind if type(kind) is tuple else (kind,)):
            raise self.connection.fail("the candidate answered %s with something of the wrong type" % action)
        return value

    def operate(self, action, operands, comparison):
        """An operator on a candidate object and another operand (see the module's
        docstring for why plain data is refused or checked)."""
        other = operands[1] if self.is_proxy(operands[0]) else operands[0]
        if self.is_proxy(other):
            return self.do(action, operands)
        try:
            encode(other, self.plain_hook)
        except NotPlain:
            return NotImplemented  # the tests' own object decides, as Python would let it
        if comparison:
            raise self.connection.fail("the tests compared an object the candidate handed back with plain data; "
                                       "a candidate object never stands for plain data")
        value = self.do(action, operands)
        if not self.is_proxy(value):
            raise self.connection.fail("an operator on a candidate object and the tests' plain data gave plain data; "
                                       "a candidate object never stands for plain data")
        return value

    def exit(self, obj, error):
        """`with obj:` ends: the candidate's __exit__ sees the exception (a stand-in for one of
        the tests' own classes), but may not suppress a failure of the tests: a failed
        assertion of theirs, the runner's skip or fail, the boundary's own failures."""
        sent = error if error is None or self.sendable(error) else \
            (Exception if isinstance(error, Exception) else BaseException)("an exception of the tests")
        answer = self.do("exit", (obj, sent))
        if error is None or not answer:
            return False
        if not isinstance(error, Exception) or isinstance(error, AssertionError) and id(error) not in self.crossed:
            raise self.connection.fail("the candidate's __exit__ suppressed a failure of the tests")
        return True

    def sendable(self, error):
        return type(error).__module__ == "builtins" or id(type(error)) in self.derived

    # Kinds of objects.
    def is_proxy(self, value):
        return isinstance(value, (RemoteObject, RemoteMethod, ProxyModule)) or id(value) in self.derived and isinstance(value, type)

    def is_export(self, value):
        return value is not None and (id(value) in self.exports or isinstance(value, ProxyModule))

    def mark_export(self, value):
        if isinstance(value, (RemoteObject, RemoteType)) or id(value) in self.derived:
            self.exports.add(id(value))

    def star_names(self, module, importer):
        """The names a star import of the candidate's `module` gives the tests (`importer`:
        the importing module's globals): the candidate's own functions and classes among
        the names it lists in `__all__` (or, without one, its public names), and of those
        only names that are not dunders, not builtins, not already the tests' (an import
        of theirs, a name they defined) and not names the test runners read from a test
        module as directions (fixtures of the module, plugins, marks, tests to collect).
        Otherwise a candidate could put its own `all`, `sorted` or `pytest` under the
        tests' code, and through them decide the verdict or choose its failure's label."""
        try:
            names = self.do("getattr", (module, "__all__"))
        except AttributeError:
            names = [n for n in self.typed("dir", (module,), list) if type(n) is str and not n.startswith("_")]
        if type(names) not in (list, tuple) or any(type(n) is not str for n in names):
            raise self.connection.fail("the __all__ of the candidate's module is not a list of names")
        taken = []
        for name in names:
            if name in taken or not name.isidentifier() or keyword.iskeyword(name) or name.startswith("__") \
                    or hasattr(builtins, name) or name in importer or name in RUNNER_NAMES \
                    or name.startswith(RUNNER_PREFIXES):
                continue
            value = self.do("getattr", (module, name))
            if callable(value) and self.is_proxy(value) and not isinstance(value, ProxyModule) \
                    and type(value).__name__ != "module":
                self.mark_export(value)
                taken.append(name)
        return taken

    def limit_or_failure(self, from_tests, message):
        if from_tests:
            return self.connection.limit_reached(message)
        return self.connection.fail(message)

    # Encoding the tests' values for the candidate.
    def encode_hook(self, value, depth):
        if isinstance(value, (RemoteObject, ProxyModule)):
            return ["h", object.__getattribute__(value, "_farm_handle")]
        if type(value) is RemoteMethod:
            owner = value._farm_owner
            handle = self.handle_of[id(owner)] if isinstance(owner, type) else object.__getattribute__(owner, "_farm_handle")
            return ["mref", handle, value._farm_name]
        if isinstance(value, type):
            if id(value) in self.handle_of:
                return ["h", self.handle_of[id(value)]]
            if getattr(builtins, value.__name__, None) is value:
                return ["bt", value.__name__]
        if isinstance(value, BaseException) and self.sendable(value):
            return ["x", self.encode_hook(type(value), depth) or ["bt", "Exception"],
                    encode(list(value.args), self.connection.encode_other, depth + 1)]
        if type(value) in (RemoteType,) or id(type(value)) in self.derived:
            raise NotPlain("a value made from the candidate's data", type(value).__name__)
        return NotImplemented

    def plain_hook(self, value, depth):
        raise NotPlain("not plain")

    # Decoding what the candidate sends.
    def decode_other(self, tag, rest, depth):
        if tag == "h" and len(rest) == 2 and type(rest[0]) is int:
            return self.proxy(rest[0], self.local_class(rest[1]))
        if tag == "k" or tag == "bt":
            return self.local_class([tag] + rest)
        if tag == "m" and len(rest) == 2 and type(rest[1]) is str:
            owner = self.proxies.get(rest[0], self.classes.get(rest[0]))  # (not `or`: a proxy's truth is remote)
            if owner is not None:
                return RemoteMethod(owner, rest[1])
        if tag == "x" and len(rest) == 4:
            return self.exception(rest, depth)
        return NotImplemented

    def proxy(self, handle, klass):
        found = self.proxies.get(handle)
        if found is not None:
            return found
        if not (isinstance(klass, RemoteType) and klass is not RemoteObject):
            raise BadMessage("a handle to an object of a class that is not described")
        proxy = object.__new__(klass)
        object.__setattr__(proxy, "_farm_handle", handle)
        self.proxies[handle] = proxy
        return proxy

    def local_class(self, ref):
        if type(ref) is list and len(ref) == 2 and ref[0] == "bt" and type(ref[1]) is str:
            found = getattr(builtins, ref[1], None)
            if isinstance(found, type):
                return found
        if type(ref) is list and len(ref) == 2 and ref[0] == "k" and ref[1] in self.classes:
            return self.classes[ref[1]]
        raise BadMessage("a reference to an unknown class", repr(ref)[:100])

    def add_classes(self, descriptions):
        if type(descriptions) is not list or len(self.classes) + len(descriptions) > MAX_CLASSES:
            raise BadMessage("too many or malformed class descriptions")
        for description in descriptions:
            if type(description) is not dict or type(description.get("id")) is not int or description["id"] in self.classes:
                raise BadMessage("a malformed class description")
            name = description.get("name")
            if type(name) is not str or not name or "\0" in name or len(name) > 200:
                raise BadMessage("a class description without a usable name", name)
            qualname = description.get("qualname") if type(description.get("qualname")) is str else name
            module = description.get("module") if type(description.get("module")) is str else "?"
            bases = [self.local_class(b) for b in description.get("bases") or []]
            if description.get("exception") is True:
                klass = self.stand_in(name, qualname, module, bases, description.get("attrs"))
            else:
                klass = self.remote_class(name, qualname, module, bases, description)
            self.classes[description["id"]] = klass
            self.handle_of[id(klass)] = description["id"]
            self.derived.add(id(klass))

    def stand_in(self, name, qualname, module, bases, attrs):
        bases = tuple(b for b in bases if isinstance(b, type) and issubclass(b, BaseException)) or (Exception,)
        namespace = {"__module__": module[:200], "__qualname__": qualname[:200], "__str__": _stand_in_str}
        # Plain class attributes of the candidate's class (`code = 400`): data, copied.
        for entry in attrs if type(attrs) is list else []:
            if type(entry) is list and len(entry) == 2 and type(entry[0]) is str and entry[0].isidentifier() \
                    and not entry[0].startswith("_") and entry[0] not in BASE_NAMES:
                namespace[entry[0]] = decode(entry[1])
        for attempt in (bases, bases[:1], (Exception,)):
            try:
                return type(name, attempt, dict(namespace))
            except (TypeError, ValueError):
                continue
        raise BadMessage("an exception class that cannot be rebuilt", name)

    def remote_class(self, name, qualname, module, bases, description):
        bases = tuple(b for b in bases if isinstance(b, RemoteType) and b is not RemoteObject) or (RemoteObject,)
        namespace = {"__module__": module[:200], "__qualname__": qualname[:200], "__slots__": (), "__doc__": None}
        protocols = description.get("protocols") or []
        if type(protocols) is not list:
            raise BadMessage("a malformed class description")
        for method in protocols:
            if method in PROTOCOL_METHODS:
                namespace[method] = PROTOCOL_METHODS[method]
        if "__contains__" not in namespace and ("__iter__" in namespace or "__getitem__" in namespace):
            # `x in obj` falls back to iterating: done there, where the elements are.
            namespace["__contains__"] = PROTOCOL_METHODS["__contains__"]
        if description.get("hashable") is not True:
            namespace["__hash__"] = None
        if description.get("builtin_based") is True:
            namespace["__class__"] = property(_foreign_class)
        for attempt in (bases, (RemoteObject,)):
            try:
                return RemoteType(name, attempt, dict(namespace), _farm_internal=True)
            except (TypeError, ValueError):
                continue
        raise BadMessage("a class that cannot be rebuilt", name)

    def exception(self, rest, depth):
        klass = self.local_class(rest[0])
        if not (isinstance(klass, type) and issubclass(klass, BaseException)):
            raise BadMessage("an exception of a class that is not an exception")
        args = decode(rest[1], self.connection._decode_other, depth + 1)
        if type(args) is not list or type(rest[2]) is not list:
            raise BadMessage("malformed exception arguments")
        if id(klass) in self.derived:
            try:
                error = klass(*args)
            except Exception:
                error = klass.__new__(klass)
                error.args = tuple(args)
        else:
            error = build_exception(klass, args) if not issubclass(klass, (StopIteration, StopAsyncIteration)) else klass(*args[:1])
        for entry in rest[2][:64]:
            if type(entry) is list and len(entry) == 2 and type(entry[0]) is str and entry[0].isidentifier() \
                    and not entry[0].startswith("__") and not keyword.iskeyword(entry[0]) and entry[0] not in BASE_NAMES:
                try:
                    setattr(error, entry[0], decode(entry[1], self.connection._decode_other, depth + 1))
                except (AttributeError, TypeError):
                    pass
        if id(klass) in self.derived and type(rest[3]) is str:
            error.__dict__["_farm_text"] = rest[3]
        self.crossed[id(error)] = error
        return error

    def raise_hook(self, message):
        """The exception to raise in the tests for the candidate's "raise" message."""
        if "exception" not in message:
            klass, failure = first_known_class(message.get("types"))
            if failure is not None:
                raise self.connection.fail(failure.message, failure.candidate_text)
            args = self.connection.decode(message.get("args", ["l", []]))
            return build_exception(klass, args if type(args) is list else [])
        error = self.connection.decode(message["exception"])
        if not isinstance(error, BaseException):
            raise BadMessage("a raise of something that is not an exception")
        ends = tuple(getattr(builtins, name) for name in ENDS_THE_CHECK)
        if isinstance(error, ends) or not isinstance(error, Exception):
            raise self.connection.fail("the candidate raised an exception that ends the check", type(error).__name__)
        if isinstance(error, (StopIteration, StopAsyncIteration)):
            return build_exception(type(error), [])
        return error


def install_modules(connection, names, handles):
    """Puts a ProxyModule for each of the candidate's modules into sys.modules."""
    remote_objects = Remote(connection)
    if type(handles) is not list or len(handles) != len(names) or any(type(h) is not int for h in handles):
        raise BadMessage("a ready message without the modules")
    for name, handle in zip(names, handles):
        module = ProxyModule(name, handle)
        remote_objects.proxies[handle] = module
        remote_objects.handle_of[id(module)] = handle
        sys.modules[name] = module
    return remote_objects
