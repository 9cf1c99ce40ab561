# A checker written the easy way: it draws its inputs with Python itself (as farm-checker, not
# through farm-sandbox, and without -I). That must not pick up the agent's files: a checker
# starts in the tests folder, and PYTHONSAFEPATH keeps the current folder off Python's path.
set -u
a=$(python3 -c 'import random; print(random.randint(1, 60000))')
b=$(python3 -c 'import random; print(random.randint(1, 60000))')
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
