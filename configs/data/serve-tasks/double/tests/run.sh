# Hidden test: the file the agent wrote must hold 42. Only the file is read; none of the
# agent's code runs.
set -u
got=$(head -c 64 /workspace/out.txt 2>/dev/null | tr -d ' \n')
if [ "$got" != 42 ]; then
    echo "out.txt holds '$got', expected 42"
    exit 1
fi
echo 1 > "$FARM_REWARD_FILE"
