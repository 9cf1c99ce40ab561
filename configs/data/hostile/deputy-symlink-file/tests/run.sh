# Hidden test, run by the checker (uid 999). The expected answer is kept in the checker's
# own folder; the agent's program runs through farm-sandbox and leaves answer.txt, which the
# checker then reads: a checker that follows a link planted there would read its own file.
set -u
word=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
printf '%s\n' "$word" | rev > "$FARM_TESTS_DIR/expected.txt"
farm-sandbox /usr/bin/python3 -I /workspace/solve.py "$word" </dev/null >/dev/null 2>&1
if cmp -s /workspace/answer.txt "$FARM_TESTS_DIR/expected.txt"; then
    echo 1 > "$FARM_REWARD_FILE"
else
    echo "answer.txt differs from the reversed word"
    exit 1
fi
