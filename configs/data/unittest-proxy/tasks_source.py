"""The unit-test tasks of build.py: (id, instruction, stub, tests, solution, wrong variants).
Each wrong variant is a list of (old, new) replacements applied to the solution: an honest
but subtly wrong sample."""

TASKS = []


def task(id, instruction, stub, tests, solution, wrong):
    TASKS.append({"id": id, "instruction": instruction, "stub": stub, "tests": tests, "solution": solution, "wrong": wrong})


# 1. A stack with its own exception (unittest).
task("stack", "Write solution.py with class Stack (push returns the stack, pop, peek, is_empty, len, iteration from top to "
     "bottom, truthiness) and EmptyStackError, a subclass of IndexError, raised by pop and peek on an empty stack.",
     "class EmptyStackError(IndexError):\n    pass\n\n\nclass Stack:\n    pass\n",
     {"test_stack.py": '''import unittest

from solution import EmptyStackError, Stack


class StackTest(unittest.TestCase):
    def setUp(self):
        self.stack = Stack()

    def tearDown(self):
        self.stack = None

    def test_push_returns_the_stack(self):
        self.assertIs(self.stack.push(1), self.stack)
        self.stack.push(2).push(3)
        self.assertEqual(len(self.stack), 3)

    def test_pop_and_peek(self):
        for value in ("a", "b", "c"):
            self.stack.push(value)
        self.assertEqual(self.stack.peek(), "c")
        self.assertEqual(self.stack.pop(), "c")
        self.assertEqual(self.stack.pop(), "b")
        self.assertEqual(len(self.stack), 1)

    def test_iteration_is_top_first(self):
        self.stack.push(1).push(2).push(3)
        self.assertEqual(list(self.stack), [3, 2, 1])
        self.assertEqual(len(self.stack), 3)

    def test_truthiness(self):
        self.assertFalse(self.stack)
        self.assertTrue(self.stack.is_empty())
        self.stack.push(None)
        self.assertTrue(self.stack)
        self.assertFalse(self.stack.is_empty())

    def test_empty_errors(self):
        with self.assertRaises(EmptyStackError):
            self.stack.pop()
        self.assertRaises(IndexError, self.stack.peek)
        with self.assertRaisesRegex(EmptyStackError, "empty"):
            self.stack.peek()

    def test_values_are_kept_as_given(self):
        self.stack.push([1, 2]).push({"k": (1, 2)})
        self.assertEqual(self.stack.pop(), {"k": (1, 2)})
        self.assertEqual(self.stack.pop(), [1, 2])
        self.assertIsInstance(self.stack, Stack)
'''},
     '''class EmptyStackError(IndexError):
    pass


class Stack:
    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)
        return self

    def pop(self):
        if not self._items:
            raise EmptyStackError("pop from an empty stack")
        return self._items.pop()

    def peek(self):
        if not self._items:
            raise EmptyStackError("peek at an empty stack")
        return self._items[-1]

    def is_empty(self):
        return not self._items

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return iter(self._items[::-1])
''',
     [[("return iter(self._items[::-1])", "return iter(self._items)")],
      [('raise EmptyStackError("peek at an empty stack")', 'raise IndexError("peek at an empty stack")')],
      [("        self._items.append(item)\n        return self", "        self._items.append(item)")]])

# 2. An LRU cache (pytest: fixtures, parametrize).
task("lru_cache", "Write solution.py with class LRUCache(capacity): get(key, default=None) (a hit makes the key most "
     "recent), put(key, value) (evicts the least recently used key past capacity), len, `in` (does not change "
     "recency), keys() from least to most recent. A capacity below 1 raises ValueError.",
     "class LRUCache:\n    pass\n",
     {"test_lru.py": '''import pytest

from solution import LRUCache


@pytest.fixture
def cache():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    return c


def test_get_hit_and_miss(cache):
    assert cache.get("a") == 1
    assert cache.get("zzz") is None
    assert cache.get("zzz", -1) == -1


def test_eviction_is_least_recent(cache):
    cache.get("a")
    cache.put("c", 3)
    assert "b" not in cache
    assert "a" in cache and "c" in cache
    assert cache.keys() == ["a", "c"]
    assert len(cache) == 2


def test_put_updates_value_and_recency(cache):
    cache.put("a", 10)
    cache.put("c", 3)
    assert cache.get("a") == 10
    assert cache.get("b") is None


def test_contains_does_not_touch(cache):
    assert "a" in cache
    cache.put("c", 3)
    assert "a" not in cache


@pytest.mark.parametrize("capacity", [0, -1])
def test_bad_capacity(capacity):
    with pytest.raises(ValueError):
        LRUCache(capacity)


@pytest.mark.parametrize("n", [1, 3, 10])
def test_many(n):
    c = LRUCache(n)
    for i in range(3 * n):
        c.put(i, i * i)
    assert c.keys() == list(range(2 * n, 3 * n))
    assert all(c.get(i) == i * i for i in range(2 * n, 3 * n))
'''},
     '''from collections import OrderedDict


class LRUCache:
    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._data = OrderedDict()

    def get(self, key, default=None):
        if key not in self._data:
            return default
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key, value):
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)

    def keys(self):
        return list(self._data)
''',
     [[("        self._data.move_to_end(key)\n        return self._data[key]", "        return self._data[key]")],
      [("self._data.popitem(last=False)", "self._data.popitem()")],
      [("if capacity < 1:", "if capacity < 0:")]])

# 3. A bank account with a transaction context manager and an exception with attributes.
task("bank_account", "Write solution.py with InsufficientFunds(ValueError) carrying .needed (the missing amount) and "
     "class Account(owner, balance=0): deposit(amount) and withdraw(amount) (amount must be positive, else ValueError; "
     "withdraw past the balance raises InsufficientFunds), transfer(other, amount), history (list of signed amounts), "
     "and transaction(): a context manager that restores balance and history if its block raises (the exception "
     "still propagates). owner may be reassigned. Account.bank_name is 'farm bank'.",
     "class InsufficientFunds(ValueError):\n    pass\n\n\nclass Account:\n    pass\n",
     {"test_account.py": '''import pytest

import solution
from solution import Account, InsufficientFunds


def test_deposit_withdraw():
    a = Account("ann", 10)
    a.deposit(5)
    a.withdraw(3)
    assert a.balance == 12
    assert a.history == [5, -3]
    assert Account.bank_name == "farm bank"


def test_insufficient_funds_carries_the_shortfall():
    a = Account("bob", 5)
    with pytest.raises(InsufficientFunds) as caught:
        a.withdraw(8)
    assert caught.value.needed == 3
    assert isinstance(caught.value, ValueError)
    assert a.balance == 5


@pytest.mark.parametrize("amount", [0, -5])
def test_amounts_must_be_positive(amount):
    a = Account("cy")
    with pytest.raises(ValueError):
        a.deposit(amount)
    with pytest.raises(ValueError):
        a.withdraw(amount)


def test_transfer_passes_accounts_back_and_forth():
    a, b = Account("a", 10), Account("b")
    a.transfer(b, 4)
    assert (a.balance, b.balance) == (6, 4)
    with pytest.raises(solution.InsufficientFunds):
        b.transfer(a, 100)
    assert (a.balance, b.balance) == (6, 4)


def test_transaction_rolls_back():
    a = Account("dee", 100)
    with pytest.raises(KeyError):
        with a.transaction():
            a.withdraw(30)
            a.deposit(5)
            raise KeyError("boom")
    assert a.balance == 100
    assert a.history == []
    with a.transaction() as same:
        assert same is a
        a.withdraw(1)
    assert a.balance == 99


def test_owner_can_change():
    a = Account("eve")
    a.owner = "eve2"
    assert a.owner == "eve2"
'''},
     '''class InsufficientFunds(ValueError):
    def __init__(self, needed):
        super().__init__("insufficient funds: %s more needed" % needed)
        self.needed = needed


class Account:
    bank_name = "farm bank"

    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance
        self.history = []

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.balance += amount
        self.history.append(amount)

    def withdraw(self, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        if amount > self.balance:
            raise InsufficientFunds(amount - self.balance)
        self.balance -= amount
        self.history.append(-amount)

    def transfer(self, other, amount):
        self.withdraw(amount)
        other.deposit(amount)

    def transaction(self):
        return _Transaction(self)


class _Transaction:
    def __init__(self, account):
        self.account = account

    def __enter__(self):
        self.saved = (self.account.balance, list(self.account.history))
        return self.account

    def __exit__(self, kind, error, traceback):
        if kind is not None:
            self.account.balance, self.account.history = self.saved
        return False
''',
     [[("raise InsufficientFunds(amount - self.balance)", "raise InsufficientFunds(amount)")],
      [("            self.account.balance, self.account.history = self.saved\n", "            self.account.balance = self.saved[0]\n")],
      [("        self.withdraw(amount)\n        other.deposit(amount)", "        other.deposit(amount)\n        self.withdraw(amount)")]])

# 4. A 2-D vector with operators (pytest, approx on plain results, hashing).
task("vector", "Write solution.py with class Vector(x, y): attributes x and y, +, - (between vectors), * and / by a "
     "number (either side for *), unary -, abs() (the length), ==, hash (equal vectors, equal hashes), dot(other), "
     "iteration over (x, y), repr 'Vector(x, y)', and the class method Vector.zero().",
     "class Vector:\n    pass\n",
     {"test_vector.py": '''import math

import pytest

from solution import Vector


def test_arithmetic():
    a, b = Vector(1, 2), Vector(3, -4)
    assert a + b == Vector(4, -2)
    assert b - a == Vector(2, -6)
    assert a * 3 == Vector(3, 6)
    assert 3 * a == Vector(3, 6)
    assert b / 2 == Vector(1.5, -2)
    assert -a == Vector(-1, -2)


def test_length_and_dot():
    assert abs(Vector(3, 4)) == pytest.approx(5.0)
    assert math.isclose(Vector(1, 1).dot(Vector(2, 3)), 5)
    assert Vector(0.1, 0.2).dot(Vector(10, 10)) == pytest.approx(3.0)


def test_equality_and_hash():
    assert Vector(1, 2) == Vector(1, 2)
    assert Vector(1, 2) != Vector(2, 1)
    assert len({Vector(1, 2), Vector(1, 2), Vector(0, 0)}) == 2
    names = {Vector(1, 0): "east", Vector(0, 1): "north"}
    assert names[Vector(0, 1)] == "north"


def test_attributes_iteration_repr():
    v = Vector(5, 7)
    assert (v.x, v.y) == (5, 7)
    x, y = v
    assert [x, y] == [5, 7]
    assert repr(v) == "Vector(5, 7)"
    assert Vector.zero() == Vector(0, 0)
    assert sorted([Vector(3, 4), Vector(0, 1), Vector(1, 1)], key=abs) == [Vector(0, 1), Vector(1, 1), Vector(3, 4)]
'''},
     '''import math


class Vector:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    @classmethod
    def zero(cls):
        return cls(0, 0)

    def __add__(self, other):
        return Vector(self.x + other.x, self.y + other.y)

    def __sub__(self, other):
        return Vector(self.x - other.x, self.y - other.y)

    def __mul__(self, k):
        return Vector(self.x * k, self.y * k)

    __rmul__ = __mul__

    def __truediv__(self, k):
        return Vector(self.x / k, self.y / k)

    def __neg__(self):
        return Vector(-self.x, -self.y)

    def __abs__(self):
        return math.hypot(self.x, self.y)

    def dot(self, other):
        return self.x * other.x + self.y * other.y

    def __eq__(self, other):
        if not isinstance(other, Vector):
            return NotImplemented
        return (self.x, self.y) == (other.x, other.y)

    def __hash__(self):
        return hash((self.x, self.y))

    def __iter__(self):
        yield self.x
        yield self.y

    def __repr__(self):
        return "Vector(%r, %r)" % (self.x, self.y)
''',
     [[("    __rmul__ = __mul__\n", "")],
      [("        return hash((self.x, self.y))", "        return id(self)")],
      [("return Vector(self.x - other.x, self.y - other.y)", "return Vector(other.x - self.x, other.y - self.y)")]])

# 5. An interval set (unittest).
task("interval_set", "Write solution.py with class IntervalSet: add(lo, hi) adds the closed interval [lo, hi] (lo > hi "
     "raises ValueError), merging overlapping or touching intervals; `x in s`; intervals() the sorted list of (lo, hi) "
     "tuples; total_length(); len() the number of disjoint intervals.",
     "class IntervalSet:\n    pass\n",
     {"test_intervals.py": '''import unittest

from solution import IntervalSet


class IntervalSetTest(unittest.TestCase):
    def test_merging(self):
        s = IntervalSet()
        s.add(1, 3)
        s.add(5, 8)
        s.add(2, 4)
        self.assertEqual(s.intervals(), [(1, 4), (5, 8)])
        s.add(4, 5)
        self.assertEqual(s.intervals(), [(1, 8)])
        self.assertEqual(len(s), 1)

    def test_membership(self):
        s = IntervalSet()
        s.add(0, 1)
        s.add(10, 20)
        for x, inside in [(0, True), (1, True), (1.5, False), (10, True), (20, True), (21, False), (-1, False)]:
            with self.subTest(x=x):
                self.assertEqual(x in s, inside)

    def test_total_length(self):
        s = IntervalSet()
        s.add(0, 2.5)
        s.add(3, 4)
        self.assertAlmostEqual(s.total_length(), 3.5)
        self.assertEqual(IntervalSet().total_length(), 0)

    def test_bad_interval(self):
        with self.assertRaises(ValueError):
            IntervalSet().add(3, 1)

    def test_contained_interval(self):
        s = IntervalSet()
        s.add(0, 10)
        s.add(2, 3)
        self.assertEqual(s.intervals(), [(0, 10)])
'''},
     '''class IntervalSet:
    def __init__(self):
        self._intervals = []

    def add(self, lo, hi):
        if lo > hi:
            raise ValueError("lo > hi")
        merged = []
        for a, b in self._intervals:
            if b < lo or a > hi:
                merged.append((a, b))
            else:
                lo, hi = min(lo, a), max(hi, b)
        merged.append((lo, hi))
        self._intervals = sorted(merged)

    def __contains__(self, x):
        return any(a <= x <= b for a, b in self._intervals)

    def intervals(self):
        return list(self._intervals)

    def total_length(self):
        return sum(b - a for a, b in self._intervals)

    def __len__(self):
        return len(self._intervals)
''',
     [[("if b < lo or a > hi:", "if b <= lo or a >= hi:")],
      [("return any(a <= x <= b for a, b in self._intervals)", "return any(a <= x < b for a, b in self._intervals)")],
      [("                lo, hi = min(lo, a), max(hi, b)", "                lo, hi = min(lo, a), hi")]])

# 6. A tokenizer and a parser (two functions, an exception with a position).
task("calculator", "Write solution.py with tokenize(text) -> list of (kind, value) tuples, kind 'NUM' (int value) or 'OP' "
     "(one of + - * / ( ) as a string), skipping spaces; evaluate(text) -> int, with the usual precedence, integer "
     "division //, and parentheses; ParseError(Exception) with attribute .position (index in text) for an unknown "
     "character or a malformed expression (position len(text) when the text ends too early).",
     "class ParseError(Exception):\n    pass\n\n\ndef tokenize(text):\n    pass\n\n\ndef evaluate(text):\n    pass\n",
     {"test_calc.py": '''import pytest

from solution import ParseError, evaluate, tokenize


def test_tokens():
    assert tokenize("12 + (3*4)") == [("NUM", 12), ("OP", "+"), ("OP", "("), ("NUM", 3), ("OP", "*"), ("NUM", 4), ("OP", ")")]
    assert tokenize("") == []
    assert all(map(lambda n: tokenize(str(n)) == [("NUM", n)], range(20)))


@pytest.mark.parametrize("text,value", [("1+2*3", 7), ("(1+2)*3", 9), ("10/3", 3), ("2*(3+4)-5", 9), (" 7 ", 7), ("8-2-1", 5)])
def test_evaluate(text, value):
    assert evaluate(text) == value


def test_unknown_character_position():
    with pytest.raises(ParseError) as caught:
        tokenize("1 + x")
    assert caught.value.position == 4


@pytest.mark.parametrize("text,position", [("1 +", 3), ("(1", 2), ("1 2", 2)])
def test_malformed(text, position):
    with pytest.raises(ParseError) as caught:
        evaluate(text)
    assert caught.value.position == position
'''},
     '''class ParseError(Exception):
    def __init__(self, message, position):
        super().__init__("%s at %d" % (message, position))
        self.position = position


def tokenize(text):
    tokens, i = [], 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            i += 1
        elif c.isdigit():
            j = i
            while j < len(text) and text[j].isdigit():
                j += 1
            tokens.append(("NUM", int(text[i:j])))
            i = j
        elif c in "+-*/()":
            tokens.append(("OP", c))
            i += 1
        else:
            raise ParseError("unexpected %r" % c, i)
    return tokens


def _positions(text):
    out, i = [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
        elif text[i].isdigit():
            out.append(i)
            while i < len(text) and text[i].isdigit():
                i += 1
        else:
            out.append(i)
            i += 1
    return out


def evaluate(text):
    tokens = tokenize(text)
    where = _positions(text)
    pos = [0]

    def at():
        return where[pos[0]] if pos[0] < len(where) else len(text)

    def peek():
        return tokens[pos[0]] if pos[0] < len(tokens) else None

    def take():
        token = peek()
        if token is None:
            raise ParseError("unexpected end", len(text))
        pos[0] += 1
        return token

    def atom():
        here = at()
        kind, value = take()
        if kind == "NUM":
            return value
        if value == "(":
            result = expression()
            if peek() != ("OP", ")"):
                raise ParseError("expected )", at())
            take()
            return result
        raise ParseError("unexpected %r" % value, here)

    def term():
        result = atom()
        while peek() in (("OP", "*"), ("OP", "/")):
            _, op = take()
            right = atom()
            result = result * right if op == "*" else result // right
        return result

    def expression():
        result = term()
        while peek() in (("OP", "+"), ("OP", "-")):
            _, op = take()
            right = term()
            result = result + right if op == "+" else result - right
        return result

    result = expression()
    if peek() is not None:
        raise ParseError("unexpected token", at())
    return result
''',
     [[("            result = result + right if op == \"+\" else result - right", "            result = result + right if op == \"+\" else right - result")],
      [("            raise ParseError(\"unexpected %r\" % c, i)", "            raise ParseError(\"unexpected %r\" % c, i + 1)")],
      [("        elif c in \"+-*/()\":", "        elif c in \"+-*/()x\":")]])

# 7. An event bus with callbacks from the tests.
task("event_bus", "Write solution.py with class EventBus: subscribe(event, callback) returns a function that "
     "unsubscribes it; publish(event, *args, **kwargs) calls the event's callbacks in subscription order with those "
     "arguments and returns how many were called; a callback's exception propagates to publish's caller (the "
     "callbacks after it are not called); subscribers(event) is the number of callbacks.",
     "class EventBus:\n    pass\n",
     {"test_bus.py": '''import pytest

from solution import EventBus


def test_publish_calls_in_order():
    bus, seen = EventBus(), []
    bus.subscribe("a", lambda x: seen.append(("first", x)))
    bus.subscribe("a", lambda x: seen.append(("second", x)))
    bus.subscribe("b", seen.append)
    assert bus.publish("a", 1) == 2
    assert seen == [("first", 1), ("second", 1)]
    assert bus.publish("c", 5) == 0


def test_keyword_arguments_and_payloads():
    bus, seen = EventBus(), []

    def handler(*args, **kwargs):
        seen.append((args, kwargs))

    bus.subscribe("e", handler)
    bus.publish("e", [1, 2], key={"k": None})
    assert seen == [(([1, 2],), {"key": {"k": None}})]


def test_unsubscribe():
    bus, seen = EventBus(), []
    cancel = bus.subscribe("a", seen.append)
    bus.subscribe("a", seen.append)
    assert bus.subscribers("a") == 2
    cancel()
    assert bus.subscribers("a") == 1
    bus.publish("a", "x")
    assert seen == ["x"]


def test_errors_propagate():
    bus, seen = EventBus(), []

    def boom(x):
        raise LookupError("bad %s" % x)

    bus.subscribe("a", boom)
    bus.subscribe("a", seen.append)
    with pytest.raises(LookupError, match="bad 3"):
        bus.publish("a", 3)
    assert seen == []


def test_callbacks_can_check_what_they_get():
    bus, total = EventBus(), []

    def strict(amount):
        assert amount > 0
        total.append(amount)

    bus.subscribe("pay", strict)
    for amount in (5, 7):
        bus.publish("pay", amount)
    assert total == [5, 7]
'''},
     '''class EventBus:
    def __init__(self):
        self._handlers = {}

    def subscribe(self, event, callback):
        entry = [callback]
        self._handlers.setdefault(event, []).append(entry)

        def cancel():
            if entry in self._handlers.get(event, []):
                self._handlers[event].remove(entry)

        return cancel

    def publish(self, event, *args, **kwargs):
        called = 0
        for entry in list(self._handlers.get(event, [])):
            entry[0](*args, **kwargs)
            called += 1
        return called

    def subscribers(self, event):
        return len(self._handlers.get(event, []))
''',
     [[("            entry[0](*args, **kwargs)\n", "            try:\n                entry[0](*args, **kwargs)\n            except Exception:\n                pass\n")],
      [("            entry[0](*args, **kwargs)\n", "            entry[0](*args)\n")],
      [("        for entry in list(self._handlers.get(event, [])):", "        for entry in reversed(self._handlers.get(event, [])):")]])

# 8. An iterator class and a generator function.
task("countdown", "Write solution.py with class Countdown(start, step=1): an iterator (iter returns itself) yielding "
     "start, start - step, ... down to 0 inclusive, never below; a negative start yields nothing; step < 1 raises "
     "ValueError. Also evens(limit): a generator of the even numbers 0, 2, ... below limit.",
     "class Countdown:\n    pass\n\n\ndef evens(limit):\n    pass\n",
     {"test_iter.py": '''import pytest

from solution import Countdown, evens


def test_countdown_values():
    assert list(Countdown(3)) == [3, 2, 1, 0]
    assert list(Countdown(7, step=3)) == [7, 4, 1]
    assert list(Countdown(-1)) == []


def test_is_its_own_iterator():
    c = Countdown(2)
    assert iter(c) is c
    assert next(c) == 2
    assert [x for x in c] == [1, 0]
    with pytest.raises(StopIteration):
        next(c)


def test_bad_step():
    with pytest.raises(ValueError):
        Countdown(3, step=0)


def test_evens():
    assert list(evens(7)) == [0, 2, 4, 6]
    g = evens(3)
    assert next(g) == 0
    assert next(g) == 2
    assert next(g, "done") == "done"
    assert sum(evens(10)) == 20


def test_zip_and_enumerate():
    pairs = list(zip(Countdown(2), evens(100)))
    assert pairs == [(2, 0), (1, 2), (0, 4)]
    assert dict(enumerate(Countdown(1))) == {0: 1, 1: 0}
'''},
     '''class Countdown:
    def __init__(self, start, step=1):
        if step < 1:
            raise ValueError("step must be at least 1")
        self.current = start
        self.step = step

    def __iter__(self):
        return self

    def __next__(self):
        if self.current < 0:
            raise StopIteration
        value = self.current
        self.current -= self.step
        return value


def evens(limit):
    n = 0
    while n < limit:
        yield n
        n += 2
''',
     [[("        if self.current < 0:", "        if self.current <= 0:")],
      [("    def __iter__(self):\n        return self", "    def __iter__(self):\n        return Countdown(self.current, self.step)")],
      [("    while n < limit:", "    while n <= limit:")]])

# 9. A trie (unittest).
task("trie", "Write solution.py with class Trie: insert(word), `word in trie` (whole words only), "
     "starts_with(prefix) -> sorted list of the words with that prefix, remove(word) (KeyError if absent), len() the "
     "number of distinct words, and Trie.from_words(words) (a class method).",
     "class Trie:\n    pass\n",
     {"test_trie.py": '''import unittest

import solution


class TrieTest(unittest.TestCase):
    def setUp(self):
        self.trie = solution.Trie.from_words(["car", "cart", "care", "dog"])

    def test_membership_is_whole_words(self):
        self.assertIn("car", self.trie)
        self.assertIn("care", self.trie)
        self.assertNotIn("ca", self.trie)
        self.assertNotIn("cars", self.trie)

    def test_prefix_search(self):
        self.assertEqual(self.trie.starts_with("car"), ["car", "care", "cart"])
        self.assertEqual(self.trie.starts_with("d"), ["dog"])
        self.assertEqual(self.trie.starts_with("x"), [])
        self.assertEqual(self.trie.starts_with(""), ["car", "care", "cart", "dog"])

    def test_len_counts_distinct_words(self):
        self.assertEqual(len(self.trie), 4)
        self.trie.insert("dog")
        self.assertEqual(len(self.trie), 4)
        self.trie.insert("do")
        self.assertEqual(len(self.trie), 5)

    def test_remove(self):
        self.trie.remove("car")
        self.assertNotIn("car", self.trie)
        self.assertIn("cart", self.trie)
        self.assertEqual(len(self.trie), 3)
        with self.assertRaises(KeyError):
            self.trie.remove("car")
        self.assertRaises(KeyError, self.trie.remove, "ca")

    def test_isinstance(self):
        self.assertIsInstance(self.trie, solution.Trie)
'''},
     '''class Trie:
    def __init__(self):
        self._root = {}
        self._count = 0

    @classmethod
    def from_words(cls, words):
        trie = cls()
        for word in words:
            trie.insert(word)
        return trie

    def insert(self, word):
        node = self._root
        for ch in word:
            node = node.setdefault(ch, {})
        if "$" not in node:
            node["$"] = True
            self._count += 1

    def _find(self, prefix):
        node = self._root
        for ch in prefix:
            if ch not in node:
                return None
            node = node[ch]
        return node

    def __contains__(self, word):
        node = self._find(word)
        return node is not None and "$" in node

    def starts_with(self, prefix):
        node = self._find(prefix)
        found = []

        def walk(n, path):
            for key, child in n.items():
                if key == "$":
                    found.append(path)
                else:
                    walk(child, path + key)

        if node is not None:
            walk(node, prefix)
        return sorted(found)

    def remove(self, word):
        node = self._find(word)
        if node is None or "$" not in node:
            raise KeyError(word)
        del node["$"]
        self._count -= 1

    def __len__(self):
        return self._count
''',
     [[("        return node is not None and \"$\" in node", "        return node is not None")],
      [("        if \"$\" not in node:\n            node[\"$\"] = True\n            self._count += 1", "        node[\"$\"] = True\n        self._count += 1")],
      [("        return sorted(found)", "        return found")]])

# 10. A rate limiter with an injected clock (a callback from the tests).
task("rate_limiter", "Write solution.py with class RateLimiter(limit, window, clock): allow(key) is True and records a "
     "hit if key had fewer than limit hits in the last window seconds (a hit at time t counts while clock() < t + window), "
     "else False; remaining(key) the hits left now. clock is a function returning the time in seconds.",
     "class RateLimiter:\n    pass\n",
     {"test_limiter.py": '''import pytest

from solution import RateLimiter


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


def test_limit_within_window(clock):
    limiter = RateLimiter(2, 10, clock)
    assert limiter.allow("a") is True
    assert limiter.allow("a") is True
    assert limiter.allow("a") is False
    assert limiter.allow("b") is True
    assert limiter.remaining("a") == 0
    assert limiter.remaining("c") == 2


def test_window_slides(clock):
    limiter = RateLimiter(2, 10, clock)
    assert limiter.allow("a")
    clock.now += 5
    assert limiter.allow("a")
    clock.now += 4.9
    assert not limiter.allow("a")
    clock.now += 0.1
    assert limiter.remaining("a") == 1
    assert limiter.allow("a")


def test_plain_function_clock():
    times = iter([0, 0, 0, 1, 1])
    limiter = RateLimiter(1, 1, lambda: next(times))
    assert limiter.allow("k")
    assert not limiter.allow("k")
    assert limiter.remaining("k") == 0
    assert limiter.allow("k")


@pytest.mark.parametrize("limit", [1, 3])
def test_denied_hits_do_not_count(clock, limit):
    limiter = RateLimiter(limit, 10, clock)
    for _ in range(limit):
        assert limiter.allow("x")
    for _ in range(5):
        assert not limiter.allow("x")
    clock.now += 10
    assert limiter.remaining("x") == limit
'''},
     '''class RateLimiter:
    def __init__(self, limit, window, clock):
        self.limit = limit
        self.window = window
        self.clock = clock
        self._hits = {}

    def _recent(self, key, now):
        hits = [t for t in self._hits.get(key, []) if now < t + self.window]
        self._hits[key] = hits
        return hits

    def allow(self, key):
        now = self.clock()
        hits = self._recent(key, now)
        if len(hits) >= self.limit:
            return False
        hits.append(now)
        return True

    def remaining(self, key):
        return self.limit - len(self._recent(key, self.clock()))
''',
     [[("        hits = [t for t in self._hits.get(key, []) if now < t + self.window]", "        hits = [t for t in self._hits.get(key, []) if now <= t + self.window]")],
      [("        if len(hits) >= self.limit:\n            return False\n        hits.append(now)", "        hits.append(now)\n        if len(hits) > self.limit:\n            return False")],
      [("        if len(hits) >= self.limit:\n            return False", "        if len(hits) >= self.limit:\n            return 0")]])

# 11. A priority queue with key functions from the tests (and a star import, as many test files have).
task("priority_queue", "Write solution.py with class PriorityQueue(key=None): push(item), pop() the item with the "
     "smallest key(item) (the item itself without key), first-in-first-out among equal keys, IndexError on an empty "
     "queue; peek(); len(); truthiness; drain() pops everything into a list.",
     "class PriorityQueue:\n    pass\n",
     {"test_pq.py": '''import pytest

from solution import *


def test_plain_items():
    q = PriorityQueue()
    for x in [5, 1, 4, 1, 3]:
        q.push(x)
    assert len(q) == 5
    assert q.peek() == 1
    assert q.drain() == [1, 1, 3, 4, 5]
    assert not q


@pytest.mark.parametrize("key,expected", [
    (len, ["b", "aa", "cc", "ddd"]),
    (lambda s: -len(s), ["ddd", "aa", "cc", "b"]),
    (str.upper, ["aa", "b", "cc", "ddd"]),
])
def test_key_functions(key, expected):
    q = PriorityQueue(key=key)
    for word in ["aa", "ddd", "b", "cc"]:
        q.push(word)
    assert q.drain() == expected


def test_ties_are_fifo():
    q = PriorityQueue(key=lambda pair: pair[0])
    for pair in [(1, "x"), (0, "y"), (1, "z"), (0, "w")]:
        q.push(pair)
    assert all(map(lambda want: q.pop() == want, [(0, "y"), (0, "w"), (1, "x"), (1, "z")]))


def test_empty():
    q = PriorityQueue()
    with pytest.raises(IndexError):
        q.pop()
    with pytest.raises(IndexError):
        q.peek()
    q.push({"a": 1})
    assert q
    assert q.pop() == {"a": 1}


def test_key_is_called_once_per_push():
    calls = []

    def key(item):
        calls.append(item)
        return item

    q = PriorityQueue(key=key)
    for x in range(10, 0, -1):
        q.push(x)
    q.drain()
    assert sorted(calls) == list(range(1, 11))
'''},
     '''import heapq
import itertools


class PriorityQueue:
    def __init__(self, key=None):
        self._key = key
        self._heap = []
        self._counter = itertools.count()

    def push(self, item):
        k = self._key(item) if self._key is not None else item
        heapq.heappush(self._heap, (k, next(self._counter), item))

    def pop(self):
        if not self._heap:
            raise IndexError("pop from an empty priority queue")
        return heapq.heappop(self._heap)[2]

    def peek(self):
        if not self._heap:
            raise IndexError("peek at an empty priority queue")
        return self._heap[0][2]

    def drain(self):
        return [self.pop() for _ in range(len(self._heap))]

    def __len__(self):
        return len(self._heap)

    def __bool__(self):
        return bool(self._heap)
''',
     [[("        heapq.heappush(self._heap, (k, next(self._counter), item))", "        heapq.heappush(self._heap, (k, -next(self._counter), item))")],
      [("            raise IndexError(\"peek at an empty priority queue\")", "            return None")],
      [("    def pop(self):\n        if not self._heap:", "    def pop(self):\n        if self._key is not None:\n            self._key(self._heap[0][2])\n        if not self._heap:")]])

# 12. A fraction class with comparisons (unittest).
task("fraction", "Write solution.py with class Frac(numerator, denominator=1), always in lowest terms with a positive "
     "denominator (attributes numerator and denominator; a zero denominator raises ZeroDivisionError): + - * / between "
     "fractions, ==, <, <=, >, >= between fractions, hash consistent with ==, float(), str() 'n/d' (just 'n' when d "
     "is 1), and Frac.parse('n/d').",
     "class Frac:\n    pass\n",
     {"test_frac.py": '''import unittest

from solution import Frac


class FracTest(unittest.TestCase):
    def test_lowest_terms(self):
        f = Frac(6, -8)
        self.assertEqual((f.numerator, f.denominator), (-3, 4))
        self.assertEqual(str(f), "-3/4")
        self.assertEqual(str(Frac(4, 2)), "2")

    def test_arithmetic(self):
        a, b = Frac(1, 2), Frac(1, 3)
        self.assertEqual(a + b, Frac(5, 6))
        self.assertEqual(a - b, Frac(1, 6))
        self.assertEqual(a * b, Frac(1, 6))
        self.assertEqual(a / b, Frac(3, 2))
        self.assertEqual(sum([Frac(1, 4)] * 4, Frac(0)), Frac(1))

    def test_comparisons(self):
        self.assertLess(Frac(1, 3), Frac(1, 2))
        self.assertLessEqual(Frac(2, 4), Frac(1, 2))
        self.assertGreater(Frac(-1, 2), Frac(-2, 3))
        self.assertGreaterEqual(Frac(3), Frac(3, 1))
        self.assertEqual(sorted([Frac(1, 2), Frac(1, 5), Frac(2, 3)]), [Frac(1, 5), Frac(1, 2), Frac(2, 3)])
        self.assertEqual(max(Frac(7, 8), Frac(8, 9)), Frac(8, 9))

    def test_hash_and_float(self):
        self.assertEqual(hash(Frac(1, 2)), hash(Frac(2, 4)))
        self.assertEqual(len({Frac(1, 2), Frac(2, 4), Frac(3, 6)}), 1)
        self.assertAlmostEqual(float(Frac(1, 3)), 0.3333333, places=6)

    def test_zero_denominator(self):
        with self.assertRaises(ZeroDivisionError):
            Frac(1, 0)
        with self.assertRaises(ZeroDivisionError):
            Frac(1, 2) / Frac(0)

    def test_parse(self):
        self.assertEqual(Frac.parse("3/9"), Frac(1, 3))
        self.assertEqual(Frac.parse("-5/10").numerator, -1)
'''},
     '''from math import gcd


class Frac:
    def __init__(self, numerator, denominator=1):
        if denominator == 0:
            raise ZeroDivisionError("zero denominator")
        if denominator < 0:
            numerator, denominator = -numerator, -denominator
        g = gcd(numerator, denominator) or 1
        self.numerator = numerator // g
        self.denominator = denominator // g

    @classmethod
    def parse(cls, text):
        n, d = text.split("/")
        return cls(int(n), int(d))

    def __add__(self, o):
        return Frac(self.numerator * o.denominator + o.numerator * self.denominator, self.denominator * o.denominator)

    def __sub__(self, o):
        return Frac(self.numerator * o.denominator - o.numerator * self.denominator, self.denominator * o.denominator)

    def __mul__(self, o):
        return Frac(self.numerator * o.numerator, self.denominator * o.denominator)

    def __truediv__(self, o):
        return Frac(self.numerator * o.denominator, self.denominator * o.numerator)

    def _key(self, o):
        return self.numerator * o.denominator, o.numerator * self.denominator

    def __eq__(self, o):
        if not isinstance(o, Frac):
            return NotImplemented
        a, b = self._key(o)
        return a == b

    def __lt__(self, o):
        a, b = self._key(o)
        return a < b

    def __le__(self, o):
        a, b = self._key(o)
        return a <= b

    def __gt__(self, o):
        a, b = self._key(o)
        return a > b

    def __ge__(self, o):
        a, b = self._key(o)
        return a >= b

    def __hash__(self):
        return hash((self.numerator, self.denominator))

    def __float__(self):
        return self.numerator / self.denominator

    def __str__(self):
        if self.denominator == 1:
            return str(self.numerator)
        return "%d/%d" % (self.numerator, self.denominator)

    def __repr__(self):
        return "Frac(%d, %d)" % (self.numerator, self.denominator)
''',
     [[("        if denominator < 0:\n            numerator, denominator = -numerator, -denominator\n", "")],
      [("    def __le__(self, o):\n        a, b = self._key(o)\n        return a <= b", "    def __le__(self, o):\n        a, b = self._key(o)\n        return a < b")],
      [("        if self.denominator == 1:\n            return str(self.numerator)\n", "")]])
