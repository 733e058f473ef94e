"""A real Slurm on this host for tests: munged, slurmctld and N slurmd ("fake nodes" node1..N, allowed by
Debian's multiple-slurmd build), all on free ports with state, logs and pid files under one temp dir.
Stopped with `scontrol shutdown` of this cluster only (its own SLURM_CONF), then by PID."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

CONF = """\
ClusterName={name}
SlurmctldHost=localhost
SlurmUser=root
SlurmctldPort={ctld_port}
AuthType=auth/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=node[1-{nodes}] NodeHostname=localhost NodeAddr=127.0.0.1 Port={first_node_port}-{last_node_port} \
CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _free_block(size: int) -> int:
    """First of ``size`` consecutive free ports (outside Ray's 10002-19999 worker range)."""
    for base in range(33000, 40000, size + 7):
        ok = True
        for port in range(base, base + size):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block for Slurm")


def _run(args: list[str], env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)


class SlurmCluster:
    """``with SlurmCluster(3) as slurm: subprocess.run(..., env=slurm.env)``"""

    def __init__(self, nodes: int = 3) -> None:
        self.nodes = nodes
        self.root = Path(tempfile.mkdtemp(prefix="herd-slurm-", dir="/tmp"))
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.own_munged: int | None = None

    def _munge_works(self) -> bool:
        done = subprocess.run("munge -n | unmunge", shell=True, capture_output=True, text=True)
        return done.returncode == 0

    def start(self) -> SlurmCluster:
        """Start munged (unless one answers already), slurmctld and the slurmd; return when all nodes idle."""
        for sub in ("state", "log"):
            (self.root / sub).mkdir()
        base = _free_block(self.nodes + 1)
        self.name = f"herd{secrets.token_hex(3)}"  # Ray temp dirs are /tmp/herd-<cluster>-<job>-<node>
        self.conf.write_text(CONF.format(name=self.name, root=self.root, ctld_port=base, nodes=self.nodes,
                                         first_node_port=base + 1, last_node_port=base + self.nodes))
        if not self._munge_works():
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            _run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"])
            pidfile = Path("/run/munge/munged.pid")
            if pidfile.exists():
                self.own_munged = int(pidfile.read_text().strip())
            if not self._munge_works():
                raise RuntimeError("munged does not answer (munge -n | unmunge fails)")
        started = _run(["slurmctld", "-f", str(self.conf)], self.env)
        if started.returncode != 0:
            raise RuntimeError(f"slurmctld did not start: {started.stderr.strip()[-300:]}")
        for i in range(1, self.nodes + 1):
            started = _run(["slurmd", "-f", str(self.conf), "-N", f"node{i}"], self.env)
            if started.returncode != 0:
                raise RuntimeError(f"slurmd node{i} did not start: {started.stderr.strip()[-300:]}")
        deadline = time.monotonic() + 60
        while True:
            states = _run(["sinfo", "-h", "-N", "-o", "%t"], self.env).stdout.split()
            if len(states) == self.nodes and all(s == "idle" for s in states):
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm nodes not idle after 60 s: {states}; logs in {self.root / 'log'}")
            time.sleep(0.3)

    def wait_job(self, job_id: str, timeout: float = 300) -> dict[str, str]:
        """Poll until the job has left the queue; return its `scontrol show job` fields."""
        deadline = time.monotonic() + timeout
        while True:  # gone once squeue answers with no line; a failed squeue (timeout under load) is asked again
            queued = _run(["squeue", "-h", "-j", job_id], self.env)
            if queued.returncode == 0 and not queued.stdout.strip():
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm job {job_id} still queued/running after {timeout} s "
                                   f"(squeue: {queued.stderr.strip() or 'queued'})")
            time.sleep(0.3)
        while True:
            shown = _run(["scontrol", "show", "job", job_id], self.env)
            info = dict(item.split("=", 1) for item in shown.stdout.split() if "=" in item)
            if "JobState" in info:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"scontrol show job {job_id} gave no JobState: {shown.stderr.strip()}")
            time.sleep(0.3)

    def diagnose(self, job_id: str, output: Path) -> str:
        """What a test failing on a job shows: the job's state, its output so far and the daemons' last log lines
        (each part best effort: a stalled slurmctld must not hide the failure being reported)."""
        parts = []
        try:
            shown = _run(["scontrol", "show", "job", job_id], self.env, timeout=10).stdout
            parts.append(" ".join(item for item in shown.split()
                                  if item.split("=", 1)[0] in ("JobState", "Reason", "NodeList")))
            parts.append("nodes: " + _run(["sinfo", "-h", "-N", "-o", "%N %t"], self.env, timeout=10).stdout)
        except (OSError, subprocess.SubprocessError) as exc:
            parts.append(f"(scontrol/sinfo: {exc})")
        for path in [*output.glob(f"launch/*/slurm-{job_id}.out"), *sorted((self.root / "log").glob("*.log"))]:
            lines = path.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return f"job {job_id}: " + "\n".join(parts)

    def stop(self) -> None:
        """Cancel this cluster's jobs (their steps stop their Ray nodes), ``scontrol shutdown``, then SIGKILL
        its daemons and steps by PID; remove files."""
        _run(["scancel", "--full", "--partition", "debug"], self.env)
        deadline = time.monotonic() + 30
        while _run(["squeue", "-h"], self.env).stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.3)
        _run(["scontrol", "shutdown"], self.env)
        pids = [int(p.read_text()) for p in self.root.glob("*.pid") if p.read_text().strip().isdigit()]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.2)
        for entry in Path("/proc").iterdir():  # slurmd/slurmstepd of this cluster name our conf or spool dir
            if entry.name.isdigit():
                try:
                    cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if str(self.root) in cmd:
                    pids.append(int(entry.name))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.own_munged:
            try:
                os.kill(self.own_munged, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 10  # gone before a next cluster asks whether a munged answers
            while Path(f"/proc/{self.own_munged}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
