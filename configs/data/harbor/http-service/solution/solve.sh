#!/bin/bash
cd /srv/app
nohup python3 server.py > /tmp/server.log 2>&1 &
for i in $(seq 50); do python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/ping', timeout=1)" 2>/dev/null && exit 0; sleep 0.2; done
exit 1
