#!/bin/bash
#COBALT -n 4
#COBALT -t 01:30:00
#COBALT -q debug-cache-quad
#COBALT -A rl-proj
#COBALT --jobname cartpole
#COBALT -o /shared/results/launch/cartpole_2026-01-01_00-00-00/cobalt.out
#COBALT -e /shared/results/launch/cartpole_2026-01-01_00-00-00/cobalt.out
# Written by `herd launch pbs`: one `herd launch mpi` rank per node (aprun); rank 0 = driver.
set -uo pipefail
cd /shared/project
module load python/3.11
source /shared/project/.venv/bin/activate
unset LD_PRELOAD  # site preload libraries (e.g. darshan) crash Ray's processes
export HERD_STOP_AT=$(( $(date +%s) + 5400 - 300 ))  # the walltime less --signal-lead
aprun -n 4 -N 1 bash -c 'herd --version >/dev/null 2>&1 || { echo "herd launch: no working herd on PATH on $(hostname) after the --setup lines" >&2; exit 1; }' || exit 1
echo "herd launch: results go under $PWD"
aprun -n 4 -N 1 herd launch mpi --num-cpus 16 --num-gpus 1 --interface ib0 --join-timeout 600 -- herd train ppo --env CartPole-v1 --num-env-runners 15 --output /shared/results
