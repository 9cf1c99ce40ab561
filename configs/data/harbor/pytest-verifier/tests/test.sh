#!/bin/bash
# The verifier brings its own test tools, from the package index it may reach.
pip install --quiet --disable-pip-version-check --index-url "$PIP_INDEX" pytest==8.3.4 > /logs/verifier/pip.log 2>&1 || { echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app
if python3 -m pytest -q -p no:cacheprovider /tests/test_calc.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
