# Kill the guest agent (and everything else it can).
kill -9 $PPID 2>/dev/null
pkill -9 farm-agent 2>/dev/null
kill -9 -1
