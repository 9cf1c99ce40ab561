# Runs once, in the per-task snapshot: a git repository every rollout starts from.
git init -q .
git config user.email farm@localhost
git config user.name farm
git add greet.py
git commit -qm "stub"
