#!/usr/bin/env python3
"""Relative links in the documentation, checked by scripts/test.sh.

    python3 scripts/check-links.py [ROOT]

Reads README.md, docs/*.md and clients/python/README.md. Every relative markdown link (inline
`[text](target)`, image `![alt](target)` or reference definition `[label]: target`) must name
a file or folder that exists, relative to the linking file. A `#fragment` into a markdown
file (or a bare `#fragment`, into the linking file itself) must be the GitHub-style anchor of
one of its headings: lowercase, spaces to `-`, punctuation other than `-` and `_` removed, and
`-1`, `-2`... after repeats; an HTML `id` or `name` attribute counts too. External links
(`http:`, `https:`, `mailto:`) are not checked, nor anything inside code blocks or code spans.
Prints each broken link as `FILE:LINE: LINK: why` and exits 1 if there is one, else prints a
one-line summary and exits 0.
"""
import glob
import os
import re
import sys
from urllib.parse import unquote

EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, any scheme
FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
INLINE = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"
    r"\([ \t]*(<[^>\n]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:[ \t]+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?[ \t]*\)"
)
REFERENCE = re.compile(r"^ {0,3}\[[^\]\n]+\]:[ \t]*(<[^>\n]*>|\S+)", re.M)
HTML_ID = re.compile(r"<[a-zA-Z][^>]*?\s(?:id|name)\s*=\s*[\"']([^\"']+)[\"']")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(?:(?!\n[ \t]*\n)[\s\S])*?(?<!`)\1(?!`)")


def documents(root):
    found = [os.path.join(root, "README.md")]
    found += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    found.append(os.path.join(root, "clients", "python", "README.md"))
    return [path for path in found if os.path.isfile(path)]


def prose(text):
    """The text with every line of a fenced code block blanked, so line numbers stay."""
    out = []
    fence = None
    for line in text.split("\n"):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                out.append("")
            else:
                out.append(line)
        else:
            out.append("")
            run = match.group(1) if match else ""
            if run and run[0] == fence[0] and len(run) >= len(fence) and line.strip() == run:
                fence = None
    return "\n".join(out)


def anchor(heading):
    """GitHub's anchor of a heading's text: links and emphasis reduced to their words,
    lowercase, punctuation other than '-' and '_' removed, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            text = prose(f.read())
        seen = {}
        names = set()
        for line in text.split("\n"):
            match = HEADING.match(line)
            if match:
                base = anchor(match.group(2))
                count = seen.get(base, 0)
                seen[base] = count + 1
                names.add(base if count == 0 else f"{base}-{count}")
            names.update(HTML_ID.findall(line))
        cache[path] = names
    return cache[path]


def links(text):
    """(line number, target) for each link outside code blocks and code spans."""
    text = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose(text))
    found = [(m.start(1), m.group(1)) for m in INLINE.finditer(text)]
    found += [(m.start(1), m.group(1)) for m in REFERENCE.finditer(text)]
    for offset, target in sorted(found):
        yield text.count("\n", 0, offset) + 1, target


def check(path, root):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    shown = os.path.relpath(path, root)
    broken = []
    count = 0
    for number, target in links(text):
        if target.startswith("<") and target.endswith(">"):
            target = target[1:-1]
        if not target or EXTERNAL.match(target):
            continue
        count += 1
        file_part, _, fragment = target.partition("#")
        file_part = unquote(file_part.split("?", 1)[0])
        if file_part:
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        else:
            dest = path
        if not os.path.exists(dest):
            broken.append(f"{shown}:{number}: {target}: {os.path.relpath(dest, root)} does not exist")
            continue
        if fragment and dest.endswith(".md") and os.path.isfile(dest):
            if unquote(fragment) not in anchors(dest):
                broken.append(f"{shown}:{number}: {target}: no heading of {os.path.relpath(dest, root)} "
                              f"has the anchor #{fragment}")
    return count, broken


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    files = documents(root)
    total = 0
    broken = []
    for path in files:
        count, bad = check(path, root)
        total += count
        broken += bad
    for line in broken:
        print(line)
    if broken:
        print(f"check-links: {len(broken)} broken of {total} relative links in {len(files)} files")
        return 1
    print(f"check-links: {total} relative links in {len(files)} files, all good")
    return 0


if __name__ == "__main__":
    sys.exit(main())
