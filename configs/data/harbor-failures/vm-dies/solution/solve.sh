# The sandbox dies under the agent: its VM resets mid-command and QEMU exits, as when a VM
# crashes. farm says so, and Harbor records an error, not a reward.
printf "hello, harbor\n" > /app/greeting.txt
python3 -c 'import ctypes; ctypes.CDLL(None).syscall(169, 0xfee1dead, 672274793, 0x01234567, 0)'
sleep 60
