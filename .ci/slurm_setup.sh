#!/usr/bin/env bash
# Make a one-node Slurm cluster answer on this machine, for the slurm tests.
#
#   .ci/slurm_setup.sh           # idempotent; prints the slurm.conf path on stdout
#
# Steps (each skipped when already done):
#   a. no slurmctld/slurmd/munged/sbatch: as root with apt, install slurm-wlm and munge;
#   b. munged does not answer: start it as the munge user;
#   c. write $DIR/slurm.conf (this host as controller and only node, on 127.0.0.1;
#      state, spool, logs and pid files under $DIR); if our daemons run with another
#      configuration, stop them (by the pid files in $DIR: only what this script started);
#   d. start slurmctld and slurmd (root), wait until `srun -n1 true` works.
#
# The node declares more CPUs than the machine has (SlurmdParameters=config_overrides):
# the tests' jobs are short and mostly idle, and several must run at once on 2 cores.
#
# Exit codes: 0 ready; 77 this machine cannot run it (not root, or no apt-get): the
# reason on stderr; anything else: a failure, with the tail of the failing step's log.
#
# Environment overrides: FIBERLITE_SLURM_DIR (/tmp/fiberlite-slurm),
# FIBERLITE_SLURM_CPUS (8), FIBERLITE_SLURM_PORTS (6817, and the next one for slurmd).
set -euo pipefail

DIR="${FIBERLITE_SLURM_DIR:-/tmp/fiberlite-slurm}"
CPUS="${FIBERLITE_SLURM_CPUS:-8}"
CTLD_PORT="${FIBERLITE_SLURM_PORTS:-6817}"
SLURMD_PORT="$((CTLD_PORT + 1))"
CONF="$DIR/slurm.conf"
SETUP=slurm_setup
STEP_LOGS="$DIR/setup-logs"
# shellcheck source=steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
cannot() { printf '[slurm_setup] CANNOT SET UP SLURM HERE: %s\n' "$*" >&2; exit 77; }

mkdir -p "$DIR" "$STEP_LOGS"
exec 9>"$DIR/setup.lock"
flock -w 600 9 || die "timed out waiting for the lock $DIR/setup.lock"

# ---- a. packages -------------------------------------------------------------
missing() {
    local cmd
    for cmd in slurmctld slurmd munged munge sbatch squeue scancel srun; do
        command -v "$cmd" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 || return 0
    done
    return 1
}
export PATH="$PATH:/usr/sbin:/sbin"
if missing; then
    [[ $EUID -eq 0 ]] || cannot "Slurm is not installed and this is not root: install slurm-wlm and munge, or run the tests as root"
    command -v apt-get >/dev/null 2>&1 || cannot "Slurm is not installed and apt-get is unavailable: install slurm-wlm and munge"
    log "installing slurm-wlm and munge with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends slurm-wlm munge \
            >"$DIR/setup-apt-install.log" 2>&1; then
        run apt-update apt-get update
        run apt-install apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends slurm-wlm munge
    fi
    missing && die "slurm-wlm and munge are installed but a command is still missing"
fi
[[ $EUID -eq 0 ]] || {
    # installed, but daemons need root (SlurmUser=root): usable only if they already run
    SLURM_CONF="$CONF" timeout 10 scontrol ping 2>/dev/null | grep -q UP && { echo "$CONF"; exit 0; }
    cannot "no fiberlite test cluster runs and starting one needs root"
}

# ---- b. munge ------------------------------------------------------------------
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
if ! munge_ok; then
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating the munge key"
        run mungekey mungekey --create
        chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    log "starting munged"
    if command -v runuser >/dev/null 2>&1; then
        run munged runuser -u munge -- munged 9>&-
    else
        run munged su -s /bin/sh munge -c munged 9>&-
    fi
    for _ in $(seq 50); do munge_ok && break; sleep 0.2; done
    munge_ok || die "munged does not answer (see /var/log/munge/munged.log)"
fi

# ---- c. configuration ------------------------------------------------------------
HOST="$(hostname -s)"
MEMORY="$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')"
[[ -n "$MEMORY" ]] || MEMORY=4096
mkdir -p "$DIR/state" "$DIR/spool"
WANTED="$(cat <<EOF
# written by .ci/slurm_setup.sh: a one-node cluster for fiberlite's tests
ClusterName=fiberlite
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=256
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEMORY State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
)"

running() {  # running NAME: the daemon whose pid file is in $DIR runs
    local pid
    pid="$(cat "$DIR/$1.pid" 2>/dev/null)" || return 1
    [[ -n "$pid" ]] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$1" ]]
}
stop() {
    local name pid
    for name in slurmd slurmctld; do
        if running "$name"; then
            pid="$(cat "$DIR/$name.pid")"
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 50); do [[ -d /proc/$pid ]] || break; sleep 0.2; done
        fi
    done
}
ready() { SLURM_CONF="$CONF" timeout 10 scontrol ping 2>/dev/null | grep -q UP \
          && SLURM_CONF="$CONF" timeout 10 sinfo -h -o %t 2>/dev/null | grep -qvE 'down|drain|fail|unk'; }

if [[ "$(cat "$CONF" 2>/dev/null)" != "$WANTED" ]]; then
    running slurmctld || running slurmd && { log "configuration changed: restarting the test cluster"; stop; }
    printf '%s\n' "$WANTED" >"$CONF"
fi
if running slurmctld && running slurmd && ready; then
    echo "$CONF"
    exit 0
fi

# ---- d. daemons ----------------------------------------------------------------------
export SLURM_CONF="$CONF"
if ! running slurmctld; then
    log "starting slurmctld (log: $DIR/slurmctld.log)"
    # own session, no inherited descriptors: it outlives this script and its caller
    setsid slurmctld -f "$CONF" -c -i </dev/null >/dev/null 2>&1 9>&- || die "slurmctld did not start (log: $DIR/slurmctld.log)"
fi
if ! running slurmd; then
    log "starting slurmd (log: $DIR/slurmd.log)"
    setsid slurmd -f "$CONF" </dev/null >/dev/null 2>&1 9>&- || die "slurmd did not start (log: $DIR/slurmd.log)"
fi
for _ in $(seq 150); do
    timeout 10 srun -n1 -t 1 true >/dev/null 2>&1 && { log "Slurm ready"; echo "$CONF"; exit 0; }
    sleep 0.2
done
tail -n 20 "$DIR/slurmctld.log" "$DIR/slurmd.log" 2>/dev/null | sed 's/^/    | /' >&2
die "srun -n1 true did not work within 30 s (logs: $DIR/slurmctld.log, $DIR/slurmd.log)"
