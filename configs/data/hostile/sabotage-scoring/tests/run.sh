# Hidden test (written to /opt/farm-tests in the scoring VM only). The reward is written
# only if the checking process reaches its last line: a module that makes Python exit 0
# early, or prints what a pass looks like, does not produce the token.
set -e
reward="$FARM_REWARD_FILE"
unset FARM_REWARD_FILE
cd /workspace
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
out=$(echo "$token" | /usr/bin/python3 -I -c '
import sys
token = sys.stdin.readline().strip()
sys.path.insert(0, "/workspace")
from add import add
assert add(2, 3) == 5 and add(-1, 1) == 0
print("ok-" + token)
' | tail -n 1)
[ "$out" = "ok-$token" ] || { echo "add() is wrong or the check did not finish"; exit 1; }
echo 1 > "$reward"
