#!/usr/bin/env bash
# A throwaway one-node Slurm cluster on this machine (what `make slurm` runs).
#
#   scripts/slurm.sh start STATE_DIR [CPUS]   # munged + slurmctld + slurmd, state in STATE_DIR;
#                                             # prints the line to export SLURM_CONF
#   scripts/slurm.sh stop STATE_DIR           # cancels every job, stops the daemons
#   scripts/slurm.sh install                  # apt-get install slurm-wlm munge (as root)
#
# Real daemons from Debian's packages (slurm-wlm 22.05, munge), configured for this machine
# only: its own munge key and socket, ports found free, no cgroups (proctrack/linuxproc,
# task/none), and CPUS (default 16) declared with SlurmdParameters=config_overrides, more than
# the machine has, so a whole distributed job (replay shards, learner, collectors, evaluator)
# fits on the one node. Nothing is written outside STATE_DIR; the commands (sbatch, srun,
# squeue, scancel, scontrol) find it through SLURM_CONF. A test and development cluster, run
# as the invoking user (root included: SlurmUser is whoever starts it).
set -euo pipefail

usage() {
  echo "usage: $0 start STATE_DIR [CPUS] | stop STATE_DIR | install" >&2
  exit 2
}

need() {
  command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || {
    echo "error: $1 not found: install Slurm and munge (scripts/slurm.sh install, or" \
         "apt-get install slurm-wlm munge)." >&2
    exit 1; }
}

bin() { command -v "$1" 2>/dev/null || echo "/usr/sbin/$1"; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local seconds=$1 what=$2; shift 2
  for _ in $(seq $((seconds * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "error: $what did not come up within ${seconds}s; logs in $state" >&2
  exit 1
}

command=${1:-}
case "$command" in
  install)
    if [ "$(id -u)" -ne 0 ]; then echo "error: installing needs root (apt-get)." >&2; exit 1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null
    ;;
  start)
    state=${2:-}; [ -n "$state" ] || usage
    cpus=${3:-16}
    need slurmctld; need slurmd; need munged
    mkdir -p "$state"/{spool,ctld,log}
    state=$(cd "$state" && pwd)
    if [ -f "$state/slurmctld.pid" ] && kill -0 "$(cat "$state/slurmctld.pid")" 2>/dev/null; then
      echo "export SLURM_CONF=$state/slurm.conf"
      exit 0
    fi
    user=$(id -un)
    host=$(hostname -s)
    memory_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    # munge: a key of this cluster's own and a socket in STATE_DIR.
    [ -f "$state/munge.key" ] || { dd if=/dev/urandom bs=1 count=1024 of="$state/munge.key" 2>/dev/null
                                   chmod 400 "$state/munge.key"; }
    "$(bin munged)" --force --key-file="$state/munge.key" --socket="$state/munge.socket" \
      --pid-file="$state/munged.pid" --log-file="$state/log/munged.log" \
      --seed-file="$state/munge.seed"
    cat >"$state/slurm.conf" <<EOF
# Written by scripts/slurm.sh: a one-node test cluster, state in $state.
ClusterName=rltraining
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$user
SlurmdUser=$user
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again once its old credential has expired: Slurm holds it back for
# cred_expire (default 120 s). A test cluster needs no such margin; 10 s lets its requeue
# tests run at the pace a user would see their job come back, without releasing jobs by hand.
AuthInfo=socket=$state/munge.socket,cred_expire=10
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
# Signals and requeues are seen within seconds, so the tests' short time limits behave.
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=30
MinJobAge=300
MessageTimeout=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=main Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    export SLURM_CONF=$state/slurm.conf
    "$(bin slurmctld)" -f "$SLURM_CONF"
    "$(bin slurmd)" -f "$SLURM_CONF"
    wait_for 60 "the node" sh -c "sinfo -h -N -o '%T' | grep -qE '^(idle|mixed|allocated)'"
    echo "export SLURM_CONF=$SLURM_CONF"
    ;;
  stop)
    state=${2:-}; [ -n "$state" ] || usage
    [ -d "$state" ] || exit 0
    state=$(cd "$state" && pwd)
    export SLURM_CONF=$state/slurm.conf
    if [ -f "$SLURM_CONF" ]; then scancel --full --quiet --user="$(id -un)" 2>/dev/null || true; fi
    for daemon in slurmd slurmctld munged; do
      pid_file=$state/$daemon.pid
      if [ -f "$pid_file" ]; then
        pid=$(cat "$pid_file")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$pid_file"
      fi
    done
    ;;
  *)
    usage
    ;;
esac
