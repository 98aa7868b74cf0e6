#!/usr/bin/env bash
# A real one-node Slurm on the loopback interface, for the Slurm executor's tests
# (tests/it/slurm.rs). Debian's slurmctld, slurmd and munge, started by hand (no systemd), two
# fake GPUs declared as gres (character devices with /dev/null's numbers). No accounting
# database: finished jobs stay visible to `squeue -t all` for MinJobAge (60 s), which is what
# upcc reads; `sacct` is used when present. See ../shared/reference/slurm-local.md.
# MaxJobCount (60, finished jobs included while visible) is below the smoke spec's 68 nodes, so
# an executor that queued one job per node could not run it here (tests/it/slurm.rs).
#
#   bash .ci/slurm.sh up     install if needed, configure, start, wait until the node is idle
#   bash .ci/slurm.sh down   cancel every job, wait for them, stop the daemons
#
# SLURM_CI_DIR (default /tmp/upcc-slurm-ci) holds state, spool, logs, pid files and devices.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
dir="${SLURM_CI_DIR:-/tmp/upcc-slurm-ci}"

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null; then
        return
    fi
    echo "== installing slurmctld, slurmd, slurm-client and munge from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

configure() {
    mkdir -p "$dir"/{state,spool,log,run,dev}
    for i in 0 1; do
        [ -c "$dir/dev/nvidia$i" ] || mknod "$dir/dev/nvidia$i" c 1 3
    done
    local topo mem
    topo=$(slurmd -C | head -1 | grep -o 'CPUs=.*ThreadsPerCore=[0-9]*')
    mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    mkdir -p /etc/slurm
    cat > /etc/slurm/slurm.conf <<EOF
ClusterName=upcc-ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
ReturnToService=2
MinJobAge=60
MaxJobCount=60
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 $topo RealMemory=$mem Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    echo "Name=gpu File=$dir/dev/nvidia[0-1]" > /etc/slurm/gres.conf
}

wait_idle() {
    for _ in $(seq 1 200); do
        case "$(sinfo -h -o %T 2>/dev/null || true)" in
        idle) return 0 ;;
        *drain* | *inval*) scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 0.1
    done
    echo "error: the Slurm node did not become idle; logs in $dir/log" >&2
    sinfo >&2 || true
    tail -20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
    return 1
}

up() {
    install_packages
    down quiet
    configure
    install -d -o munge -g munge -m 755 /run/munge
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged
    fi
    slurmctld
    slurmd -N localhost
    wait_idle
    echo "== Slurm is up: $(sinfo -h -o '%P %T %C %G')"
}

stop_pidfile() {
    local f="$1"
    [ -f "$f" ] || return 0
    local pid
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$f"; return 0; }
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
}

down() {
    if command -v scancel >/dev/null && [ -f "$dir/run/slurmctld.pid" ]; then
        scancel --partition=debug 2>/dev/null || true
        for _ in $(seq 1 100); do
            [ -z "$(squeue -h 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    stop_pidfile "$dir/run/slurmd.pid" &
    stop_pidfile "$dir/run/slurmctld.pid" &
    wait
    # A fresh state directory next time: job ids restart, nothing of this run is replayed.
    rm -rf "$dir/state" "$dir/spool"
    [ "${1:-}" = quiet ] || echo "== Slurm is down"
}

case "${1:-}" in
up) up ;;
down) down ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
