#!/bin/bash
if [ "$(python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8080/ping", timeout=30).read().decode())' 2>/dev/null)" = pong ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
