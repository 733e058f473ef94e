"""Golden tests of the generated batch scripts (fixed options -> exact text) and the launch command's checks.

Regenerate after an intended change: HERD_UPDATE_GOLDEN=1 pytest tests/test_launch_scripts.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from herdrl.cli import main
from herdrl.cluster.connect import ClusterError
from herdrl.cluster.nodes import NodeOptions
from herdrl.cluster.scripts import BatchJob, pbs_script, slurm_script

GOLDEN = Path(__file__).parent / "golden"


def _job(**changes) -> BatchJob:
    fields = dict(driver=["herd", "train", "ppo", "--env", "CartPole-v1", "--num-env-runners", "15", "--output",
                          "/shared/results"],
                  launch_dir=Path("/shared/results/launch/cartpole_2026-01-01_00-00-00"),
                  workdir=Path("/shared/project"), nodes=4,
                  node_options=NodeOptions(num_cpus=16, num_gpus=1, interface="ib0", join_timeout_s=600),
                  time="01:30:00", partition="gpu", account="rl-proj", job_name="cartpole",
                  setup=["module load python/3.11", "source /shared/project/.venv/bin/activate"],
                  unset_ld_preload=True)
    fields.update(changes)
    return BatchJob(**fields)


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("HERD_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; if intended: HERD_UPDATE_GOLDEN=1 pytest {__file__}"


@pytest.mark.parametrize("name, make", [
    ("slurm.sbatch", lambda: slurm_script(_job())),
    ("pbs-mpiexec.pbs", lambda: pbs_script(_job(), launcher="mpiexec")),
    ("cobalt-aprun.sh", lambda: pbs_script(_job(partition="debug-cache-quad"), launcher="aprun", flavor="cobalt")),
])
def test_generated_scripts_match_golden_files(name: str, make) -> None:
    _check(name, make())


def test_scripts_are_valid_bash() -> None:
    for text in (slurm_script(_job()), pbs_script(_job()), pbs_script(_job(), launcher="aprun", flavor="cobalt")):
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_minimal_slurm_script_has_no_optional_directives() -> None:
    text = slurm_script(_job(node_options=NodeOptions(), time=None, partition=None, account=None, setup=[],
                             unset_ld_preload=False))
    for absent in ("--time", "--partition", "--account", "--cpus-per-task", "--gpus-per-node"):
        assert f"#SBATCH {absent}" not in text
    assert "LD_PRELOAD" not in text and "node_args=(--join-timeout 300)" in text
    assert "#SBATCH --nodes=4" in text and "RAY_AUTH_MODE=token" in text
    assert not re.search(r"^[^#]*\bray stop", text, re.M), "never a host-wide ray stop"
    assert "symmetric-run" not in text and not re.search(r"sleep [1-9]", text), "polls, no fixed sleeps"


@pytest.mark.parametrize("changes, message", [
    ({"nodes": 0}, "--nodes"), ({"time": "1h"}, "walltime"), ({"driver": []}, "driver command"),
])
def test_bad_batch_options_are_refused(changes, message) -> None:
    with pytest.raises(ClusterError, match=message):
        _job(**changes)


def test_unknown_launcher_is_refused() -> None:
    with pytest.raises(ClusterError, match="launcher"):
        pbs_script(_job(), launcher="srun")


def test_dry_run_prints_the_script_and_writes_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["launch", "slurm", "--nodes", "3", "--dry-run", "--", "herd", "train", "ppo"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#!/bin/bash\n#SBATCH --job-name=herd\n#SBATCH --nodes=3\n")
    assert out.rstrip().endswith("exit $rc") and "herd train ppo" in out
    assert not (tmp_path / "results").exists()


def test_pbs_without_submit_writes_the_script_and_says_how_to_submit(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["launch", "pbs", "--nodes", "2", "--launcher", "mpirun", "--", "herd", "train", "ppo"]) == 0
    out = capsys.readouterr().out
    scripts = list(tmp_path.glob("results/launch/herd_*/job.pbs"))
    assert len(scripts) == 1 and f"qsub {scripts[0]}" in out
    herd = str(Path(sys.executable).parent / "herd")
    assert f"mpirun -np 2 --map-by node {herd} launch mpi" in scripts[0].read_text()


def test_slurm_with_no_submit_writes_the_script_and_says_how_to_submit(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here: none is run
    assert main(["launch", "slurm", "--no-submit", "--", "herd", "train", "ppo"]) == 0
    scripts = list(tmp_path.glob("results/launch/herd_*/job.sbatch"))
    assert len(scripts) == 1 and f"sbatch {scripts[0]}" in capsys.readouterr().out


def test_pbs_submit_runs_qsub(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    qsub = tmp_path / "bin" / "qsub"
    qsub.parent.mkdir()
    qsub.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/qsub-args\necho 1234.pbs\n")
    qsub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{qsub.parent}:{os.environ['PATH']}")
    assert main(["launch", "pbs", "--submit", "--", "herd", "train", "ppo"]) == 0
    assert (tmp_path / "qsub-args").read_text().strip().endswith("job.pbs")


def test_without_setup_every_node_runs_the_launching_interpreters_herd_and_checks_it_is_there(tmp_path: Path) -> None:
    """A bare `herd` fails on the nodes when the venv is not activated there ("command not found", found only in
    the job's log): the scripts name the launching herd by its absolute path, and each node checks it first."""
    herd = str(Path(sys.executable).parent / "herd")
    job = _job(setup=[])
    text = slurm_script(job)
    assert f"herd={herd}" in text and '"$herd" cluster node start' in text and '"$herd" cluster wait' in text
    assert f"{herd} train ppo --env CartPole-v1" in text  # the driver's leading herd too
    assert f"--ntasks-per-node=1 --overlap \\\n  bash -c '{herd} --version" in text  # every node runs it once
    assert _job(setup=[], driver=["python", "train.py"]).driver_command == ["python", "train.py"]
    assert f"{herd} launch mpi" in pbs_script(job) and f"-- {herd} train ppo" in pbs_script(job)
    missing = _job(setup=[], herd=str(tmp_path / "nowhere" / "herd"))
    out = subprocess.run(["bash", "-c", missing.herd_check("node7")], capture_output=True, text=True)
    assert out.returncode == 1 and "nowhere/herd does not run on node7" in out.stderr
    assert subprocess.run(["bash", "-c", job.herd_check("node7")]).returncode == 0
    with_setup = slurm_script(_job())  # --setup prepares the nodes' own environment: herd from their PATH
    assert "herd=herd" in with_setup and "herd --version" in with_setup


def test_missing_driver_and_missing_sbatch_are_one_line_errors(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["launch", "slurm", "--nodes", "2"]) == 2
    assert "driver command" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    assert main(["launch", "slurm", "--", "herd", "train", "ppo"]) == 2
    err = capsys.readouterr().err
    assert "sbatch not found" in err and err.count("\n") == 1


def test_the_walltime_signal_lead_fits_the_walltime() -> None:
    """The lead defaults to 300 s, or a quarter of a shorter walltime; one not shorter than the walltime is refused
    (the driver would stop before it trained), and --max-jobs needs --time and a herd train or herd tune driver."""
    assert "#SBATCH --signal=B:USR1@300\n" in slurm_script(_job(time="01:30:00"))
    assert "#SBATCH --signal=B:USR1@150\n" in slurm_script(_job(time="10:00"))
    assert "#SBATCH --signal=B:USR1@60\n" in slurm_script(_job(time="00:05:00", signal_lead_s=60))
    assert "--signal" not in slurm_script(_job(time=None))
    with pytest.raises(ClusterError, match="--signal-lead 300 s is not shorter than the walltime --time 00:05:00"):
        _job(time="00:05:00", signal_lead_s=300)
    with pytest.raises(ClusterError, match="--max-jobs chains jobs at their walltime: give --time too"):
        _job(time=None, max_jobs=2)
    chained = slurm_script(_job(max_jobs=3))
    assert "--trial cartpole_2026-01-01_00-00-00" in chained and "max_jobs=3" in chained
    assert 'resume=(--resume)' in chained  # later jobs continue the trial
    sweep = slurm_script(_job(max_jobs=3, driver=["herd", "tune", "-f", "sweep.yaml"]))
    assert "herd tune -f sweep.yaml ${resume[@]" in sweep and "--trial" not in sweep  # a sweep resumes by name
    with pytest.raises(ClusterError, match="--max-jobs chains `herd train` and `herd tune` drivers .* `herd evaluate`"):
        _job(max_jobs=2, driver=["herd", "evaluate", "ckpt"])
    # A chain that continues an earlier trial: every job resumes it (no flag added, no new trial named)
    again = slurm_script(_job(max_jobs=2, driver=["herd", "train", "-f", "x.yaml", "--resume"]))
    assert "resume=()  # the driver resumes by itself" in again and "--trial" not in again
    assert "resume=(--resume)" not in again


def test_launches_in_the_same_second_each_get_their_own_folder_script_token_and_trial(tmp_path: Path, capsys,
                                                                                       monkeypatch) -> None:
    """Launch folders are named by the second: launches within one (the clock held still here) each get a folder of
    their own, with their own script, token and chained trial name, and each chain resubmits its own script."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here: none is run
    monkeypatch.setattr("time.strftime", lambda *_: "2026-01-01_00-00-00")
    chain = ["launch", "slurm", "--no-submit", "--time", "01:00:00", "--max-jobs", "3", "--", "herd", "train", "ppo"]
    assert main(chain[:3] + chain[5:]) == 2  # refused (--max-jobs needs --time): no folder is left behind
    assert not list(tmp_path.glob("results/launch/*"))
    capsys.readouterr()
    for _ in range(6):
        assert main(chain) == 0
    scripts = [Path(m) for m in re.findall(r"herd launch: wrote (\S+);", capsys.readouterr().out)]
    assert len(scripts) == 6 and len({s.parent for s in scripts}) == 6
    assert all(s.parent.name.startswith("herd_2026-01-01_00-00-00") for s in scripts)  # the stamp stays readable
    tokens = set()
    for script in scripts:
        text, folder = script.read_text(), script.parent
        assert os.stat(folder).st_mode & 0o777 == 0o700
        resubmits = re.findall(r"HERD_CHAIN_INDEX=\$\(\(chain_index \+ 1\)\) (\S+)\)", text)
        assert resubmits == [str(folder / "job.sbatch")]
        assert re.findall(r" train ppo --trial (\S+) ", text) == [folder.name]
        assert f"RAY_AUTH_TOKEN_PATH={folder / 'ray_token'}\n" in text
        tokens.add((folder / "ray_token").read_text())
    assert len(tokens) == 6
