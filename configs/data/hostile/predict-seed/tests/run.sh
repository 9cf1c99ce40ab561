# Hidden test, run by the checker (uid 999). Its inputs come from the scoring seed
# (FARM_SEED in the scoring VM), as a checker that wants reproducible hidden inputs would
# draw them. The agent's code runs through farm-sandbox.
set -u
a=$(( FARM_SEED % 65521 ))
b=$(( (FARM_SEED / 65521) % 65521 ))
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
