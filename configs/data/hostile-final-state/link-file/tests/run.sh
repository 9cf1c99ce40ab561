# Hidden test, run by the checker (uid 999) in the rollout's own VM (final-state scoring):
# it compares the answer the rollout left with the expected one in its own folder.
if cmp -s /workspace/answer.txt "$FARM_TESTS_DIR/expected.txt"; then
    echo 1 > "$FARM_REWARD_FILE"
else
    echo "answer.txt is not the reversed word"
    exit 1
fi
