"""Trial folders: created atomically, locked for a run's life, a killed run's lock taken over, and --resume
picks the newest trial of the algorithm asked for."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from herdrl.trial_dir import LOCK_FILE, create_trial_dir

HERD = str(Path(sys.executable).parent / "herd")


def herd(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([HERD, *args], cwd=cwd, capture_output=True, text=True, timeout=240)


def iterations(trial: Path) -> list[int]:
    return [json.loads(line)["training_iteration"] for line in (trial / "result.json").read_text().splitlines()]


def test_generated_names_never_collide_even_when_created_at_once(tmp_path):
    made, barrier = [], threading.Barrier(8)

    def make() -> None:
        barrier.wait()
        made.append(create_trial_dir(tmp_path / "exp" / "PPO_CartPole-v1_2026-11-23_10-00-00", exact=False))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 8 and all(p.is_dir() for p in made)


def test_a_live_trial_is_refused_and_a_killed_runs_lock_is_taken_over(tmp_path):
    args = ["train", "ppo", "--env", "CartPole-v1", "--trial", "T", "--quiet", "--no-tensorboard",
            "--checkpoint-every", "1", "--config", "train_batch_size=200", "minibatch_size=100"]
    first = subprocess.Popen([HERD, *args, "--stop-iters", "100000"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    trial = tmp_path / "results" / "CartPole-v1" / "T"
    try:
        deadline = time.time() + 120
        while not list(trial.glob("checkpoint_*")) and time.time() < deadline:
            time.sleep(0.5)
        holder = json.loads((trial / LOCK_FILE).read_text())
        assert holder["pid"] == first.pid
        for extra in ([], ["--resume"]):
            out = herd(*args, *extra, "--stop-iters", "3", cwd=tmp_path)
            assert out.returncode == 2, out.stderr[-2000:]
            assert f"is in use by run pid {first.pid}" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    finally:
        first.kill()
        first.wait()
    done = iterations(trial)[-1]
    out = herd(*args, "--resume", "--stop-iters", str(done + 2), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"taking over from a run that ended without releasing it (pid {first.pid}" in out.stderr
    rows = iterations(trial)
    assert rows == sorted(set(rows)) and rows[-1] == done + 2  # one run's rows: no interleaving
    assert (trial / LOCK_FILE).read_text() == ""  # released at the end


def test_resume_picks_the_newest_trial_of_the_algorithm_asked_for(tmp_path):
    common = ["--env", "CartPole-v1", "--quiet", "--no-tensorboard", "--stop-iters", "1"]
    assert herd("train", "ppo", *common, "--config", "train_batch_size=200", "minibatch_size=100",
                cwd=tmp_path).returncode == 0
    assert herd("train", "dqn", *common, cwd=tmp_path).returncode == 0  # newer, another algorithm
    out = herd("train", "ppo", "--env", "CartPole-v1", "--resume", "--quiet", "--no-tensorboard",
               "--stop-iters", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    (ppo,) = (tmp_path / "results" / "CartPole-v1").glob("PPO_*")
    assert iterations(ppo) == [1, 2] and "None" not in ppo.name


def test_without_flock_the_holders_pid_decides(tmp_path, monkeypatch, caplog):
    """File systems without flock: a live process on this host holds the trial; a dead one's lock is taken."""
    import errno
    import fcntl
    import os
    import socket

    import pytest

    from herdrl.trial_dir import TrialBusy, TrialLock

    def no_flock(fd, op):
        raise OSError(errno.EOPNOTSUPP, "not supported")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    lock_file = tmp_path / LOCK_FILE
    lock_file.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getppid(), "started": "x"}))
    with pytest.raises(TrialBusy, match=f"in use by run pid {os.getppid()}"):
        TrialLock(tmp_path).acquire()
    with pytest.raises(TrialBusy, match=f"in use by run pid {os.getppid()}"):
        TrialLock(tmp_path).check_free()  # the quick look before work decides the same way
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock_file.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": "x"}))
    with caplog.at_level("WARNING", logger="herdrl"):
        with TrialLock(tmp_path):
            assert json.loads(lock_file.read_text())["pid"] == os.getpid()
    assert f"taking over from a run that ended without releasing it (pid {dead.pid}" in caplog.text
    assert lock_file.read_text() == ""
    lock_file.write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": "x"}))
    with pytest.raises(TrialBusy, match="if that run is gone, delete"):
        TrialLock(tmp_path).acquire()


def test_resuming_a_live_trial_before_its_first_checkpoint_says_it_is_in_use(tmp_path, monkeypatch, capsys):
    """A running trial that has not checkpointed yet is in use, not abandoned: --resume names the run holding it
    (the lock is per open file, so this process's own look is refused too), and says "no checkpoint" only once
    the trial is free."""
    import os
    import socket

    from herdrl.cli import main
    from herdrl.trial_dir import TrialLock

    monkeypatch.chdir(tmp_path)
    trial = tmp_path / "results" / "CartPole-v1" / "T"
    trial.mkdir(parents=True)
    (trial / "params.json").write_text(json.dumps({"algorithm": "PPO"}))
    resume = ["train", "ppo", "--env", "CartPole-v1", "--resume", "--quiet"]
    with TrialLock(trial):
        for extra in ([], ["--trial", "T"]):  # the newest trial, or the one named
            assert main([*resume, *extra]) == 2
            err = capsys.readouterr().err
            assert f"is in use by run pid {os.getpid()} on {socket.gethostname()}" in err, err
            assert len(err.strip().splitlines()) == 1
    assert main([*resume, "--trial", "T"]) == 2
    assert "has no valid checkpoint; start it again without --resume" in capsys.readouterr().err
