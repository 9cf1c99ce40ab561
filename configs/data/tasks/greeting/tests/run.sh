# Hidden test: written to /opt/farm-tests only in the scoring VM, run by the checker
# (farm-checker; task.toml: test_user = "checker"). The agent's code, and its git repository
# (whose config could run commands), are touched only through farm-sandbox, as the
# unprivileged candidate user. The name is drawn at random, so no answer can be prepared.
set -u
name="Ada$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"
out=$(farm-sandbox /usr/bin/python3 -I -c '
import sys
sys.path.insert(0, "/workspace")
from greet import greet
print(greet(sys.argv[1]))
' "$name" </dev/null 2>/dev/null | tail -n 1)
if [ "$out" != "Hello, $name!" ]; then
    echo "greet(\"$name\") gave '$out'"
    exit 1
fi
dirty=$(farm-sandbox git -C /workspace status --porcelain greet.py </dev/null 2>&1) || { echo "git status failed: $dirty"; exit 1; }
[ -z "$dirty" ] || { echo "greet.py is not committed: $dirty"; exit 1; }
echo 1 > "$FARM_REWARD_FILE"
