#!/usr/bin/env python3
"""Size limits on formatted Rust code (STYLE.md habits 18 and 19), checked by scripts/test.sh.

    python3 scripts/check-sizes.py [ROOT]

Fails when a source file has more than 600 lines outside its `#[cfg(test)]` items (test
modules, test-only functions and imports, wherever they are in the file), or when a
function outside test code has more than 80 lines, unless a comment says why:
- a function: a `// Long: <why>` line among the comments and attributes right above it;
- a file: a `//! Long: <why>` line in its module documentation.
Test files (`tests/`, `*tests.rs`) are not read. Run it on code formatted by `cargo fmt`:
packing lines to stay under the limits defeats them.
"""
import os
import re
import sys

FILE_LIMIT = 600
FUNCTION_LIMIT = 80
FUNCTION = re.compile(
    r'^(?P<indent>\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(?P<name>\w+)'
)


def rust_files(root):
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [s for s in subfolders if s not in ("target", ".git", "tests", "node_modules")]
        for name in files:
            if name.endswith(".rs") and not name.endswith("tests.rs"):
                yield os.path.join(folder, name)


def code_lines(lines):
    """The file without its `#[cfg(test)]` items (a test module, a test-only function or
    import): each is the attribute, any attributes after it, and the item up to its `;` or
    the `}` that closes it at its own indentation. Lines stay in place (as blanks), so the
    line numbers reported are the file's; only the count of code lines leaves them out."""
    out = list(lines)
    i = 0
    while i < len(lines):
        if lines[i].strip() != "#[cfg(test)]":
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i].strip().startswith("#["):
            i += 1
        if i < len(lines):
            item = lines[i]
            indent = item[: len(item) - len(item.lstrip())]
            if not item.rstrip().endswith(";"):
                closing = indent + "}"
                while i < len(lines) and not (lines[i].rstrip() in (closing, closing + ";") and i > start):
                    i += 1
        for k in range(start, min(i + 1, len(lines))):
            out[k] = None
        i += 1
    return out


def count_code(code):
    return sum(1 for line in code if line is not None)


def function_end(lines, start, indent):
    """The line of the `}` that closes the function opened at `start` (rustfmt puts it at the
    signature's indentation)."""
    closing = indent + "}"
    for j in range(start, len(lines)):
        if lines[j] is not None and lines[j].rstrip() == closing:
            return j
    return len(lines) - 1


def explained(lines, start):
    """Whether the comments and attributes right above line `start` say why it is long."""
    k = start - 1
    while k >= 0 and lines[k] is not None and lines[k].strip().startswith(("//", "#[")):
        if lines[k].strip().startswith("// Long:"):
            return True
        k -= 1
    return False


def check(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    code = code_lines(lines)
    problems = []
    length = count_code(code)
    if length > FILE_LIMIT and not any(l is not None and l.startswith("//! Long:") for l in code):
        problems.append(f"{path}: {length} lines of code (at most {FILE_LIMIT}, or a `//! Long:` line saying why)")
    for i, line in enumerate(code):
        if line is None:
            continue
        m = FUNCTION.match(line)
        if not m or line.rstrip().endswith(";"):
            continue
        # A signature over several lines ends with `{` or `where` on a later line.
        end = function_end(code, i, m.group("indent"))
        length = end - i + 1
        if length > FUNCTION_LIMIT and not explained(code, i):
            problems.append(
                f"{path}:{i + 1}: fn {m.group('name')} has {length} lines "
                f"(at most {FUNCTION_LIMIT}, or a `// Long:` comment above it saying why)"
            )
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems = [p for path in sorted(rust_files(root)) for p in check(path)]
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} over a size limit: split along the seams, or say why", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
