#!/bin/bash
cd /repo
if [ "$(git rev-list --count HEAD)" = 2 ] && git diff --quiet HEAD && python3 -c "from double import double; assert double(21) == 42"; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
