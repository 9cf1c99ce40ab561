# Hidden test, run by the checker (farm-checker; task.toml: test_user = "checker"). Each word
# of cases.txt goes to the agent's score() through farm-sandbox; the expected values stay in
# this folder, which the agent's code cannot read. (Its standard input is /dev/null: inside
# the loop it would otherwise be cases.txt itself.)
set -u
while read -r word expected; do
    got=$(farm-sandbox /usr/bin/python3 -I -c '
import sys
sys.path.insert(0, "/workspace")
from score import score
print(score(sys.argv[1]))
' "$word" </dev/null 2>/dev/null | tail -n 1)
    if [ "$got" != "$expected" ]; then
        echo "score($word) gave '$got', expected $expected"
        exit 1
    fi
done < "$FARM_TESTS_DIR/cases.txt"
echo 1 > "$FARM_REWARD_FILE"
