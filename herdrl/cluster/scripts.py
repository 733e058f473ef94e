"""Batch scripts for ``herd launch slurm`` and ``herd launch pbs``: plain bash a user can read and edit.

Slurm: the script starts the head on the job's first node (one ``srun`` step that stays in the
foreground), waits until the head answers, starts one worker step per other node, waits until every node
has joined (``herd cluster wait`` polls, bounded: no fixed sleeps), runs the driver with ``RAY_ADDRESS``
set, and on exit — driver done, failed, or the job cancelled — ends the steps; each step stops its own Ray
node by PID (``herd cluster node`` never calls ``ray stop``). With ``--time``, Slurm signals the script
``signal_lead_s`` before the walltime; the script passes it to the driver, which checkpoints and exits with
:data:`~herdrl.errors.EXIT_REQUEUE`; with ``--max-jobs N`` the job then submits the next one of the chain, which
resumes the trial.

PBS / Cobalt: the script hands the nodes to the MPI bootstrap (``herd launch mpi``) with the site's
launcher (``mpiexec``, ``aprun`` or ``mpirun``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from herdrl.cluster.connect import ClusterError
from herdrl.cluster.nodes import AUTH_TOKEN_FILE, NodeOptions
from herdrl.errors import EXIT_REQUEUE, STOP_AT_ENV

#: Default seconds between Slurm's walltime signal and the walltime: the driver's iteration in progress plus a
#: checkpoint (writing a replay buffer of several GB takes tens of seconds: docs/hpc.md has the measurement).
DEFAULT_SIGNAL_LEAD_S = 300


def launching_herd() -> str:
    """The ``herd`` this launch runs as, by absolute path: the running ``herd`` command itself, else the one beside
    this interpreter (a venv's), else the one on ``PATH``; plain ``herd`` when none is found."""
    running = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    candidates = [running] if running is not None and running.name == "herd" else []
    candidates.append(Path(sys.executable).parent / "herd")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return shutil.which("herd") or "herd"


@dataclass
class BatchJob:
    """Everything a batch script needs: resources, the site's setup lines, and the driver command."""

    driver: list[str]
    launch_dir: Path
    workdir: Path
    nodes: int = 2
    node_options: NodeOptions = field(default_factory=NodeOptions)
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    job_name: str = "herd"
    setup: list[str] = field(default_factory=list)
    unset_ld_preload: bool = False
    #: Jobs in a chain: a driver stopped by the walltime signal exits with EXIT_REQUEUE and the job submits the next
    #: one (``--dependency=afterany``), which resumes the trial; 1: no chain.
    max_jobs: int = 1
    #: Seconds before the walltime Slurm sends SIGUSR1 (``--signal=B:USR1@LEAD``): one iteration and a checkpoint.
    #: None: :data:`DEFAULT_SIGNAL_LEAD_S`, or a quarter of a shorter walltime (see :attr:`lead_s`).
    signal_lead_s: int | None = None
    #: The ``herd`` the nodes run: the launching interpreter's, by absolute path (a shared file system is assumed:
    #: the same path on every node), unless ``setup`` lines prepare the nodes' own environment (then ``herd`` as
    #: found on their PATH).
    herd: str = field(default_factory=lambda: launching_herd())

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ClusterError(f"--nodes must be at least 1, got {self.nodes}")
        if self.time is not None and not _valid_time(self.time):
            raise ClusterError(f"--time '{self.time}' is not a walltime: use HH:MM:SS, MM:SS or D-HH:MM:SS")
        if not self.driver:
            raise ClusterError("give the driver command after --, e.g. -- herd train ppo --env CartPole-v1")
        if self.max_jobs < 1:
            raise ClusterError(f"--max-jobs must be at least 1, got {self.max_jobs}")
        if self.signal_lead_s is not None and self.signal_lead_s < 1:
            raise ClusterError(f"--signal-lead must be at least 1 second, got {self.signal_lead_s}")
        if self.signal_lead_s is not None and self.time is not None and self.signal_lead_s >= walltime_s(self.time):
            raise ClusterError(f"--signal-lead {self.signal_lead_s} s is not shorter than the walltime --time "
                               f"{self.time}: the driver would be stopped before it trained")
        if self.max_jobs > 1:
            if self.time is None:
                raise ClusterError("--max-jobs chains jobs at their walltime: give --time too")
            if self.driver[:2] not in (["herd", "train"], ["herd", "tune"]):
                raise ClusterError("--max-jobs chains `herd train` and `herd tune` drivers (each next job resumes "
                                   f"the trial or sweep): the driver here is `{shlex.join(self.driver[:2])}`")
            named = self.resumes_itself or any(arg == "--trial" or arg.startswith("--trial=") for arg in self.driver)
            if self.driver[1] == "train" and not named:
                self.driver = [*self.driver, "--trial", self.launch_dir.name]  # every job resumes this one trial
        if self.setup:
            self.herd = "herd"

    @property
    def resumes_itself(self) -> bool:
        """Whether the driver is given ``--resume`` or ``--resume-if-any`` already (a chain continuing an earlier
        run): then no job of the chain adds a resume flag."""
        return any(arg in ("--resume", "--resume-if-any") for arg in self.driver)

    @property
    def lead_s(self) -> int:
        """Seconds between the walltime signal and the walltime: ``signal_lead_s``, else the default or a quarter of
        a walltime shorter than four times it."""
        if self.signal_lead_s is not None:
            return self.signal_lead_s
        if self.time is None:
            return DEFAULT_SIGNAL_LEAD_S
        return max(1, min(DEFAULT_SIGNAL_LEAD_S, walltime_s(self.time) // 4))

    @property
    def driver_command(self) -> list[str]:
        """The driver, with a leading ``herd`` run as :attr:`herd` (other commands as given)."""
        return [self.herd, *self.driver[1:]] if self.driver[0] == "herd" else list(self.driver)

    def herd_check(self, where: str) -> str:
        """Shell text failing with one line unless :attr:`herd` runs (``where``: the node's name): its interpreter
        and herdrl must be there too, not only the script."""
        if not self.herd.startswith("/"):
            return (f'herd --version >/dev/null 2>&1 || {{ echo "herd launch: no working herd on PATH on {where} '
                    f'after the --setup lines" >&2; exit 1; }}')
        quoted = shlex.quote(self.herd)
        return (f'{quoted} --version >/dev/null 2>&1 || {{ echo "herd launch: "{quoted}" does not run on {where}: '
                f'herdrl must be installed at the same path on every node (a shared file system), or give --setup" '
                f'>&2; exit 1; }}')

    def preamble(self, token: bool = True) -> list[str]:
        """Lines every script runs first: strict mode, working dir, setup, and (``token``) the auth
        environment naming the launch dir's token file (the MPI bootstrap makes its own instead)."""
        lines = ["set -uo pipefail", f"cd {shlex.quote(str(self.workdir))}"]
        lines += self.setup
        if self.unset_ld_preload:
            lines.append("unset LD_PRELOAD  # site preload libraries (e.g. darshan) crash Ray's processes")
        if token:
            path = shlex.quote(str(self.launch_dir / AUTH_TOKEN_FILE))
            lines.append(f"export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={path}")
        return lines


def _chain_lines(job: BatchJob) -> str:
    """The end of a Slurm script: run the driver in the background (so the job's signals reach it while the shell
    waits), and when it stopped for the walltime, submit the next job of the chain."""
    launch_dir = shlex.quote(str(job.launch_dir))
    if job.resumes_itself:
        resume = "resume=()  # the driver resumes by itself, in every job\n"
    else:
        resume = """\
resume=()
if [ "$max_jobs" -gt 1 ] && [ "$chain_index" -gt 1 ]; then
  resume=(--resume)  # a later job of the chain (the one before it checkpointed): continue the trial
elif [ "$max_jobs" -gt 1 ] && [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then
  resume=(--resume-if-any)  # this job requeued by Slurm (preemption), perhaps before its first checkpoint
fi
"""
    return f"""\
chain_index=${{HERD_CHAIN_INDEX:-1}}
max_jobs={job.max_jobs}
{resume}driver_pid=
forward() {{  # forward SIGNAL CODE: the driver checkpoints after its iteration and exits; without one, exit CODE
  if [ -n "$driver_pid" ] && kill -0 "$driver_pid" 2>/dev/null; then kill -"$1" "$driver_pid"; else exit "$2"; fi
}}
walltime() {{  # the driver may have just finished: then there is nothing to stop, and its own exit code stands
  echo "herd launch: the walltime is near (SIGUSR1): the driver checkpoints after this iteration"
  if [ -n "$driver_pid" ] && kill -0 "$driver_pid" 2>/dev/null; then kill -USR1 "$driver_pid"; fi
}}
trap walltime USR1
trap 'forward TERM 143' TERM
trap 'forward INT 130' INT
{shlex.join(job.driver_command)} ${{resume[@]+"${{resume[@]}}"}} &
driver_pid=$!
while :; do  # `wait` returns early (128 + the signal) when a trap runs: wait again until the driver has exited
  wait "$driver_pid"
  rc=$?
  kill -0 "$driver_pid" 2>/dev/null && continue
  if [ "$rc" -gt 128 ]; then  # it exited while a trap ran: its own status, if bash still holds it
    wait "$driver_pid" 2>/dev/null
    again=$?
    [ "$again" = 127 ] || rc=$again
  fi
  break
done
driver_pid=
echo "herd launch: driver exited with $rc"
if [ "$rc" = {EXIT_REQUEUE} ]; then
  if [ "$chain_index" -lt "$max_jobs" ]; then
    if next=$(unset RAY_ADDRESS; sbatch --parsable --dependency=afterany:"$SLURM_JOB_ID" \\
        --export=ALL,HERD_CHAIN_INDEX=$((chain_index + 1)) {launch_dir}/job.sbatch); then
      echo "herd launch: submitted job ${{next%%;*}}, $((chain_index + 1)) of at most $max_jobs:" \\
        "it resumes the run once this job ends"
      rc=0
    else
      echo "herd launch: could not submit the next job; resume by hand with --resume" >&2
    fi
  else
    echo "herd launch: --max-jobs $max_jobs reached and training is not done: launch again with --resume" >&2
  fi
fi
exit $rc
"""


def walltime_s(text: str) -> int:
    """Seconds in a Slurm/PBS walltime: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # after a day count, Slurm reads hours first
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(parts) == 1:
        return parts[0] * 60  # minutes
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def _valid_time(text: str) -> bool:
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    return (not days or days.isdigit()) and 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)


def _directives(prefix: str, pairs: list[tuple[str, object]]) -> list[str]:
    return [f"{prefix} {flag}{value}" for flag, value in pairs if value is not None and value != ""]


def slurm_script(job: BatchJob) -> str:
    """The sbatch script: Ray on every node of the allocation, the driver on the first."""
    o = job.node_options
    header = ["#!/bin/bash", *_directives("#SBATCH", [
        ("--job-name=", job.job_name), ("--nodes=", job.nodes), ("--ntasks-per-node=", 1),
        ("--cpus-per-task=", o.num_cpus), ("--gpus-per-node=", o.num_gpus), ("--time=", job.time),
        ("--signal=", f"B:USR1@{job.lead_s}" if job.time else None),
        ("--partition=", job.partition), ("--account=", job.account),
        ("--output=", shlex.quote(str(job.launch_dir / "slurm-%j.out")))])]
    launch_dir = shlex.quote(str(job.launch_dir))
    node_args = shlex.join(job.node_options.cli_args())
    timeout = f"{o.join_timeout_s:g}"
    body = f"""\
# Written by `herd launch slurm`: Ray on every node of this job, the driver on the first, Ray stopped at the end.
{chr(10).join(job.preamble())}
launch_dir={launch_dir}
job=${{SLURM_CLUSTER_NAME:-slurm}}-${{SLURM_JOB_ID:?run this script with sbatch, or inside an allocation}}
job=$job-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \\n')  # nodes' dirs /tmp/herd-$job-N: no one can create them first
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
node_args=({node_args})
herd={shlex.quote(job.herd)}
# Every node runs this herd: check each has it before starting anything.
srun --nodes=${{#nodes[@]}} --ntasks=${{#nodes[@]}} --ntasks-per-node=1 --overlap \\
  bash -c {shlex.quote(job.herd_check("$(hostname)"))} || exit 1
steps=()
rc=1
stop_ray() {{  # stop each started Ray node by PID (its own temp dir; never `ray stop`), then end the steps
  trap - EXIT TERM INT
  local stoppers=() i files=()
  [ "$rc" = 0 ] && files=(--remove-files)  # after a failure Ray's logs stay in /tmp/herd-$job-* on the nodes
  for i in "${{!steps[@]}}"; do
    srun --nodes=1 --ntasks=1 --overlap -w "${{nodes[$i]}}" \\
      "$herd" cluster node stop --temp-dir "/tmp/herd-$job-$i" ${{files[@]+"${{files[@]}}"}} >/dev/null &
    stoppers+=($!)
  done
  [ ${{#stoppers[@]}} -gt 0 ] && wait "${{stoppers[@]}}"
  for _ in $(seq 100); do steps_alive || break; sleep 0.2; done  # node steps end once their node stopped
  [ ${{#steps[@]}} -gt 0 ] && kill "${{steps[@]}}" 2>/dev/null
  wait
}}
steps_alive() {{
  local pid
  for pid in "${{steps[@]}}"; do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}}
trap stop_ray EXIT
trap 'exit 143' TERM INT
trap 'exit {EXIT_REQUEUE}' USR1  # the walltime signal before the driver started: nothing to checkpoint yet
start_node() {{  # start_node INDEX ARGS...: a foreground Ray node on nodes[INDEX], as one job step
  srun --nodes=1 --ntasks=1 --overlap -w "${{nodes[$1]}}" \\
    "$herd" cluster node start --block --temp-dir "/tmp/herd-$job-$1" "${{node_args[@]}}" "${{@:2}}" &
  steps+=($!)
}}
echo "herd launch: Ray head on ${{nodes[0]}}, $((${{#nodes[@]}} - 1)) worker node(s)"
start_node 0 --head --address-file "$launch_dir/head-$SLURM_JOB_ID"
address=$("$herd" cluster wait --address-file "$launch_dir/head-$SLURM_JOB_ID" --nodes 1 --timeout {timeout} \\
  --watch "${{steps[@]}}") || exit 1
for i in "${{!nodes[@]}}"; do
  [ "$i" -eq 0 ] || start_node "$i" --address "$address"
done
"$herd" cluster wait --address "$address" --nodes ${{#nodes[@]}} --timeout {timeout} --watch "${{steps[@]}}" \\
  >/dev/null || exit 1
echo "herd launch: ${{#nodes[@]}} Ray nodes up at $address after ${{SECONDS}} s; running the driver in $PWD"
export RAY_ADDRESS=$address
""" + _chain_lines(job)
    return "\n".join(header) + "\n" + body


LAUNCHERS = {
    "mpiexec": "mpiexec -n {n} --ppn 1",  # MPICH / Cray PALS (Polaris, Aurora)
    "aprun": "aprun -n {n} -N 1",  # Cray ALPS (Theta)
    "mpirun": "mpirun -np {n} --map-by node",  # Open MPI
}


def pbs_launch_line(job: BatchJob, launcher: str, launcher_args: str = "") -> str:
    """The MPI launch line of a PBS/Cobalt script: one ``herd launch mpi`` rank per node."""
    if launcher not in LAUNCHERS:
        raise ClusterError(f"unknown --launcher '{launcher}': choose one of {', '.join(LAUNCHERS)}")
    parts = [LAUNCHERS[launcher].format(n=job.nodes)]
    if launcher_args:
        parts.append(launcher_args)
    parts += [shlex.quote(job.herd), "launch mpi", shlex.join(job.node_options.cli_args()), "--",
              shlex.join(job.driver_command)]
    return " ".join(parts)


def pbs_script(job: BatchJob, launcher: str = "mpiexec", flavor: str = "pbs", launcher_args: str = "") -> str:
    """The qsub script (PBS Pro ``#PBS`` or Cobalt ``#COBALT`` directives) around the MPI bootstrap."""
    o = job.node_options
    launch = pbs_launch_line(job, launcher, launcher_args)  # checks the launcher first
    out = shlex.quote(str(job.launch_dir / f"{flavor}.out"))
    if flavor == "pbs":
        select = f"select={job.nodes}" + (f":ncpus={o.num_cpus}" if o.num_cpus else "") + (
            f":ngpus={o.num_gpus}" if o.num_gpus else "")
        header = _directives("#PBS", [("-N ", job.job_name), ("-l ", select), ("-l place=", "scatter"),
                                      ("-l walltime=", job.time), ("-q ", job.partition), ("-A ", job.account),
                                      ("-j ", "oe"), ("-o ", out)])
    elif flavor == "cobalt":
        header = _directives("#COBALT", [("-n ", job.nodes), ("-t ", job.time), ("-q ", job.partition),
                                         ("-A ", job.account), ("--jobname ", job.job_name), ("-o ", out),
                                         ("-e ", out)])
    else:
        raise ClusterError(f"unknown --flavor '{flavor}': choose pbs or cobalt")
    if job.max_jobs > 1 and flavor != "pbs":
        raise ClusterError("--max-jobs chains PBS Pro jobs (qsub -W depend=afterany); with Cobalt, resubmit with "
                           "--resume")
    lines = ["#!/bin/bash", *header,
             f"# Written by `herd launch pbs`: one `herd launch mpi` rank per node ({launcher}); rank 0 = driver.",
             *job.preamble(token=False)]
    if job.time:  # no signal comes before the walltime here: herd train stops itself, with a checkpoint, by then
        lines.append(f"export {STOP_AT_ENV}=$(( $(date +%s) + {walltime_s(job.time)} - {job.lead_s} ))"
                     "  # the walltime less --signal-lead")
    lines += [
        # Every node runs this herd: check each has it before starting anything.
        " ".join([LAUNCHERS[launcher].format(n=job.nodes), *([launcher_args] if launcher_args else []),
                  "bash -c", shlex.quote(job.herd_check("$(hostname)")), "|| exit 1"]),
        "echo \"herd launch: results go under $PWD\""]
    if job.max_jobs == 1:
        return "\n".join([*lines, launch]) + "\n"
    script = shlex.quote(str(job.launch_dir / "job.pbs"))
    if job.resumes_itself:
        resume = "resume=()  # the driver resumes by itself, in every job\n"
    else:
        resume = 'resume=()\n[ "$chain_index" -gt 1 ] && resume=(--resume)  # a later job of the chain: continue\n'
    chain = f"""\
chain_index=${{HERD_CHAIN_INDEX:-1}}
{resume}{launch} ${{resume[@]+"${{resume[@]}}"}}
rc=$?
echo "herd launch: driver exited with $rc"
if [ "$rc" = {EXIT_REQUEUE} ]; then
  if [ "$chain_index" -lt {job.max_jobs} ]; then
    if next=$(qsub -W depend=afterany:"$PBS_JOBID" -v HERD_CHAIN_INDEX=$((chain_index + 1)) {script}); then
      echo "herd launch: submitted job $next, $((chain_index + 1)) of at most {job.max_jobs}: it resumes the run"
      rc=0
    else
      echo "herd launch: could not submit the next job; resume by hand with --resume" >&2
    fi
  else
    echo "herd launch: --max-jobs {job.max_jobs} reached and training is not done: launch again with --resume" >&2
  fi
fi
exit $rc
"""
    return "\n".join(lines) + "\n" + chain
