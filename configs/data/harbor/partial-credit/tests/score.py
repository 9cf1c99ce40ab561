import json, sys
sys.path.insert(0, "/work")
checks = {
    "square": lambda f: f.square(7) == 49,
    "reverse": lambda f: f.reverse("abc") == "cba",
    "evens": lambda f: f.evens([1, 2, 3, 4]) == [2, 4],
    "word_count": lambda f: f.word_count(" a b  c ") == 3,
}
results = {}
try:
    import funcs
except Exception:
    funcs = None
for name, check in checks.items():
    try:
        results[name] = 1.0 if funcs is not None and check(funcs) else 0.0
    except Exception:
        results[name] = 0.0
results["reward"] = sum(results.values()) / len(checks)
print(json.dumps(results))
