# Hidden test: written to /opt/farm-tests only in the scoring VM. The reward is written only
# if the checking process reaches its last line (see the hostile sample).
set -e
reward="$FARM_REWARD_FILE"
unset FARM_REWARD_FILE
cd /workspace
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
out=$(echo "$token" | /usr/bin/python3 -I -c '
import sys
token = sys.stdin.readline().strip()
sys.path.insert(0, "/workspace")
from greet import greet
assert greet("Ada") == "Hello, Ada!", greet("Ada")
print("ok-" + token)
' | tail -n 1)
[ "$out" = "ok-$token" ] || { echo "greet() is wrong or the check did not finish"; exit 1; }
test -z "$(git status --porcelain greet.py)" || { echo "greet.py is not committed"; exit 1; }
echo 1 > "$reward"
