#!/bin/bash
# Install what the cluster tests run for real, when it is missing (Debian/Ubuntu, as root):
#   slurm -> slurm-wlm + munge; mpi -> openmpi-bin; ssh -> openssh-server, openssh-client, rsync.
# usage: install.sh slurm mpi ssh     exit 0 = all present afterwards; otherwise one line says why not.
set -u
need=()
for what in "$@"; do
  case $what in
    slurm) { command -v slurmctld && command -v slurmd && command -v munged; } >/dev/null 2>&1 || need+=(slurm-wlm munge) ;;
    mpi) command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin) ;;
    ssh) { command -v sshd || [ -x /usr/sbin/sshd ]; } >/dev/null 2>&1 || need+=(openssh-server)
         command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
         command -v rsync >/dev/null 2>&1 || need+=(rsync) ;;
    *) echo "unknown service '$what' (slurm, mpi, ssh)"; exit 2 ;;
  esac
done
[ ${#need[@]} -eq 0 ] && exit 0
[ "$(id -u)" = 0 ] || { echo "not root: cannot apt-get install ${need[*]}"; exit 1; }
command -v apt-get >/dev/null 2>&1 || { echo "no apt-get on this machine: install ${need[*]} by hand"; exit 1; }
export DEBIAN_FRONTEND=noninteractive
exec 9>/tmp/herd-test-apt.lock && flock 9   # one apt at a time
log=$(mktemp)
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$log" 2>&1; then
  echo "apt-get install ${need[*]} failed: $(grep -i -m1 'E:' "$log" || tail -1 "$log")"; rm -f "$log"; exit 1
fi
rm -f "$log"
