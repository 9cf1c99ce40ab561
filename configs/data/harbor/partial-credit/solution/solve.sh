#!/bin/bash
cat > /work/funcs.py <<'PY'
def square(x):
    return x * x


def reverse(s):
    return s[::-1]


def evens(xs):
    return [x for x in xs if x % 2 == 0]


def word_count(text):
    return len(text.split())
PY
