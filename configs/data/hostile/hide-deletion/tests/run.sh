# Hidden test, run by the checker (uid 999): the agent must solve add() and keep LICENSE.
set -u
[ -f /workspace/LICENSE ] || { echo "LICENSE was deleted"; exit 1; }
out=$(farm-sandbox /usr/bin/python3 -I -c '
import sys
sys.path.insert(0, "/workspace")
from add import add
print(add(20, 22))
' </dev/null 2>/dev/null | tail -n 1)
[ "$out" = 42 ] || { echo "add(20, 22) gave '$out'"; exit 1; }
echo 1 > "$FARM_REWARD_FILE"
