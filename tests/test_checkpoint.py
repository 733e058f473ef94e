import csv
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from herdrl import Algorithm, PPOConfig
from herdrl.checkpoint import CheckpointError, list_checkpoints, newest_valid_checkpoint, prune
from herdrl.errors import ConfigError, EnvError
from herdrl.logger import GAUGE_KEYS, TIMING_KEYS
from herdrl.policy import Policy

HERD = str(Path(sys.executable).parent / "herd")
OBS = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32).tolist()


def trained(iterations=3, seed=0):
    algo = PPOConfig().environment("CartPole-v1").training(train_batch_size=512).debugging(seed=seed).build()
    for _ in range(iterations):
        algo.train()
    return algo


def fingerprint(algo) -> dict:
    return {
        "weights": {k: v.tolist() for k, v in algo.get_weights().items()},
        "optimizer": [t.tolist() for t in algo.learner.optimizer.state_dict()["exp_avg_sq"]],
        "steps": algo.learner.optimizer.state_dict()["steps"],
        "counters": [algo.iteration, algo.env_steps_lifetime, algo.episodes_lifetime],
        "actions": [algo.compute_single_action(o) for o in OBS],
    }


def test_round_trip_in_a_fresh_process(tmp_path):
    algo = trained()
    path = algo.save(tmp_path / "ckpt")
    expected = fingerprint(algo)
    algo.stop()
    here = str(Path(__file__).parent)
    code = (f"import json, sys; sys.path.insert(0, {here!r}); from test_checkpoint import fingerprint; "
            f"from herdrl import Algorithm; a = Algorithm.from_checkpoint({str(path)!r}); "
            "print(json.dumps(fingerprint(a)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == json.loads(json.dumps(expected))


def test_policy_loads_without_runners_or_ray(tmp_path):
    algo = trained()
    algo.save(tmp_path / "checkpoint_000003")
    expected = [algo.compute_single_action(o) for o in OBS]
    algo.stop()
    code = (f"import sys; from herdrl.policy import Policy; p = Policy.from_checkpoint({str(tmp_path)!r}); "
            f"import numpy as np; print([p.compute_single_action(np.array(o, np.float32)) for o in {OBS!r}]); "
            "print('ray' in sys.modules, 'gymnasium.envs.classic_control.cartpole' in sys.modules)")
    # (a trial dir: the policy comes from its newest valid checkpoint)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    actions, flags = out.stdout.strip().splitlines()
    assert actions == str(expected) and flags == "False False"
    state = Policy.from_checkpoint(tmp_path)
    assert state.compute_actions(np.array(OBS, np.float32)).tolist() == expected


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch /tmp/herdrl-pwned-{os.getpid()}",))


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_a_pickle_payload_is_refused_not_executed(tmp_path, writer):
    import warnings

    path = trained(1).save(tmp_path / "checkpoint_000001")
    marker = Path(f"/tmp/herdrl-pwned-{os.getpid()}")
    marker.unlink(missing_ok=True)
    with open(path / "learner.pt", "wb") as f:
        pickle.dump(Evil(), f) if writer == "pickle" else torch.save(Evil(), f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckpointError, match="learner.pt holds Python objects besides tensors"):
            Algorithm.from_checkpoint(path)
        with pytest.raises(CheckpointError, match="refusing to load"):
            Policy.from_checkpoint(path)
    assert not [w for w in caught if "torch" in str(w.filename)]  # torch's advice is not printed
    assert not marker.exists()
    out = subprocess.run([HERD, "evaluate", str(path), "--episodes", "1"], capture_output=True, text=True)
    # One line in our own words: nothing pointing towards loading it anyway (weights_only=False runs its code).
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "weights_only" not in out.stderr and "refusing to load it" in out.stderr
    assert not marker.exists()


def test_evaluating_a_trial_whose_newest_checkpoint_is_damaged_says_which_was_skipped_and_why(tmp_path):
    algo = trained(1)
    algo.save(tmp_path / "checkpoint_000001")
    algo.train()
    newest = algo.save(tmp_path / "checkpoint_000002")
    algo.stop()
    data = (newest / "learner.pt").read_bytes()
    (newest / "learner.pt").write_bytes(data[: len(data) // 2])
    out = subprocess.run([HERD, "evaluate", str(tmp_path), "--episodes", "1"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "skipping checkpoint_000002" in out.stderr and "truncated or corrupt" in out.stderr
    assert "checkpoint_000001" in out.stdout


def test_damaged_and_foreign_checkpoints_give_one_clear_line(tmp_path):
    algo = trained(1)
    good = algo.save(tmp_path / "good")
    with pytest.raises(CheckpointError, match="not found"):
        Algorithm.from_checkpoint(tmp_path / "missing")
    truncated = algo.save(tmp_path / "truncated")
    data = (truncated / "learner.pt").read_bytes()
    (truncated / "learner.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated' is damaged: learner.pt is truncated or corrupt"):
        algo.restore(truncated)
    garbled = algo.save(tmp_path / "garbled")
    (garbled / "checkpoint.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="damaged: checkpoint.json unreadable"):
        algo.restore(garbled)
    newer = algo.save(tmp_path / "newer")
    meta = json.loads((newer / "checkpoint.json").read_text())
    (newer / "checkpoint.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(CheckpointError, match="format version 99; this herdrl reads up to 3: upgrade herdrl"):
        algo.restore(newer)
    other = algo.save(tmp_path / "other")
    (other / "checkpoint.json").write_text(json.dumps({**meta, "algorithm": "DQN"}))
    with pytest.raises(CheckpointError, match="is a DQN checkpoint, not PPO"):
        algo.restore(other)
    before = algo.get_weights()
    pendulum = PPOConfig().environment("Pendulum-v1").build()
    with pytest.raises(CheckpointError, match="trained with observation space Box"):
        pendulum.restore(good)
    assert all(np.array_equal(before[k], v) for k, v in algo.get_weights().items())  # nothing changed


def test_a_crash_mid_write_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    algo = trained(1)
    first = algo.save(tmp_path / "checkpoint_000001")
    algo.train()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        algo.save(tmp_path / "checkpoint_000002")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_000001"]  # no temp dir, no partial checkpoint
    assert newest_valid_checkpoint(tmp_path) == first
    # A temp dir left by a killed process is ignored by readers and removed by the next save.
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that surely ran and ended
    (tmp_path / f".checkpoint_000003.tmp-{dead.pid}").mkdir()
    assert newest_valid_checkpoint(tmp_path) == first
    algo.save(tmp_path / "checkpoint_000002")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_000001", "checkpoint_000002"]


def _iteration_of(path):
    return json.loads((path / "checkpoint.json").read_text())["counters"]["training_iteration"]


@pytest.mark.parametrize("name", ["checkpoint_000001", "my_model"])
def test_a_crash_while_replacing_a_checkpoint_loses_neither_version(tmp_path, name):
    """Replacing a checkpoint: a kill between moving the old one aside and renaming the new one in; a failure
    at that point. Either way the checkpoint is there afterwards, old or new, and nothing else is left."""
    from herdrl.checkpoint import read_meta

    algo = trained(1)
    path = algo.save(tmp_path / name)
    algo.stop()
    code = (f"import os, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from test_checkpoint import trained\n"
            "algo = trained(2)\n"
            "real, calls = os.rename, []\n"
            "def rename(src, dst):\n"
            "    calls.append(src); real(src, dst)\n"
            "    if len(calls) == 1: os._exit(9)   # killed right after moving the old checkpoint aside\n"
            f"os.rename = rename; algo.save({str(path)!r})\n")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 9
    assert not path.exists() and len(list(tmp_path.glob(f".{name}.old-*"))) == 1  # the crash window
    assert read_meta(path)["path"] == str(path) and _iteration_of(path) == 1  # a reader puts it back
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]

    algo = trained(2)
    real, calls = os.rename, []

    def failing_rename(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        real(src, dst)

    os.rename = failing_rename
    try:
        with pytest.raises(OSError, match="Input/output"):
            algo.save(path)
    finally:
        os.rename = real
    assert _iteration_of(path) == 1 and sorted(p.name for p in tmp_path.iterdir()) == [name]
    algo.save(path)
    assert _iteration_of(path) == 2 and sorted(p.name for p in tmp_path.iterdir()) == [name]
    algo.stop()
    # Moved aside by a writer on another host (a shared file system), which this host cannot check on: read in
    # place, nothing renamed.
    foreign = tmp_path / f".{name}.old-other-node~4242~abc123"
    os.rename(path, foreign)
    assert read_meta(path)["path"] == str(foreign) and foreign.exists()


def test_cleanup_never_touches_a_live_writers_temporary_directory(tmp_path):
    from herdrl.checkpoint import _writer_tag

    host = _writer_tag().split("~")[0]
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".checkpoint_000007.tmp-{host}~{writer.pid}~abc123"
        elsewhere = tmp_path / ".checkpoint_000008.tmp-other-host~1~abc123"  # a writer on another node
        for d in (live, elsewhere):
            d.mkdir()
            (d / "learner.pt").write_bytes(b"in flight")
        algo = trained(1)
        algo.save(tmp_path / "checkpoint_000001")
        assert live.exists() and elsewhere.exists()
    finally:
        writer.kill()
        writer.wait()
    algo.save(tmp_path / "checkpoint_000002")  # its writer is gone now: removed
    algo.stop()
    assert not live.exists() and elsewhere.exists()


@pytest.mark.xdist_group("cluster")  # a node on 127.0.0.9, as the cluster tests use (see conftest)
def test_a_crafted_checkpoint_cannot_run_code_or_choose_the_cluster(tmp_path):
    """checkpoint.json is a file anyone may have written: loading, resuming and evaluating it must neither run its
    runtime_env (Ray puts py_executable into a shell command line) nor connect to the address it names."""
    import socket

    marker = tmp_path / "pwned-marker"
    listener = socket.socket()  # the "foreign cluster": nothing may even connect to it
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    trial = tmp_path / "results" / "exp" / "trial"
    algo = trained(1)
    path = algo.save(trial / "checkpoint_000001")
    algo.stop()
    meta = json.loads((path / "checkpoint.json").read_text())
    meta["config"].update(
        num_env_runners=1, num_envs_per_env_runner=2, address=f"127.0.0.1:{listener.getsockname()[1]}",
        node_ip_address="127.0.0.9", include_dashboard=True,
        runtime_env={"py_executable": f"touch {marker}; python", "env_vars": {"HERD_PWNED": "1"},
                     "worker_process_setup_hook": "os.abort"})
    (path / "checkpoint.json").write_text(json.dumps(meta))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    load = (f"from herdrl import Algorithm; a = Algorithm.from_checkpoint({str(path)!r}); r = a.train(); a.stop(); "
            "print(a.config.runtime_env, a.config.address, a.config.node_ip_address, r['num_healthy_env_runners'])")
    loaded = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, env=env, timeout=180)
    assert loaded.stdout.split() == ["None", "None", "None", "1"], loaded.stderr[-2000:]
    assert "sets runtime_env=" in loaded.stderr  # the user is told what the file asked for
    resumed = subprocess.run([HERD, "train", "--resume", "--output", str(tmp_path / "results"), "--name", "exp",
                              "--trial", "trial", "--stop-iters", "2", "--quiet", "--no-tensorboard"],
                             capture_output=True, text=True, env=env, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    evaluated = subprocess.run([HERD, "evaluate", str(trial), "--episodes", "2"], capture_output=True, text=True,
                               env=env, timeout=120)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert Policy.from_checkpoint(trial).compute_single_action(np.zeros(4, np.float32)) in (0, 1)
    assert not marker.exists()
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


def test_a_resumed_run_does_not_replay_the_episodes_it_began_with_and_resumes_the_same_way_twice(tmp_path):
    algo = PPOConfig().environment("CartPole-v1").training(train_batch_size=512).debugging(seed=0).build()
    first_resets = algo.runners.runner._obs.copy()
    algo.train()
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    resumed = [Algorithm.from_checkpoint(path) for _ in range(2)]
    assert not np.allclose(resumed[0].runners.runner._obs, first_resets)  # fresh episodes, not the first ones
    rows = [{k: v for k, v in r.train().items() if k not in TIMING_KEYS + GAUGE_KEYS} for r in resumed]
    assert rows[0] == rows[1]
    for r in resumed:
        r.stop()


def test_a_checkpoint_never_decides_which_module_is_imported(tmp_path, monkeypatch):
    """An env id 'module:EnvId' makes Gymnasium import the module: from a file, that is refused with the flag to
    add; given by the user, it is made."""
    marker = tmp_path / "imported-marker"
    (tmp_path / "pwnmod.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                        "import gymnasium\n"
                                        "gymnasium.register('Pwn-v0', entry_point='gymnasium.envs.classic_control:"
                                        "CartPoleEnv', max_episode_steps=50)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    algo = trained(1)
    path = algo.save(tmp_path / "checkpoint_000001")
    algo.stop()
    meta = json.loads((path / "checkpoint.json").read_text())
    meta["config"]["env"] = "pwnmod:Pwn-v0"
    (path / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(EnvError, match=r"imports module 'pwnmod' to make it; .*add --import pwnmod"):
        Algorithm.from_checkpoint(path)
    out = subprocess.run([HERD, "evaluate", str(path), "--episodes", "1"], capture_output=True, text=True)
    assert out.returncode != 0 and "--import pwnmod" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    Policy.from_checkpoint(path)  # inference makes no env: nothing to import
    assert not marker.exists()
    Algorithm.from_checkpoint(path, env="pwnmod:Pwn-v0").stop()  # the user's own choice
    assert marker.exists()


def test_prune_keeps_the_newest_and_the_best(tmp_path):
    algo = trained(1)
    for i, score in enumerate([5.0, 50.0, 7.0, 8.0, 9.0], start=1):
        algo.last_result = {"episode_return_mean": score}
        algo.iteration = i
        algo.save(tmp_path / f"checkpoint_{i:06d}")
    prune(tmp_path, keep=2, score_attr="episode_return_mean")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_000002", "checkpoint_000004",
                                                             "checkpoint_000005"]


def test_prune_refuses_to_keep_none_and_never_deletes_the_newest(tmp_path):
    algo = trained(1)
    for i, score in enumerate([float("nan"), 50.0, float("nan")], start=1):
        algo.last_result = {"episode_return_mean": score}
        algo.iteration = i
        algo.save(tmp_path / f"checkpoint_{i:06d}")
    algo.stop()
    for keep in (0, -1):
        with pytest.raises(ConfigError, match="keep_checkpoints_num got"):
            prune(tmp_path, keep=keep, score_attr="")
    assert len(list_checkpoints(tmp_path)) == 3
    prune(tmp_path, keep=1, score_attr="episode_return_mean")  # NaN scores are never the best
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_000002", "checkpoint_000003"]
    prune(tmp_path, keep=1, score_attr="")  # no score: the newest alone
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_000003"]
    out = subprocess.run([HERD, "train", "ppo", "--env", "CartPole-v1", "--stop-iters", "1", "--output",
                          str(tmp_path), "--keep-checkpoints-num", "0", "--no-tensorboard"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "keep_checkpoints_num got 0" in out.stderr


def test_a_restored_run_trains_with_the_lr_it_is_given_not_the_saved_one(tmp_path):
    """The checkpoint gives moments and step counts; the config gives hyperparameters. With lr=1e-9 one
    iteration leaves the weights where they were; with the lr it was trained with (PPO's 2e-3) they move ~1e-2."""
    algo = trained(2)
    path = algo.save(tmp_path / "checkpoint_000002")
    algo.stop()
    moved = {}
    for lr in (1e-9, None):
        resumed = Algorithm.from_checkpoint(path, **({} if lr is None else {"lr": lr}))
        before = {k: v.copy() for k, v in resumed.get_weights().items()}
        resumed.train()
        moved[lr] = max(float(np.abs(v - before[k]).max()) for k, v in resumed.get_weights().items())
        resumed.stop()
    assert moved[1e-9] < 1e-6 and moved[None] > 1e-3, moved


def test_saving_elsewhere_never_deletes_another_runs_replay_buffer(tmp_path):
    from herdrl import DQNConfig

    def dqn(seed):
        algo = DQNConfig().environment("CartPole-v1").training(
            num_steps_sampled_before_learning_starts=64, min_sample_timesteps_per_iteration=64,
            store_buffer_in_checkpoints=True).debugging(
            seed=seed).build()
        algo.train()
        return algo

    one, other = dqn(0), dqn(1)
    first = one.save(tmp_path / "checkpoint_000001")
    theirs = other.save(tmp_path / "checkpoint_000002")  # another run, the same folder
    assert (first / "replay_buffer.npz").exists() and (theirs / "replay_buffer.npz").exists()
    one.train()
    mine = one.save(tmp_path / "checkpoint_000003")  # this run's newer checkpoint replaces its own older buffer
    assert not (first / "replay_buffer.npz").exists()
    assert (theirs / "replay_buffer.npz").exists() and (mine / "replay_buffer.npz").exists()
    one.stop()
    other.stop()


def rows(trial: Path) -> list[int]:
    with open(trial / "progress.csv") as f:
        return [int(r["training_iteration"]) for r in csv.DictReader(f)]


def start(tmp_path: Path, *extra: str, quiet: bool = True) -> subprocess.Popen:
    return subprocess.Popen([HERD, "train", "ppo", "--env", "CartPole-v1", "--seed", "0", "--checkpoint-every", "1",
                             "--output", str(tmp_path), *(["--quiet"] if quiet else []), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_rows(trial_root: Path, count: int, proc: subprocess.Popen, timeout: float = 60) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        trials = list(trial_root.glob("*/progress.csv"))
        if trials and len(rows(trials[0].parent)) >= count:
            return trials[0].parent
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("training did not progress")


def test_sigkill_and_resume_lose_nothing_and_the_run_completes(tmp_path):
    root = tmp_path / "CartPole-v1"
    proc = start(tmp_path)
    trial = wait_for_rows(root, 8, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for kill_after in (0.4, 0.25):  # resume, then kill again at an arbitrary moment (often mid-checkpoint)
        proc = start(tmp_path, "--resume")
        before = len(rows(trial)) if (trial / "progress.csv").exists() else 0
        wait_for_rows(root, before + 2, proc)
        time.sleep(kill_after)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # Damage the newest checkpoint as a kill during its write could, and leave a temp dir behind.
    newest = list_checkpoints(trial)[-1]
    (newest / "learner.pt").write_bytes(b"PK\x03\x04 truncated")
    (trial / ".checkpoint_999999.tmp-1").mkdir()
    fallback = list_checkpoints(trial)[-2]
    proc = start(tmp_path, "--resume")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert out.startswith("solved:")
    iterations = rows(trial)
    assert iterations == list(range(1, iterations[-1] + 1))  # every iteration exactly once
    lines = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
    assert [r["training_iteration"] for r in lines] == iterations
    resumed_from = int(fallback.name.split("_")[1])
    assert lines[resumed_from]["training_iteration"] == resumed_from + 1
    assert lines[-1]["episode_return_mean"] >= 475
    assert Policy.from_checkpoint(trial).compute_single_action(np.zeros(4, np.float32)) in (0, 1)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGUSR1, 75)])
def test_ctrl_c_sigterm_or_the_walltime_signal_stops_after_the_iteration_with_a_final_checkpoint(tmp_path, sig, code):
    proc = start(tmp_path, "--checkpoint-every", "0", "--stop-iters", "100000", "--no-tensorboard", quiet=False)
    trial = wait_for_rows(tmp_path / "CartPole-v1", 3, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    why = " (the job's walltime is near)" if sig == signal.SIGUSR1 else ""
    assert f"{sig.name}{why}: stopping after this iteration" in out
    assert ("Ctrl-C again" in out) == (sig == signal.SIGINT)  # a batch job's SIGTERM has no Ctrl-C to press
    last = rows(trial)[-1]
    assert newest_valid_checkpoint(trial).name == f"checkpoint_{last:06d}"


def test_herd_stop_at_stops_with_a_checkpoint_and_exit_75_and_the_resume_goes_on(tmp_path, capsys, monkeypatch):
    """HERD_STOP_AT (a walltime less a lead, for schedulers that send no signal): the run stops once the next
    iteration would not end by then, checkpointed, exit 75 ("resume me"); a resume without it goes on."""
    import time

    from herdrl.cli import main

    args = ["train", "ppo", "--env", "CartPole-v1", "--stop-iters", "3", "--output", str(tmp_path), "--trial", "t",
            "--config", "train_batch_size=256", "minibatch_size=64", "--checkpoint-every", "100"]
    monkeypatch.setenv("HERD_STOP_AT", "not a time")
    assert main(args) == 2
    assert "HERD_STOP_AT='not a time' is not a time" in capsys.readouterr().err
    monkeypatch.setenv("HERD_STOP_AT", str(time.time()))  # already past: one iteration, then stop
    assert main(args) == 75
    assert "HERD_STOP_AT: no time left for another iteration: stopping with a checkpoint" in capsys.readouterr().out
    assert rows(tmp_path / "CartPole-v1" / "t") == [1]
    assert newest_valid_checkpoint(tmp_path / "CartPole-v1" / "t").name == "checkpoint_000001"
    monkeypatch.delenv("HERD_STOP_AT")
    assert main([*args, "--resume"]) == 0
    assert rows(tmp_path / "CartPole-v1" / "t") == [1, 2, 3]


def test_resume_if_any_starts_a_trial_without_a_checkpoint_over_and_continues_one_with_one(tmp_path, capsys):
    """A batch job requeued by its scheduler runs the same command again, perhaps before its first checkpoint:
    --resume-if-any starts the named trial over in place (its rows dropped), or continues it from a checkpoint."""
    import shutil

    from herdrl.cli import main

    args = ["train", "ppo", "--env", "CartPole-v1", "--output", str(tmp_path), "--trial", "t", "--quiet",
            "--config", "train_batch_size=256", "minibatch_size=64"]
    assert main([*args[:6], "--quiet", "--resume-if-any"]) == 2  # no --trial
    assert "--resume-if-any needs --trial" in capsys.readouterr().err
    assert main([*args, "--stop-iters", "2"]) == 0
    trial = tmp_path / "CartPole-v1" / "t"
    for checkpoint in trial.glob("checkpoint_*"):  # as if the job died before it wrote one
        shutil.rmtree(checkpoint)
    assert main([*args, "--stop-iters", "1", "--resume-if-any"]) == 0
    assert rows(trial) == [1]  # started over: the two rows of the run that saved nothing are gone
    assert main([*args, "--stop-iters", "3", "--resume-if-any"]) == 0
    assert rows(trial) == [1, 2, 3]


def test_existing_trial_without_resume_is_refused(tmp_path, capsys):
    from herdrl.cli import main

    args = ["train", "ppo", "--env", "CartPole-v1", "--stop-iters", "1", "--quiet", "--output", str(tmp_path),
            "--trial", "t"]
    assert main(args) == 0
    assert main(args) == 2
    assert "add --resume to continue it" in capsys.readouterr().err
    assert main([*args[:4], "--stop-iters", "2", *args[6:], "--resume"]) == 0
    assert rows(tmp_path / "CartPole-v1" / "t") == [1, 2]
    capsys.readouterr()
    # A finished trial resumed (the next job of a chain) exits at once with success, training nothing.
    assert main([*args[:4], "--stop-iters", "2", *args[6:], "--resume"]) == 0
    assert rows(tmp_path / "CartPole-v1" / "t") == [1, 2]
    assert capsys.readouterr().out.startswith("already done (iteration limit):")
    # The default criterion too: a budget spent unsolved exits 3 once; its resume ends the chain with success.
    budget = ["train", "ppo", "--env", "CartPole-v1", "--budget", "2048", "--quiet", "--output", str(tmp_path),
              "--trial", "b"]
    assert main(budget) == 3
    before = rows(tmp_path / "CartPole-v1" / "b")
    assert main([*budget, "--resume"]) == 0
    assert rows(tmp_path / "CartPole-v1" / "b") == before


def test_a_crafted_result_row_in_a_checkpoint_neither_ends_a_resume_nor_crashes_it(tmp_path, capsys):
    """Whether a resumed trial is done is read before anything is built: from the counters it restores, checked."""
    from herdrl.cli import main

    args = ["train", "ppo", "--env", "CartPole-v1", "--stop-iters", "2", "--quiet", "--output", str(tmp_path),
            "--trial", "t", "--no-tensorboard"]
    assert main([*args[:4], "--stop-iters", "1", *args[6:]]) == 0
    path = list_checkpoints(tmp_path / "CartPole-v1" / "t")[-1]
    meta = json.loads((path / "checkpoint.json").read_text())
    (path / "checkpoint.json").write_text(json.dumps({**meta, "metrics": {**meta["metrics"],
                                                                           "training_iteration": 1e300}}))
    assert main([*args, "--resume"]) == 0  # not "already done": it trains its second iteration
    assert rows(tmp_path / "CartPole-v1" / "t") == [1, 2]
    path = list_checkpoints(tmp_path / "CartPole-v1" / "t")[-1]
    meta = json.loads((path / "checkpoint.json").read_text())
    for counters in ("x", {**meta["counters"], "training_iteration": "9"}):
        (path / "checkpoint.json").write_text(json.dumps({**meta, "counters": counters}))
        capsys.readouterr()
        assert main([*args[:4], "--stop-iters", "5", *args[6:], "--resume"]) == 2
        err = capsys.readouterr().err
        assert "is damaged" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("flag, value", [("--stop-iters", "-5"), ("--stop-iters", "0"), ("--stop-timesteps", "-1"),
                                         ("--stop-time", "0")])
def test_a_limit_that_is_not_positive_is_refused(tmp_path, capsys, flag, value):
    from herdrl.cli import main

    assert main(["train", "ppo", "--env", "CartPole-v1", flag, value, "--output", str(tmp_path)]) == 2
    assert "expected a number > 0" in capsys.readouterr().err
    assert not (tmp_path / "CartPole-v1").exists()


def test_a_crafted_folder_cannot_redirect_writes_or_stall_a_loader(tmp_path):
    """Links, FIFOs and non-printable names in a folder handed to us: refused with one line, nothing written
    outside the folder, no read that never ends."""
    import os

    from herdrl.errors import HerdError
    from herdrl.trial_dir import TrialLock

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / ".herd.lock").symlink_to(victim)
    with pytest.raises(HerdError, match="cannot be used as a lock"):
        TrialLock(trial).acquire()
    assert victim.read_text() == "precious"

    algo = trained(1)
    good = algo.save(tmp_path / "checkpoint_000001")
    algo.stop()
    fifo_ckpt = tmp_path / "fifo" / "checkpoint_000001"
    fifo_ckpt.mkdir(parents=True)
    os.mkfifo(fifo_ckpt / "checkpoint.json")  # reading it would block forever
    with pytest.raises(CheckpointError, match="not a plain checkpoint file"):
        Algorithm.from_checkpoint(fifo_ckpt)
    linked = tmp_path / "linked" / "checkpoint_000001"
    linked.mkdir(parents=True)
    (linked / "checkpoint.json").write_text((good / "checkpoint.json").read_text())
    (linked / "learner.pt").symlink_to(good / "learner.pt")
    with pytest.raises(CheckpointError, match="cannot be read as a checkpoint file"):
        Policy.from_checkpoint(linked)
    meta = json.loads((good / "checkpoint.json").read_text())
    meta["config"]["env"] = "CartPole-v1\x1b[2J"
    (good / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="its env is not a printable name"):
        Algorithm.from_checkpoint(good)


@pytest.mark.parametrize("name", ["ppo-cartpole", "dqn-cartpole", "sac-pendulum", "ppo-movingdot"])
def test_checkpoints_of_the_previous_release_load_and_train_on(name, tmp_path):
    """tests/checkpoints_v2 were written by herdrl 0.2.0 (format 2, MLPs before encoders existed; the image env's
    frames flattened into an MLP as they were, unscaled): today's code loads them, acts as they did, and trains
    on from them (weights, target networks, optimizers)."""
    import shutil

    import numpy as np
    from envs import MovingDot

    import herdrl
    from herdrl import Algorithm
    from herdrl.policy import Policy

    herdrl.register_env("moving_dot", MovingDot)
    source = Path(__file__).parent / "checkpoints_v2"
    case = json.loads((source / "expected.json").read_text())[name]
    path = tmp_path / case["checkpoint"]
    shutil.copytree(source / case["checkpoint"], path)
    policy = Policy.from_checkpoint(path)
    dtype = policy.observation_space.dtype
    actions = [np.asarray(policy.compute_single_action(np.asarray(o, dtype))).tolist() for o in case["obs"]]
    assert np.allclose(actions, case["actions"], atol=1e-6)
    algo = Algorithm.from_checkpoint(path)
    assert algo.iteration == 1
    result = algo.train()
    assert result["training_iteration"] == 2 and np.isfinite(result["num_env_steps_sampled_lifetime"])
    algo.stop()


def test_format_2_checkpoints_keep_their_encoding_only_where_they_need_it(tmp_path):
    """A 0.2.0 checkpoint of an image env: restore() into an algorithm built with today's encoders (what a Tune
    trial does) is one line, not a silent change; a format-2 config that already names conv_filters (written by
    the encoder code before format 3) is not forced flat; crafted huge spaces are refused."""
    import shutil

    from envs import MovingDot

    import herdrl
    from herdrl import PPOConfig
    from herdrl.checkpoint import CheckpointError, checkpoint_config, read_meta, space_from_json

    herdrl.register_env("moving_dot", MovingDot)
    source = Path(__file__).parent / "checkpoints_v2" / "ppo-movingdot"
    path = tmp_path / "old"
    shutil.copytree(source, path)
    algo = PPOConfig().environment("moving_dot").training(train_batch_size=64, minibatch_size=32).build()
    with pytest.raises(CheckpointError, match="written before encoders existed .* Algorithm.from_checkpoint"):
        algo.restore(path)
    algo.stop()
    meta = read_meta(path)
    assert checkpoint_config(meta)["model"]["obs_encoding"] == "flat"
    meta["config"]["model"] = {**meta["config"]["model"], "conv_filters": None}
    assert "obs_encoding" not in checkpoint_config(meta)["model"]
    for crafted in ({"type": "Box", "shape": [10**400], "dtype": "float32", "low": 0, "high": 1},
                    {"type": "MultiBinary", "n": [10**6, 10**6]}, {"type": "Box", "shape": [1], "dtype": "O",
                                                                   "low": 0, "high": 1}):
        with pytest.raises(CheckpointError):
            space_from_json(crafted)


def test_pruning_skips_a_checkpoint_json_that_is_not_a_checkpoints(tmp_path):
    """A damaged or crafted checkpoint.json (a JSON list, a FIFO) in a Tune-layout folder is skipped by the
    best-score scan instead of crashing or blocking every save; pruning still keeps the newest."""
    from herdrl.checkpoint import prune

    for name in ("checkpoint_000001", "checkpoint_000002", "checkpoint_000003"):
        (tmp_path / name / "herd").mkdir(parents=True)
    (tmp_path / "checkpoint_000001" / "herd" / "checkpoint.json").write_text("[]")
    os.mkfifo(tmp_path / "checkpoint_000002" / "herd" / "checkpoint.json")
    (tmp_path / "checkpoint_000003" / "herd" / "checkpoint.json").write_text('{"metrics": 5}')
    prune(tmp_path, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_000003"]
