# Hidden test, run by the checker (farm-checker, uid 999; task.toml: test_user = "checker").
# The agent's code runs only through farm-sandbox, as the candidate user (farm, uid 1000),
# which can read neither this folder nor the reward file, and cannot see, signal or trace
# this script. The inputs are drawn at random, so no answer can be prepared in advance.
set -u
a=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
b=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
out=$(farm-sandbox /usr/bin/python3 -I -c '
import sys
sys.path.insert(0, "/workspace")
from add import add
print(add(int(sys.argv[1]), int(sys.argv[2])))
' "$a" "$b" </dev/null 2>/dev/null | tail -n 1)
if [ "$out" != "$((a + b))" ]; then
    echo "add($a, $b) gave '${out}', expected $((a + b))"
    exit 1
fi
echo 1 > "$FARM_REWARD_FILE"
