#!/bin/bash
cd /app
if [ "$(python3 report.py 2>/dev/null)" = "$(printf 'name=farm\nmode=fast')" ] && grep -q iniconfig report.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
