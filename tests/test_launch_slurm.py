"""`herd launch slurm` on a real Slurm (slurmctld + 3 slurmd "fake nodes" on this host, see slurmcluster.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from clustertools import processes_matching, require, subprocess_env
from slurmcluster import SlurmCluster

# xdist_group: one worker runs these one at a time (loopback node IPs, services, machine-wide checks; see conftest)
pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("cluster")]
NODE_ARGS = ["--object-store-memory", "80000000", "--join-timeout", "120"]


@pytest.fixture(scope="module")
def slurm():
    if os.geteuid() != 0:
        pytest.skip("slurm unavailable: its daemons need root here (SlurmUser=root)")
    require("slurm")
    try:
        cluster = SlurmCluster(nodes=3).start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"slurm unavailable: {exc}")
    yield cluster
    cluster.stop()


def _launch(slurm: SlurmCluster, cwd: Path, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    env = subprocess_env(SLURM_CONF=str(slurm.conf))
    return subprocess.run(["herd", "launch", "slurm", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _job_id(stdout: str) -> str:
    match = re.search(r"submitted job (\d+)", stdout)
    assert match, stdout
    return match.group(1)


def _job_output(root: Path, job_id: str) -> str:
    files = list(root.glob(f"launch/*/slurm-{job_id}.out"))
    assert len(files) == 1, list(root.rglob("*"))
    return files[0].read_text()


def _temp_prefix(slurm: SlurmCluster, job_id: str) -> str:
    return f"/tmp/herd-{slurm.name}-{job_id}-"


def _nothing_left(slurm: SlurmCluster, job_id: str) -> None:
    """No Ray process of the job is left; then remove the Ray logs a failed or cancelled job keeps."""
    assert not processes_matching(_temp_prefix(slurm, job_id)), "no Ray process of the job is left"
    for path in Path("/tmp").glob(f"{_temp_prefix(slurm, job_id)[5:]}*"):
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def test_three_node_job_trains_and_leaves_nothing_behind(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Runners and two data-parallel learner actors on the job's Ray cluster."""
    out = tmp_path / "results"
    done = _launch(slurm, tmp_path, ["--nodes", "3", *NODE_ARGS, "--output", str(out), "--",
                                     "herd", "train", "ppo", "--env", "CartPole-v1", "--num-env-runners", "2",
                                     "--num-learners", "2", "--config", "num_cpus_per_learner=0.5",
                                     "--stop-iters", "3", "--output", str(out)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"results go to {out}" in done.stdout
    job_id = _job_id(done.stdout)
    info = slurm.wait_job(job_id)
    log = _job_output(out, job_id)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    assert "3/3 Ray nodes alive" in log and "3 Ray nodes up at" in log
    assert re.search(r"iter\s+3\s", log), "the job's output shows the live progress table"
    result = next(out.glob("CartPole-v1/*/result.json"))
    rows = [json.loads(line) for line in result.read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == [1, 2, 3]
    assert json.loads((result.parent / "params.json").read_text())["num_learners"] == 2
    assert not list(Path("/tmp").glob(f"{_temp_prefix(slurm, job_id)[5:]}*")), "a clean job removes its Ray files"
    _nothing_left(slurm, job_id)


def test_wait_returns_the_drivers_exit_code(slurm: SlurmCluster, tmp_path: Path) -> None:
    driver = ("import os, sys, ray; ray.init(os.environ['RAY_ADDRESS']); "
              "print('alive', sum(n['Alive'] for n in ray.nodes())); sys.exit(5)")
    done = _launch(slurm, tmp_path, ["--nodes", "2", *NODE_ARGS, "--wait", "--", "python", "-c", driver])
    assert done.returncode == 5, done.stdout + done.stderr
    job_id = _job_id(done.stdout)
    log = _job_output(tmp_path / "results", job_id)
    assert "alive 2" in log and "driver exited with 5" in log
    _nothing_left(slurm, job_id)


def test_in_allocation_runs_inside_salloc(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = subprocess_env(SLURM_CONF=str(slurm.conf))
    driver = "import os, ray; ray.init(os.environ['RAY_ADDRESS']); print('alive', len(ray.nodes()))"
    done = subprocess.run(["salloc", "-N", "2", "herd", "launch", "slurm", "--in-allocation", *NODE_ARGS, "--",
                           "python", "-c", driver], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "alive 2" in done.stdout and "2 Ray nodes up at" in done.stdout


def test_cancelled_job_stops_ray_on_every_node(slurm: SlurmCluster, tmp_path: Path) -> None:
    done = _launch(slurm, tmp_path, ["--nodes", "2", *NODE_ARGS, "--", "python", "-c",
                                     "import time; time.sleep(600)"])
    job_id = _job_id(done.stdout)
    deadline = time.monotonic() + 120
    while "running the driver" not in "".join(p.read_text() for p in tmp_path.glob("results/launch/*/slurm-*.out")):
        assert time.monotonic() < deadline, "the cluster did not come up"
        time.sleep(0.3)
    assert processes_matching(_temp_prefix(slurm, job_id)), "Ray runs while the job runs"
    subprocess.run(["scancel", job_id], env=subprocess_env(SLURM_CONF=str(slurm.conf)), check=True)
    info = slurm.wait_job(job_id)
    assert info["JobState"] == "CANCELLED"
    _nothing_left(slurm, job_id)


def test_a_node_that_cannot_start_fails_the_job_at_once(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Ray refuses a 1 KB object store: the job ends with Ray's error well before the 600 s join timeout."""
    started = time.monotonic()
    done = _launch(slurm, tmp_path, ["--nodes", "2", "--object-store-memory", "1000", "--join-timeout", "600",
                                     "--wait", "--", "python", "-c", "print('never runs')"], timeout=150)
    assert done.returncode != 0
    job_id = _job_id(done.stdout)
    log = _job_output(tmp_path / "results", job_id)
    assert "minimum allowed" in log and "ended before the cluster was up" in log, log
    assert "never runs" not in log
    assert time.monotonic() - started < 120
    _nothing_left(slurm, job_id)


def test_the_walltime_signal_checkpoints_and_the_next_job_of_the_chain_resumes(slurm: SlurmCluster,
                                                                               tmp_path: Path) -> None:
    """With --time, Slurm signals the batch shell before the walltime (sent early here, by hand: `scancel --signal=USR1
    --batch`); the driver finishes its iteration, checkpoints and exits 75; the job submits the next one of the chain
    (--max-jobs), which resumes the same trial to its stop criterion: iterations contiguous, the env-step counter
    never going back, one results folder."""
    out = tmp_path / "results"
    done = _launch(slurm, tmp_path, ["--nodes", "1", *NODE_ARGS, "--time", "00:10:00", "--max-jobs", "3",
                                     "--signal-lead", "120", "--output", str(out), "--",
                                     "herd", "train", "ppo", "--env", "herd/Latency-v0", "--config",
                                     "train_batch_size=400", "minibatch_size=200", "--stop-iters", "12",
                                     "--checkpoint-every", "100", "--output", str(out)])
    assert done.returncode == 0, done.stdout + done.stderr
    first = _job_id(done.stdout)
    script = next(out.glob("launch/*/job.sbatch")).read_text()
    assert "#SBATCH --signal=B:USR1@120" in script and "#SBATCH --time=00:10:00" in script
    deadline = time.monotonic() + 180
    while not list(out.glob("herd_Latency-v0/*/result.json")) or len(
            next(out.glob("herd_Latency-v0/*/result.json")).read_text().splitlines()) < 2:
        assert time.monotonic() < deadline, f"the first job did not train: {slurm.diagnose(first, out)}"
        time.sleep(0.2)
    env = subprocess_env(SLURM_CONF=str(slurm.conf))
    subprocess.run(["scancel", "--signal=USR1", "--batch", first], env=env, check=True)
    info = slurm.wait_job(first)
    log = _job_output(out, first)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    assert "the walltime is near" in log and "driver exited with 75" in log, log
    second = re.search(r"submitted job (\d+), 2 of at most 3", log)
    assert second, log
    info = slurm.wait_job(second.group(1))
    log2 = _job_output(out, second.group(1))
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log2
    assert "resuming from checkpoint_" in log2 and "driver exited with 0" in log2 and "submitted job" not in log2
    (result,) = out.glob("herd_Latency-v0/*/result.json")
    rows = [json.loads(line) for line in result.read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == list(range(1, 13))
    steps = [r["num_env_steps_sampled_lifetime"] for r in rows]
    assert steps == sorted(steps) and len(set(steps)) == 12
    stopped_at = int(re.search(r"resuming from checkpoint_0*(\d+)", log2).group(1))
    assert 2 <= stopped_at < 12  # the first job stopped early, on the signal
    _nothing_left(slurm, first)
    _nothing_left(slurm, second.group(1))
