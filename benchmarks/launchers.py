"""Time from `herd launch ...` to the first training iteration, per launcher, on this one host.

Real Slurm (3 slurmd "fake nodes"), real Open MPI, real sshd on loopback — the same set-up as the tests
(tests/slurmcluster.py, tests/sshhosts.py). The driver is the same everywhere:
`herd train ppo --env CartPole-v1 --num-env-runners 2 --stop-iters 5`. Baseline: that command with a private
local Ray (no launcher). Run as root:

    python benchmarks/launchers.py            # prints a markdown table
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from clustertools import BIN, require, subprocess_env  # noqa: E402
from slurmcluster import SlurmCluster  # noqa: E402
from sshhosts import SshHosts  # noqa: E402

DRIVER = ["herd", "train", "ppo", "--env", "CartPole-v1", "--num-env-runners", "2", "--stop-iters", "5",
          "--no-tensorboard"]
NODE = ["--object-store-memory", "80000000"]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp"]
FIRST_ITER = re.compile(r"^iter\s+1\s", re.M)


def _stream(cmd: list[str], cwd: Path, env: dict | None = None) -> tuple[float, float, int]:
    """Run ``cmd``; seconds to the first iteration line and to the end, and the exit code."""
    start = time.monotonic()
    first = float("nan")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env or subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if first != first and FIRST_ITER.match(line):
            first = time.monotonic() - start
    rc = proc.wait()
    return first, time.monotonic() - start, rc


def baseline(work: Path) -> tuple[float, float, int]:
    return _stream([*DRIVER, "--output", str(work / "base")], work)


def mpi(work: Path, ranks: int = 3) -> tuple[float, float, int]:
    return _stream([*MPIRUN, "-np", str(ranks), "herd", "launch", "mpi", *NODE, "--num-cpus", "1", "--",
                    *DRIVER, "--output", str(work / "mpi")], work)


def pbs(work: Path) -> tuple[float, float, int]:
    start = time.monotonic()
    subprocess.run(["herd", "launch", "pbs", "--nodes", "2", "--launcher", "mpirun", *NODE,
                    "--launcher-args", " ".join(MPIRUN[1:]), "--output", str(work / "pbs"), "--", *DRIVER,
                    "--output", str(work / "pbs")], cwd=work, env=subprocess_env(), check=True, capture_output=True)
    script = next((work / "pbs").glob("launch/*/job.pbs"))
    first, end, rc = _stream(["bash", str(script)], work)
    offset = time.monotonic() - start - end
    return first + offset, end + offset, rc


def slurm(work: Path, nodes: int = 3) -> tuple[float, float, int]:
    with SlurmCluster(nodes) as cluster:
        env = subprocess_env(SLURM_CONF=str(cluster.conf))
        start = time.monotonic()
        out = subprocess.run(["herd", "launch", "slurm", "--nodes", str(nodes), *NODE, "--output",
                              str(work / "slurm"), "--", *DRIVER, "--output", str(work / "slurm")],
                             cwd=work, env=env, capture_output=True, text=True, check=True).stdout
        job = re.search(r"submitted job (\d+)", out).group(1)
        first = float("nan")
        while True:
            logs = list((work / "slurm").glob(f"launch/*/slurm-{job}.out"))
            if first != first and logs and FIRST_ITER.search(logs[0].read_text()):
                first = time.monotonic() - start
            if not subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True).stdout.strip():
                break
            time.sleep(0.05)
        end = time.monotonic() - start
        state = cluster.wait_job(job)
    return first, end, 0 if state.get("ExitCode") == "0:0" else 1


def ssh(work: Path) -> tuple[float, float, int]:
    import yaml

    with SshHosts(["127.0.0.2", "127.0.0.3"]) as hosts:
        path = work / "hosts.yaml"
        path.write_text(yaml.safe_dump({
            "cluster_name": "bench", "head": hosts.entries[0], "workers": hosts.entries[1:],
            "ssh": {"user": "root", "key": str(hosts.key),
                    "options": ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"]},
            "setup": [f"export PATH={BIN}:$PATH"], "workdir": str(work / "head"),
            "ray": {"num_cpus": 1, "object_store_memory": 80_000_000}}))
        env = subprocess_env(HERD_HOME=str(work / "home"))
        start = time.monotonic()
        try:
            subprocess.run(["herd", "cluster", "up", str(path)], cwd=work, env=env, check=True, capture_output=True)
            up = time.monotonic() - start
            first, end, rc = _stream(["herd", "train", "--cluster", str(path), *DRIVER[2:], "--output", "runs"],
                                     work, env)
        finally:
            subprocess.run(["herd", "cluster", "down", str(path)], cwd=work, env=env, capture_output=True)
    print(f"  (ssh: `herd cluster up` took {up:.1f} s of that)", file=sys.stderr)
    return first + up, end + up, rc


def main() -> None:
    require_ok = {kind: _available(kind) for kind in ("mpi", "slurm", "ssh")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cases = [("no launcher: private local Ray (baseline)", baseline, True),
                 ("`mpirun -np 3 herd launch mpi`", mpi, require_ok["mpi"]),
                 ("`herd launch pbs --launcher mpirun` script, 2 ranks", pbs, require_ok["mpi"]),
                 ("`herd launch slurm --nodes 3` (submit -> first iteration)", slurm, require_ok["slurm"]),
                 ("`herd cluster up` (2 hosts) + `herd train --cluster`", ssh, require_ok["ssh"])]
        for name, run, ok in cases:
            if not ok:
                rows.append(f"| {name} | skipped | | |")
                continue
            first, end, rc = run(work)
            rows.append(f"| {name} | {first:.1f} | {end:.1f} | {rc} |")
            print(rows[-1], file=sys.stderr, flush=True)
    print("| launcher | s to first iteration | s to the end (Ray stopped) | exit code |")
    print("| --- | --- | --- | --- |")
    print("\n".join(rows))


def _available(kind: str) -> bool:
    import pytest

    try:
        require(kind)
        return True
    except pytest.skip.Exception as exc:
        print(f"{kind}: {exc}", file=sys.stderr)
        return False


if __name__ == "__main__":
    main()
