# Fill the disk; the rollout's disk limit must end it without harming the host.
dd if=/dev/zero of=/workspace/fill bs=1M count=4000 2>&1 | tail -1
sync
