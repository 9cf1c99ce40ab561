#!/bin/bash
if [ "$PWD" = /srv/work ] && [ "$(cat /srv/work/greeting.txt 2>/dev/null)" = bonjour ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
