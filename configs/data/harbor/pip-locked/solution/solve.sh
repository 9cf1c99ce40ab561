#!/bin/bash
cat > /app/report.py <<'PY'
import iniconfig
for key, value in iniconfig.IniConfig("/app/settings.ini")["app"].items():
    print(f"{key}={value}")
PY
