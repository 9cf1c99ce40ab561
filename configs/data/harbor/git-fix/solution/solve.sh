#!/bin/bash
set -e
cd /repo
printf "def double(x):\n    return 2 * x\n" > double.py
git commit -qam "fix double"
