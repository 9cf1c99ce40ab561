#!/usr/bin/env python3
"""Runs the test binaries `cargo test --no-run --message-format=json` built, in two lanes at
once (scripts/test.sh's full tier; the fast tier and a plain `cargo test` run them one after
the other, as cargo does).

    cargo test --workspace --no-run --message-format=json [CARGO ARGS] \
        | python3 scripts/run-tests.py [CARGO ARGS] [-- TEST ARGS...]

Why two lanes: on a 2-core machine the heaviest binaries (the Harbor tests, the suites, E2B's
code interpreter, farm serve) keep both cores busy, while most of the others spend part of
their time waiting on a guest's boot, a Slurm job or a lease. The Harbor tests start the first
lane and the rest (then the doc tests) the second; the other heavy ones go to whichever lane
is free first, so neither lane idles while the other still has a heavy binary to run. Each
binary runs as cargo runs it (in its package's folder, TEST ARGS after it, e.g. a filter or
`--nocapture`);
its output is printed in one block when it ends, under cargo's `Running` line, then a
`[run-tests]` line with its wall time and the CPU time it and its children (the guests'
QEMU) used, so the heavy binaries can be told by what they cost. The doc tests
(`cargo test --doc`) run only when no CARGO ARGS were given (those may name targets that are
not doc tests, e.g. `--test harbor`). The run ends with cargo's summary of the binaries that
failed, and exits 1 if any did (every binary runs even when one fails, as with
--no-fail-fast).
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time

# The heavy binaries (farm's integration tests, by file name): the first starts the first
# lane; the others go, in this order, to whichever lane is free first.
HEAVY = ["harbor", "suites", "e2b_interpreter", "serve"]


def binaries(lines):
    """(label, executable, folder, target name, kind) of every test executable cargo built."""
    found = []
    for line in lines:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message.get("profile", {}).get("test"):
            continue
        target = message["target"]
        folder = os.path.dirname(message["manifest_path"])
        source = os.path.relpath(target["src_path"], folder)
        kind = target["kind"][0]
        label = "unittests %s" % source if kind in ("lib", "bin") else source
        found.append((label, message["executable"], folder, target["name"], kind))
    return found


class Lanes:
    def __init__(self, test_args):
        self.test_args = test_args  # after each binary, as cargo passes what follows `--`
        self.lock = threading.Lock()
        self.failed = []

    def run(self, label, command, folder, description):
        try:
            self.run_one(label, command, folder, description)
        except Exception as error:  # a binary that could not run is a failure, never a skip
            with self.lock:
                sys.stdout.write("[run-tests] %s: could not run: %s\n" % (label, error))
                sys.stdout.flush()
                self.failed.append("%s (%s)" % (label, description))

    def run_one(self, label, command, folder, description):
        started = time.monotonic()
        # The binary dies with this script (which dies with a signal's default action), and
        # its own children with it (tests start theirs the same way): nothing is left.
        child = subprocess.Popen(["setpriv", "--pdeathsig", "TERM", "--"] + command, cwd=folder,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        output = child.stdout.read()
        child.stdout.close()
        # wait4 gives the CPU time of the binary and of every child it waited for (QEMU).
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        with self.lock:
            sys.stdout.write("     Running %s (%s)\n" % (label, description))
            sys.stdout.write(output.decode("utf-8", "replace"))
            sys.stdout.write("[run-tests] %s: %.0f s, cpu %.0f s, exit %d\n"
                             % (label, time.monotonic() - started, cpu, child.returncode))
            sys.stdout.flush()
            if child.returncode != 0:
                self.failed.append("%s (%s)" % (label, description))

    def take(self, queue):
        with self.lock:
            return queue.pop(0) if queue else None

    def lane(self, items, doc_tests, shared):
        """Runs `items`, then the doc tests if asked, then what is left in `shared`."""
        for label, executable, folder, _, _ in items:
            self.run(label, [executable] + self.test_args, folder, executable)
        if doc_tests:
            command = ["cargo", "test", "--workspace", "--doc", "--no-fail-fast", "--"] + self.test_args
            self.run("doc tests", command, os.getcwd(), "cargo test --workspace --doc")
        while True:
            item = self.take(shared)
            if item is None:
                return
            label, executable, folder, _, _ = item
            self.run(label, [executable] + self.test_args, folder, executable)


def main():
    if shutil.which("setpriv") is None:
        print("run-tests: setpriv is missing (Debian package util-linux)", file=sys.stderr)
        return 1
    found = binaries(sys.stdin)
    if not found:
        print("run-tests: no test executables in cargo's output (was it --message-format=json?)", file=sys.stderr)
        return 1
    heavy = sorted((b for b in found if b[4] == "test" and b[3] in HEAVY), key=lambda b: HEAVY.index(b[3]))
    rest = [b for b in found if b not in heavy]
    arguments = sys.argv[1:]
    cargo_args, test_args = (arguments[:arguments.index("--")], arguments[arguments.index("--") + 1:]) \
        if "--" in arguments else (arguments, [])
    lanes = Lanes(test_args)
    shared = heavy[1:]
    threads = [threading.Thread(target=lanes.lane, args=(heavy[:1], False, shared)),
               threading.Thread(target=lanes.lane, args=(rest, not cargo_args, shared))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if lanes.failed:
        print("error: %d target%s failed:" % (len(lanes.failed), "" if len(lanes.failed) == 1 else "s"))
        for label in lanes.failed:
            print("    `%s`" % label)
        print()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
