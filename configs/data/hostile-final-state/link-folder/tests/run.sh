# Hidden test, run by the checker (uid 999) in the rollout's own VM (final-state scoring).
if cmp -s /workspace/out/answer.txt "$FARM_TESTS_DIR/expected/answer.txt"; then
    echo 1 > "$FARM_REWARD_FILE"
else
    echo "out/answer.txt is not the reversed word"
    exit 1
fi
