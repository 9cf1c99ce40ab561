#!/bin/bash
mkdir -p /etc/farmapp
printf "[server]\nport = 9090\n" > /etc/farmapp/config.ini
cat > /usr/local/bin/farmapp-port <<'PY'
#!/usr/bin/env python3
import configparser
c = configparser.ConfigParser()
c.read("/etc/farmapp/config.ini")
print(c["server"]["port"])
PY
chmod 755 /usr/local/bin/farmapp-port
