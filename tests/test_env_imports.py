"""Your own env from the command line: MODULE:ID, --import MODULE, `imports:` in a file, well-known packages.

The CLI tests run the real `herd` command in a folder holding the user's env module, as a user would."""

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from herdrl.env import imports
from herdrl.env.vector import make_single_env
from herdrl.errors import EnvError

HERD = str(Path(sys.executable).parent / "herd")

REGENVS = """
import gymnasium
import herdrl

gymnasium.register("Corridor-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=30)
herdrl.register_env("corridor", lambda cfg: gymnasium.make("CartPole-v1", max_episode_steps=30))
"""


def herd(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([HERD, *args], cwd=cwd, capture_output=True, text=True, timeout=240)


def one_line_error(out: subprocess.CompletedProcess, *needles: str) -> None:
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr[-2000:]
    for needle in needles:
        assert needle in out.stderr


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "regenvs.py").write_text(REGENVS)
    return tmp_path


def only_trial(root: Path) -> Path:
    (trial,) = [p for p in root.glob("results/*/*") if p.is_dir()]
    return trial


def test_module_env_id_trains_and_its_checkpoint_needs_the_flag_to_load(user_dir):
    out = herd(user_dir, "train", "ppo", "--env", "regenvs:Corridor-v0", "--stop-iters", "1", "--quiet",
               "--no-tensorboard", "--config", "train_batch_size=200", "minibatch_size=100")
    assert out.returncode == 0, out.stderr[-2000:]
    trial = only_trial(user_dir)
    assert json.loads((trial / "params.json").read_text())["imports"] == ["regenvs"]
    one_line_error(herd(user_dir, "evaluate", str(trial), "--episodes", "1"), "--import regenvs")
    out = herd(user_dir, "evaluate", str(trial), "--episodes", "1", "--import", "regenvs")
    assert out.returncode == 0 and "regenvs:Corridor-v0: 1 episode " in out.stdout, out.stderr[-2000:]


def test_import_flag_registers_envs_for_ray_runners_resume_and_evaluate(user_dir):
    """A Gymnasium id registered by --import: the Ray runner imports the module too (it has no other way to
    know the id); resume and evaluate name the flag when it is missing and work with it."""
    common = ["--stop-iters", "1", "--quiet", "--no-tensorboard", "--config", "train_batch_size=200",
              "minibatch_size=100"]
    out = herd(user_dir, "train", "ppo", "--env", "Corridor-v0", "--import", "regenvs", "--num-env-runners", "1",
               *common)
    assert out.returncode == 0, out.stderr[-3000:]
    trial = only_trial(user_dir)
    one_line_error(herd(user_dir, "train", "ppo", "--env", "Corridor-v0", "--resume", "--stop-iters", "2"),
                   "registered by module(s) regenvs", "--import regenvs")
    one_line_error(herd(user_dir, "evaluate", str(trial), "--episodes", "1"), "--import regenvs")
    out = herd(user_dir, "train", "ppo", "--env", "Corridor-v0", "--resume", "--import", "regenvs",
               "--stop-iters", "2", "--quiet", "--no-tensorboard")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line)["training_iteration"] for line in (trial / "result.json").read_text().splitlines()]
    assert rows == [1, 2]


def test_register_env_name_from_a_yaml_imports_list(user_dir):
    (user_dir / "exp.yaml").write_text("corridor-ppo:\n  run: PPO\n  env: corridor\n  imports: [regenvs]\n"
                                       "  stop: {training_iteration: 1}\n"
                                       "  config: {train_batch_size: 200, minibatch_size: 100}\n")
    out = herd(user_dir, "train", "-f", "exp.yaml", "--quiet", "--no-tensorboard")
    assert out.returncode == 0, out.stderr[-2000:]
    trial = only_trial(user_dir)
    one_line_error(herd(user_dir, "evaluate", str(trial), "--episodes", "1"), "env 'corridor'", "--import regenvs")
    out = herd(user_dir, "evaluate", str(trial), "--episodes", "1", "--import", "regenvs")
    assert out.returncode == 0 and "corridor: 1 episode " in out.stdout, out.stderr[-2000:]
    out = herd(user_dir, "export", str(trial), "--format", "torch-export", "--out", "p.pt2", "--import", "regenvs")
    assert out.returncode == 0 and (user_dir / "p.pt2").exists(), out.stderr[-2000:]


def test_bench_scaling_runs_a_register_env_env_on_ray_runners(user_dir):
    out = herd(user_dir, "bench", "scaling", "--env", "corridor", "--import", "regenvs", "--runners", "1",
               "--iters", "1", "--fragment", "20", "--no-local", "--out", "bench")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "\n| 1 | 1 |" in out.stdout and (user_dir / "bench" / "scaling.csv").exists()


def test_a_module_that_cannot_be_imported_is_one_line(user_dir):
    one_line_error(herd(user_dir, "train", "ppo", "--env", "CartPole-v1", "--import", "no_such_envs"),
                   "--import no_such_envs: the module cannot be imported (ModuleNotFoundError")
    one_line_error(herd(user_dir, "train", "ppo", "--env", "no_such_envs:X-v0"), "module 'no_such_envs'")


def test_well_known_packages_are_imported_by_prefix(tmp_path, monkeypatch):
    (tmp_path / "fakepkg_envs.py").write_text(
        "import gymnasium\ngymnasium.register('Fake/Pole-v0', entry_point='gymnasium.envs.classic_control:"
        "CartPoleEnv')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(imports.KNOWN_ENV_PACKAGES, "Fake/", "fakepkg_envs")
    monkeypatch.setitem(imports.KNOWN_ENV_PACKAGES, "Missing/", "missing_pkg_envs")
    try:
        assert make_single_env("Fake/Pole-v0").action_space.n == 2
        assert "fakepkg_envs" in imports.IMPORTED
        with pytest.raises(EnvError, match="package 'missing_pkg_envs', which is not installed: pip install "
                                           "missing-pkg-envs"):
            make_single_env("Missing/Env-v0")
    finally:
        gym.registry.pop("Fake/Pole-v0", None)


def test_atari_ids_import_ale_py():
    pytest.importorskip("ale_py")
    assert make_single_env("ALE/Pong-v5", {"preprocess": False}).observation_space.shape == (210, 160, 3)
    assert imports.known_package("Pong-v4") == "ale_py" and imports.known_package("Corridor-v0") is None


def test_a_file_in_the_current_folder_cannot_pose_as_a_well_known_package(user_dir):
    """Only the user's own --import / MODULE:ID modules are looked up in the current folder."""
    marker = user_dir / "ran-marker"
    (user_dir / "procgen.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    one_line_error(herd(user_dir, "train", "ppo", "--env", "procgen-coinrun-v0"),
                   "package 'procgen', which is not installed")
    assert not marker.exists()


def test_tune_trials_import_the_modules_given_to_herd_tune(user_dir):
    """Each Tune trial runs in its own process: it imports --import modules (and gets register_env names)."""
    (user_dir / "sweep.yaml").write_text("name: s\nalgorithm: PPO\nenv: Corridor-v0\nstop: {training_iteration: 1}\n"
                                         "config: {train_batch_size: 200, minibatch_size: 100, "
                                         "lr: {grid_search: [1e-3, 2e-3]}}\n")
    out = herd(user_dir, "tune", "-f", "sweep.yaml", "--import", "regenvs", "--verbose", "0")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert len(list((user_dir / "results" / "s").glob("PPO_*/result.json"))) == 2


def test_gymnasium_warnings_carry_no_colour_codes_off_a_terminal():
    """A log file (stderr not a terminal) gets Gymnasium's warnings as plain text."""
    code = ("import warnings, herdrl.env.vector\nfrom gymnasium import logger\n"
            "warnings.simplefilter('always')\nlogger.warn('a warning %s', 1)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "WARN: a warning 1" in out.stderr
    assert "\x1b[" not in out.stderr
