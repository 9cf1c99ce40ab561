# Hidden test, run by the checker (uid 999): the expected answer is in a folder of the
# checker's own; the agent's program leaves /workspace/out/answer.txt.
set -u
word=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
mkdir -p "$FARM_TESTS_DIR/expected"
printf '%s\n' "$word" | rev > "$FARM_TESTS_DIR/expected/answer.txt"
farm-sandbox /usr/bin/python3 -I /workspace/solve.py "$word" </dev/null >/dev/null 2>&1
if cmp -s /workspace/out/answer.txt "$FARM_TESTS_DIR/expected/answer.txt"; then
    echo 1 > "$FARM_REWARD_FILE"
else
    echo "out/answer.txt differs from the reversed word"
    exit 1
fi
