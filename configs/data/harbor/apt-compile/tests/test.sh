#!/bin/bash
if [ "$(/usr/local/bin/adder 2 3)" = 5 ] && [ "$(/usr/local/bin/adder 40 2)" = 42 ] && head -c 4 /usr/local/bin/adder | grep -q ELF; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
