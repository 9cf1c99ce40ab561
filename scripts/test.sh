#!/usr/bin/env bash
# The test suite, in two tiers.
#
#   scripts/test.sh [CARGO TEST ARGS...]          the full tier (on Debian 12, as root): the set-up
#                                                 (scripts/setup.sh; seconds when everything is in
#                                                 place), the formatter, the size limits and
#                                                 clippy, then
#                                                 `cargo test --workspace`, which boots real guests.
#                                                 CI runs exactly this (.ci/run).
#   scripts/test.sh --fast [CARGO TEST ARGS...]   the developer's loop: the formatter, the size
#                                                 limits (scripts/check-sizes.py), clippy and
#                                                 every test that needs no guest (the crates' unit
#                                                 tests, the harness's self-test and the Python
#                                                 SDK's tests on a scripted service); no set-up.
#
# Every check and every test binary runs even when one fails (cargo's --no-fail-fast), and the
# run ends with the list of what failed, so one failure cannot hide another.
set -uo pipefail
cd "$(dirname "$0")/.."

fast=
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi

started=$(date +%s)
failed=()
log=$(mktemp -t farm-test.XXXXXX.log)
trap 'rm -f "$log"' EXIT

step() { printf '\n[test %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -z "$fast" ]; then
  # The tests run the dev-profile farm cargo builds for them: the release binary is not needed.
  step "set-up (scripts/setup.sh --no-release)"
  bash scripts/setup.sh --no-release || { echo "[test] the set-up failed: nothing was tested" >&2; exit 1; }
fi

step "cargo fmt --all --check"
cargo fmt --all --check || failed+=("cargo fmt --all --check (run: cargo fmt --all)")

step "python3 scripts/check-sizes.py (600 lines a file, 80 a function)"
python3 scripts/check-sizes.py || failed+=("python3 scripts/check-sizes.py")
step "python3 scripts/check-links.py (relative links in README.md, docs/ and the SDK's README)"
python3 scripts/check-links.py || failed+=("python3 scripts/check-links.py")

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings || failed+=("cargo clippy --workspace --all-targets -- -D warnings")

if [ -n "$fast" ]; then
  step "cargo test --workspace --lib --bins (no guests)"
  cargo test --workspace --lib --bins --no-fail-fast "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
else
  # Built first, then the test binaries run in two lanes at once (scripts/run-tests.py: the
  # Harbor tests beside the rest; the suites and farm serve in whichever lane is free first),
  # as cargo would run them.
  step "cargo test --workspace --no-run (the test build)"
  cargo_args=()
  for a in "$@"; do
    [ "$a" = "--" ] && break
    cargo_args+=("$a")
  done
  built=$(mktemp -t farm-test-build.XXXXXX.json)
  trap 'rm -f "$log" "$built"' EXIT
  if cargo test --workspace --no-run --message-format=json-render-diagnostics "${cargo_args[@]}" >"$built"; then
    step "the test binaries (real guests), in two lanes (scripts/run-tests.py)"
    python3 scripts/run-tests.py "$@" <"$built" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
  else
    status=1  # reported below as an exit without a failed test
  fi
fi

if [ -n "$fast" ]; then
  # The Python SDK against its scripted service (the full tier runs these in
  # farm/tests/sandboxes.rs, with the live ones against a real service).
  step "python3 -m pytest clients/python/tests (the SDK, no service)"
  python3 -m pytest -q -p no:cacheprovider clients/python/tests || failed+=("python3 -m pytest clients/python/tests")
fi

# Each failed test, under the test binary it belongs to ("Running tests/suites.rs (...)").
while IFS= read -r line; do
  failed+=("$line")
done < <(awk '
  /^ *Running / { if (match($0, /\(.*\)/)) binary = substr($0, RSTART + 1, RLENGTH - 2) }
  /^test .* \.\.\. FAILED$/ { name = $2; print "test " name "  (" binary ")" }
' "$log")
if [ "$status" -ne 0 ] && ! grep -q '^test .* \.\.\. FAILED$' "$log"; then
  failed+=("cargo test exited with $status without a failed test (a build error, or a test binary that crashed): see above")
fi
# The binaries cargo itself reports as failed (a crash or a timeout shows only here).
while IFS= read -r line; do
  failed+=("test binary $line")
done < <(sed -n '/^error: [0-9]* targets\? failed:/,/^$/{/^ *`/p}' "$log" | sed 's/^ *//')

elapsed=$(( $(date +%s) - started ))
tier=$([ -n "$fast" ] && echo "fast tier" || echo "full tier")
if [ "${#failed[@]}" -eq 0 ]; then
  printf '\n[test] %s passed in %dm%02ds\n' "$tier" $((elapsed / 60)) $((elapsed % 60)) >&2
  exit 0
fi
printf '\n[test] %s FAILED in %dm%02ds:\n' "$tier" $((elapsed / 60)) $((elapsed % 60)) >&2
for f in "${failed[@]}"; do
  printf '  - %s\n' "$f" >&2
done
exit 1
