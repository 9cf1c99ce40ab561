#!/usr/bin/env bash
# A single-node Slurm on this machine, for farm's tests and for trying the Slurm scripts:
# munged, slurmctld and slurmd on localhost, run as root, with every file (configuration,
# state, logs, the munge key and socket) in DIR. Nothing outside DIR is touched.
#
#   scripts/slurm/local-cluster.sh start DIR    prints `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm/local-cluster.sh stop DIR
#
# With SLURM_CLUSTER_OWNER=PID, the cluster (and every job it runs) is stopped when that
# process ends, however it ends: a watcher checks once a second (farm's tests set it, so a
# test binary killed by a signal leaves no daemon or job behind).
#
# Needs Debian's slurm-wlm and munge (scripts/setup.sh installs them). The settings suit a host
# whose cgroup controllers are v1 and that has no systemd: processes tracked by the Linux
# process tree (proctrack/linuxproc), no task plugin, cgroup/v1 with IgnoreSystemd.
set -euo pipefail
die() { echo "local-cluster: $*" >&2; exit 1; }
[ $# -eq 2 ] || die "usage: $0 start|stop DIR"
action=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)

stop() {
  for name in slurmd slurmctld munged; do
    if [ -f "$dir/$name.pid" ]; then
      pid=$(cat "$dir/$name.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/$name.pid"
    fi
  done
  # Jobs' processes left by slurmd (proctrack/linuxproc tracks them by the process tree):
  # each step daemon with everything under it, the job's own commands included.
  for pid in $(pgrep -f "slurmstepd: \[.*\]" || true); do kill_tree "$pid"; done
  rm -f "$dir/running"
}

kill_tree() {
  local child
  kill -STOP "$1" 2>/dev/null || true
  for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
  kill -9 "$1" 2>/dev/null || true
}

case "$action" in
  stop) stop; exit 0 ;;
  start) ;;
  *) die "unknown action $action (start or stop)" ;;
esac

[ "$(id -u)" = 0 ] || die "run as root (slurmd starts jobs as their users)"
for tool in munged slurmctld slurmd sbatch scontrol; do
  command -v "$tool" >/dev/null || die "$tool not found: install slurm-wlm and munge (scripts/setup.sh does)"
done
stop
mkdir -p "$dir"/{state,spool,munge}
chmod 700 "$dir/munge"

# Munge: a key of this cluster's own, a socket in DIR.
if [ ! -f "$dir/munge/munge.key" ]; then
  head -c 1024 /dev/urandom > "$dir/munge/munge.key"
fi
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/munge.seed"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
cpus=$(nproc)
mem_mib=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
cat > "$dir/slurm.conf" <<CONF
ClusterName=farm-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
KillWait=5
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
PartitionName=farm Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
cat > "$dir/cgroup.conf" <<CONF
CgroupPlugin=cgroup/v1
IgnoreSystemd=yes
CONF
export SLURM_CONF=$dir/slurm.conf
touch "$dir/running"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N "$host"

if [ -n "${SLURM_CLUSTER_OWNER:-}" ]; then
  # shellcheck disable=SC2016
  nohup bash -c 'while kill -0 "$1" 2>/dev/null && [ -f "$2/running" ]; do sleep 1; done
    if [ -f "$2/running" ]; then bash "$3" stop "$2"; fi' \
    slurm-cluster-watcher "$SLURM_CLUSTER_OWNER" "$dir" "$(cd "$(dirname "$0")" && pwd)/$(basename "$0")" \
    >/dev/null 2>&1 < /dev/null &
fi

# Up when the node is idle.
for _ in $(seq 300); do
  state=$(sinfo -h -N -o '%t' 2>/dev/null | head -1 || true)
  case "$state" in idle*|mix*|alloc*) echo "export SLURM_CONF=$SLURM_CONF"; exit 0 ;; esac
  sleep 0.2
done
echo "local-cluster: the node did not come up (state: ${state:-none}); logs in $dir:" >&2
tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" "$dir/munged.log" >&2 || true
stop
exit 1
