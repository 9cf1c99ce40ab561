#!/usr/bin/env python3
"""Reference verdicts of the unit-test tasks: each sample's tests run in-process, with no
boundary at all.

Usage:
    python3 reference.py [TASKS.jsonl [SAMPLES.jsonl]] [--timeout SECONDS]

For every sample (default: tasks.jsonl and samples.jsonl beside this file), a fresh
temporary folder gets the sample's files (its write_file actions) and the task's test
files, and `python3 -m pytest -q -p no:cacheprovider` runs there (pytest runs unittest
files too). A sample passes when pytest exits 0, i.e. tests ran and none failed or errored.
Standard output gets one line per sample, in file order:

    {"task_id": "...", "sample_index": N, "passed": true|false}

expected.jsonl is this script's output; farm's verdicts through its boundary must equal it.
Exit status: 0, or 2 on bad input or when pytest is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def read_jsonl(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def verdict(task, sample, timeout):
    with tempfile.TemporaryDirectory(prefix="unittest-reference-") as folder:
        for action in sample["actions"]:
            if action["kind"] == "write_file":
                path = os.path.join(folder, action["path"])
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as handle:
                    handle.write(action["content"])
        for name, text in task["tests"].items():
            with open(os.path.join(folder, name), "w") as handle:
                handle.write(text)
        try:
            process = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"] + sorted(task["tests"]),
                                     cwd=folder, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return process.returncode == 0


def main():
    arguments = [a for a in sys.argv[1:] if not a.startswith("--")]
    timeout = 60.0
    if "--timeout" in sys.argv:
        timeout = float(sys.argv[sys.argv.index("--timeout") + 1])
        arguments = [a for a in arguments if a != sys.argv[sys.argv.index("--timeout") + 1]]
    tasks_path = arguments[0] if arguments else os.path.join(HERE, "tasks.jsonl")
    samples_path = arguments[1] if len(arguments) > 1 else os.path.join(HERE, "samples.jsonl")
    if subprocess.run([sys.executable, "-m", "pytest", "--version"], capture_output=True).returncode != 0:
        print("reference: pytest is not installed (pip install pytest==7.2.1)", file=sys.stderr)
        return 2
    tasks = {t["id"]: t for t in read_jsonl(tasks_path)}
    for sample in read_jsonl(samples_path):
        if sample["task_id"] not in tasks:
            print("reference: %s names an unknown task %r" % (samples_path, sample["task_id"]), file=sys.stderr)
            return 2
        passed = verdict(tasks[sample["task_id"]], sample, timeout)
        print(json.dumps({"task_id": sample["task_id"], "sample_index": sample["sample_index"], "passed": passed}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
