#!/bin/bash
if [ "$(cat /answer.txt 2>/dev/null)" = "$(python3 --version)" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
