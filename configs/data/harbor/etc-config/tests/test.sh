#!/bin/bash
if [ -x /usr/local/bin/farmapp-port ] && [ "$(/usr/local/bin/farmapp-port)" = 9090 ] && sed -i "s/9090/9191/" /etc/farmapp/config.ini && [ "$(/usr/local/bin/farmapp-port)" = 9191 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
