#!/bin/bash
# A wrong answer, and a process that resets the guest the moment this script (the agent's
# phase) ends, before the verifier can start: a failure laundered into an environment error
# if farm blamed itself for a guest that is gone.
echo 7 > /app/answer.txt
setsid nohup python3 -c '
import ctypes, os, sys, time
parent = sys.argv[1]
libc = ctypes.CDLL(None)
while os.path.exists("/proc/" + parent):
    time.sleep(0.001)
libc.syscall(169, 0xfee1dead, 672274793, 0x01234567, 0)  # reboot(LINUX_REBOOT_CMD_RESTART)
' $$ > /dev/null 2>&1 < /dev/null &
sleep 3
exit 0
