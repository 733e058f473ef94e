"""`herd launch mpi` under a real `mpirun` (Open MPI + mpi4py): one Ray node per rank, all on this host."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from clustertools import HEALTH_CHECK_ENV, processes_matching, require, subprocess_env

# xdist_group: one worker runs these one at a time (loopback node IPs, services, machine-wide checks; see conftest)
pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("cluster")]

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp"]
LAUNCH = ["herd", "launch", "mpi", "--num-cpus", "1", "--object-store-memory", "80000000", "--join-timeout", "120"]


def _session(output: str) -> str:
    match = re.search(r"Ray files: /tmp/herd-([0-9a-f]{6})-r", output)
    assert match, output[-3000:]
    return match.group(1)


def test_three_ranks_join_and_train_with_two_learners(tmp_path: Path) -> None:
    require("mpi")
    out = tmp_path / "results"
    cmd = [*MPIRUN, "-np", "3", *LAUNCH, "--", "herd", "train", "ppo", "--env", "CartPole-v1",
           "--num-env-runners", "2", "--num-learners", "2",
           "--config", "num_cpus_per_learner=0.5", "--stop-iters", "3", "--output", str(out), "--seed", "0"]
    done = subprocess.run(cmd, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    assert "all 3 Ray nodes joined" in text
    assert re.search(r"iter\s+3\s", done.stdout), "the driver's progress table reaches the job's stdout"
    results = list(out.glob("CartPole-v1/*/result.json"))
    assert len(results) == 1
    rows = [json.loads(line) for line in results[0].read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == [1, 2, 3]
    # Two data-parallel learner actors on the launched cluster, beside the runners.
    assert json.loads((results[0].parent / "params.json").read_text())["num_learners"] == 2
    assert not processes_matching(f"/tmp/herd-{_session(text)}-"), "no Ray process of the launch is left"
    assert not list(Path("/tmp").glob(f"herd-{_session(text)}-*")), "a clean run leaves no Ray files behind"


def test_driver_sees_every_node_and_its_exit_code_is_the_jobs(tmp_path: Path) -> None:
    require("mpi")
    driver = ("import os, sys, ray; ray.init(os.environ['RAY_ADDRESS']); "
              "print('alive', sum(n['Alive'] for n in ray.nodes())); sys.exit(7)")
    done = subprocess.run([*MPIRUN, "-np", "2", *LAUNCH, "--", "python", "-c", driver], cwd=tmp_path,
                          env=subprocess_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 7, (done.stdout + done.stderr)[-3000:]
    assert "alive 2" in done.stdout
    assert "driver exited with 7" in done.stderr
    session = _session(done.stderr)
    assert not processes_matching(f"/tmp/herd-{session}-")
    assert "Ray logs of this node kept" in done.stderr, "a failed driver keeps the nodes' logs and says where"
    for path in Path("/tmp").glob(f"herd-{session}-*"):
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _raylet_hosting_a_runner_off_the_head(session: str) -> int:
    """PID of the raylet of a worker rank's node (not rank 0's) that hosts an env runner actor."""
    for line in processes_matching("ray::RemoteEnvRunner"):
        runner = int(line.split(":")[0])
        raylet = int(Path(f"/proc/{runner}/stat").read_text().rsplit(")", 1)[1].split()[1])
        cmd = Path(f"/proc/{raylet}/cmdline").read_bytes().decode(errors="replace")
        if "raylet" in cmd and re.search(rf"/tmp/herd-{session}-r[1-9]", cmd):
            return raylet
    raise AssertionError("no env runner on a worker rank's node")


def test_training_survives_a_worker_node_whose_raylet_is_killed(tmp_path: Path) -> None:
    """Kill rank 2's raylet by PID mid-run: its runner is restarted on a surviving node and training ends."""
    require("mpi")
    out = tmp_path / "results"
    forward = [arg for name in HEALTH_CHECK_ENV for arg in ("-x", name)]
    cmd = [*MPIRUN, "-np", "3", *forward, *LAUNCH, "--", "herd", "train", "ppo",
           "--env", "herd/Latency-v0", "--num-env-runners", "2", "--stop-iters", "12", "--output", str(out),
           "--config", "sample_timeout_s=20", "train_batch_size=400"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=subprocess_env(**HEALTH_CHECK_ENV), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    killed = None
    try:
        for line in proc.stdout:
            lines.append(line)
            if killed is None and re.match(r"iter\s+2\s", line):
                killed = _raylet_hosting_a_runner_off_the_head(_session("".join(lines)))
                os.kill(killed, signal.SIGKILL)
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines)
    assert killed is not None, text[-3000:]
    assert rc == 0, text[-3000:]
    assert re.search(r"iter\s+12\s", text), text[-3000:]
    assert "restarting it" in text, "the runner on the dead node was replaced: " + text[-3000:]
    assert not processes_matching(f"/tmp/herd-{_session(text)}-")


def test_generated_pbs_script_runs_under_real_mpirun_and_chains_jobs_at_its_walltime(tmp_path: Path) -> None:
    """`herd launch pbs --launcher mpirun` writes a script whose launch line trains on 2 ranks here, with a runner
    and two learner actors. With --time and --max-jobs the driver stops by itself before the walltime (PBS sends
    no signal: HERD_STOP_AT, here already due after the first iteration), checkpoints, exits 75, and the job
    submits the next one (a stub qsub records how); that next job resumes the trial and ends it."""
    require("mpi")
    out = tmp_path / "results"
    written = subprocess.run(
        ["herd", "launch", "pbs", "--nodes", "2", "--launcher", "mpirun", "--object-store-memory", "80000000",
         "--launcher-args", " ".join(MPIRUN[1:]), "--output", str(out), "--time", "00:10:00", "--signal-lead", "599",
         "--max-jobs", "3", "--",
         "herd", "train", "ppo", "--env", "CartPole-v1", "--num-env-runners", "1", "--num-learners", "2",
         "--config", "num_cpus_per_learner=0.5", "--stop-iters", "2", "--output", str(out)],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert written.returncode == 0, written.stderr
    script = next(out.glob("launch/herd_*/job.pbs"))
    assert "mpirun -np 2 --map-by node --allow-run-as-root" in script.read_text()
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "qsub").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/qsub.log\necho 78.server\n')
    (stub / "qsub").chmod(0o755)
    env = subprocess_env(PBS_JOBID="77.server")
    env["PATH"] = f"{stub}:{env['PATH']}"
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "all 2 Ray nodes joined" in done.stderr and re.search(r"iter\s+1\s", done.stdout)
    assert "HERD_STOP_AT: no time left for another iteration" in done.stdout and "driver exited with 75" in done.stdout
    assert (tmp_path / "qsub.log").read_text().split() == ["-W", "depend=afterany:77.server", "-v",
                                                            "HERD_CHAIN_INDEX=2", str(script)]
    assert not processes_matching(f"/tmp/herd-{_session(done.stderr)}-")
    # the next job, as PBS would start it: it resumes the trial and meets the stop criterion, submitting nothing
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env={**env, "HERD_CHAIN_INDEX": "2"},
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "resuming from checkpoint_000001" in done.stdout and "driver exited with 0" in done.stdout
    assert len((tmp_path / "qsub.log").read_text().splitlines()) == 1
    results = list(out.glob("CartPole-v1/*/result.json"))
    assert len(results) == 1 and json.loads((results[0].parent / "params.json").read_text())["num_learners"] == 2
    assert [json.loads(line)["training_iteration"] for line in results[0].read_text().splitlines()] == [1, 2]
    assert not processes_matching(f"/tmp/herd-{_session(done.stderr)}-")


class FakeComm:
    """What the launcher uses of an MPI communicator, in one process: messages sent, none ever received."""

    def __init__(self, size: int, rank: int = 0) -> None:
        self.size, self.rank, self.sent = size, rank, []

    def Get_size(self) -> int:  # noqa: N802 - mpi4py's names
        return self.size

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def send(self, message, dest: int, tag: int) -> None:
        self.sent.append((dest, tag, message))

    def irecv(self, source: int, tag: int):
        class Request:
            def test(self):
                return False, None

            def Cancel(self):  # noqa: N802
                pass

        return Request()


def test_rank_zero_failing_with_any_error_before_the_head_is_up_tells_every_rank_to_abort(monkeypatch) -> None:
    """Other ranks wait for rank 0's word: a failure other than ClusterError (here a RuntimeError) must reach them
    as an abort too, or they poll forever."""
    from herdrl.cluster import mpi
    from herdrl.cluster.nodes import NodeOptions

    def broken_start(*args, **kwargs):
        raise RuntimeError("raylet binary missing")

    session = f"t{os.getpid():x}"[-6:]
    monkeypatch.setattr(mpi.secrets, "token_hex", lambda n: session)
    monkeypatch.setattr(mpi, "start_node", broken_start)
    monkeypatch.setattr(mpi, "stop_node", lambda *args, **kwargs: 0)
    comm = FakeComm(size=3)
    saved = dict(os.environ)  # rank 0 exports the cluster's auth settings: never into other tests' processes
    try:
        with pytest.raises(RuntimeError):
            mpi._rank_zero(comm, ["herd", "train"], NodeOptions())
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(f"/tmp/herd-{session}-r0", ignore_errors=True)
    assert [(dest, message) for dest, _, message in comm.sent] == [(1, {"abort": "raylet binary missing"}),
                                                                   (2, {"abort": "raylet binary missing"})]


def test_a_rank_gives_up_when_rank_zero_never_announces_the_head(monkeypatch) -> None:
    from herdrl.cluster import mpi
    from herdrl.cluster.nodes import NodeOptions

    monkeypatch.setattr(mpi.time, "sleep", lambda s: None)
    clock = iter(range(0, 10_000, 30))  # each poll: 30 s later
    monkeypatch.setattr(mpi.time, "monotonic", lambda: next(clock))
    assert mpi._other_rank(FakeComm(size=2, rank=1), NodeOptions(join_timeout_s=120)) == 1
