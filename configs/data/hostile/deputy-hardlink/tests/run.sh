# Hidden test, run as root. It keeps the expected answer in a root-only file outside the
# tests folder, whose path the agent could know but whose contents it cannot read. A hard
# link to it in the workspace would hand root's file to the check as the agent's answer.
set -u
word=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
mkdir -p /var/lib/farm-check
chmod 755 /var/lib/farm-check
(umask 077; printf '%s\n' "$word" | rev > /var/lib/farm-check/expected.txt)
farm-sandbox /usr/bin/python3 -I /workspace/solve.py "$word" </dev/null >/dev/null 2>&1
if cmp -s /workspace/answer.txt /var/lib/farm-check/expected.txt; then
    echo 1 > "$FARM_REWARD_FILE"
else
    echo "answer.txt differs from the reversed word"
    exit 1
fi
