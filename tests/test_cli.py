import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from herdrl.cli import main
from herdrl.errors import ConfigError


def trial_dir(root: Path) -> Path:
    (trial,) = [p for p in root.glob("*/*") if p.is_dir()]
    return trial


def test_train_writes_result_files(tmp_path, capsys):
    code = main(["train", "ppo", "--env", "CartPole-v1", "--stop-iters", "3", "--seed", "1",
                 "--output", str(tmp_path), "--config", "train_batch_size=256", "minibatch_size=64"])
    assert code == 0
    trial = trial_dir(tmp_path)
    assert trial.parent.name == "CartPole-v1" and trial.name.startswith("PPO_CartPole-v1_1_")
    params = json.loads((trial / "params.json").read_text())
    assert params["algorithm"] == "PPO" and params["train_batch_size"] == 256 and params["seed"] == 1
    with open(trial / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["training_iteration"] for r in rows] == ["1", "2", "3"]
    lines = (trial / "result.json").read_text().splitlines()
    assert [json.loads(line)["training_iteration"] for line in lines] == [1, 2, 3]
    assert list(trial.glob("events.out.tfevents.*"))
    out = capsys.readouterr().out
    assert "iter    3" in out and "iteration limit: episode_return_mean" in out


def test_quiet_prints_only_the_summary_and_names_are_settable(tmp_path, capsys):
    code = main(["train", "ppo", "--env", "CartPole-v1", "--stop-timesteps", "500", "--quiet", "--no-tensorboard",
                 "--output", str(tmp_path), "--name", "exp", "--trial", "t1"])
    assert code == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("step limit:")
    assert (tmp_path / "exp" / "t1" / "progress.csv").exists()
    assert not list((tmp_path / "exp" / "t1").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("argv, message", [
    (["train", "ppo", "--env", "CartPol-v1"], "unknown env 'CartPol-v1' (did you mean 'CartPole-v1'?)"),
    (["train", "pop", "--env", "CartPole-v1"], "unknown algorithm 'pop' (did you mean 'PPO'?); known: PPO"),
    (["train", "ppo", "--env", "CartPole-v1", "--config", "lr=-1"],
     "config key 'lr' got -1.0; expected float >= 0, or a schedule"),
    (["train", "ppo", "--env", "CartPole-v1", "--config", "lrr=1"], "unknown config key 'lrr' for PPO"),
    (["train", "dqn", "--env", "Pendulum-v1"], "DQN needs Discrete actions; this env has Box("),
    (["train", "ppo"], "no env set"),
    (["train", "--env", "CartPole-v1"], "no algorithm"),
    (["train", "ppo", "--env", "CartPole-v1", "-f", "missing.yaml"], "experiment file 'missing.yaml' not found"),
    (["train", "ppo", "--env", "CartPole-v1", "--checkpoint-every", "-1"],
     "--checkpoint-every got -1; expected a number of iterations >= 1, or 0 (only at the end)"),
])
def test_bad_input_gives_one_clear_line_and_exit_2(tmp_path, capsys, argv, message):
    assert main([*argv, "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing written for bad input


def test_debug_shows_the_traceback(tmp_path):
    from herdrl.errors import EnvError

    with pytest.raises(EnvError):
        main(["--debug", "train", "ppo", "--env", "CartPol-v1", "--output", str(tmp_path)])


def test_console_says_when_no_episode_finished_and_never_prints_nan(tmp_path, capsys):
    """Pendulum's episodes last 200 steps: with 100-step iterations, every other iteration finishes none."""
    code = main(["train", "ppo", "--env", "Pendulum-v1", "--stop-iters", "3", "--output", str(tmp_path),
                 "--no-tensorboard", "--config", "train_batch_size=100", "minibatch_size=50",
                 "rollout_fragment_length=100", "num_envs_per_env_runner=1"])
    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iter ")]
    rows = (trial_dir(tmp_path) / "result.json").read_text().splitlines()
    finished = [json.loads(row)["num_episodes"] for row in rows]
    assert [("no episode finished this iteration" in line) for line in lines] == [n == 0 for n in finished]
    assert 0 in finished and "nan" not in "".join(lines).lower() and "return        -" in lines[0]


def test_budget_exhausted_before_solving_exits_3(tmp_path, capsys):
    code = main(["train", "ppo", "--env", "CartPole-v1", "--budget", "2000", "--quiet", "--output", str(tmp_path)])
    assert code == 3
    err = capsys.readouterr().err
    assert err.startswith("budget: episode_return_mean") and len(err.strip().splitlines()) == 1


def test_experiment_file_rllib_shape_parses_numbers(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("my-exp:\n  run: PPO\n  env: CartPole-v1\n  stop: {training_iteration: 2}\n"
                   "  config: {lr: 1e-4, train_batch_size: 128, minibatch_size: 64, lambda: 0.8, num_workers: 0}\n")
    assert main(["train", "-f", str(exp), "--quiet", "--output", str(tmp_path / "out")]) == 0
    trial = trial_dir(tmp_path / "out")
    assert trial.parent.name == "my-exp"
    params = json.loads((trial / "params.json").read_text())
    assert params["lr"] == 1e-4 and params["lambda_"] == 0.8
    assert len((trial / "result.json").read_text().splitlines()) == 2


def test_experiment_file_top_level_keys_and_cli_overrides(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("algorithm: PPO\nenv: CartPole-v1\nstop: {training_iteration: 5}\nconfig: {lr: 3e-3}\n")
    assert main(["train", "-f", str(exp), "--stop-iters", "1", "--config", "lr=5e-4", "--quiet",
                 "--output", str(tmp_path / "out")]) == 0
    trial = trial_dir(tmp_path / "out")
    assert json.loads((trial / "params.json").read_text())["lr"] == 5e-4
    assert len((trial / "result.json").read_text().splitlines()) == 1


def test_experiment_file_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: PPO\nenv: CartPole-v1\nstopp: {training_iteration: 1}\n")
    assert main(["train", "-f", str(bad)]) == 2
    assert "unknown key 'stopp' (did you mean 'stop'?)" in capsys.readouterr().err
    bad.write_text("algorithm: PPO\nenv: CartPole-v1\nstop: {iterations: 1}\n")
    assert main(["train", "-f", str(bad), "--output", str(tmp_path)]) == 2
    assert "unknown stop key 'iterations'" in capsys.readouterr().err


def test_shipped_examples_parse():
    from herdrl.experiment import has_search_space, load_experiment_file, normalize_stop
    from herdrl.registry import get_config_class
    from herdrl.tune import _check_keys, search_space

    root = Path(__file__).parent.parent / "examples"
    paths = [*root.glob("*.yaml"), *root.glob("mujoco/*.yaml"), *root.glob("multi-agent/*.yaml")]  # (not cluster/)
    assert len(paths) >= 20
    for path in paths:
        spec = load_experiment_file(path, sweep=True)
        config_class = get_config_class(spec["algorithm"])
        if has_search_space(spec["config"]) or "num_samples" in spec:
            _check_keys(config_class, spec["config"])
            search_space(spec["config"])
        else:  # as `herd train -f` builds it: named schedules decay over the stop's env steps
            config = config_class.from_dict(spec["config"]).environment(spec["env"])
            steps = normalize_stop(spec["stop"]).get("num_env_steps_sampled_lifetime")
            if steps:
                config.decay_over(int(steps))
            config.validate()


def test_seed_trainer_flags(tmp_path):
    assert main(["train", "--run", "PPO", "--name-env", "CartPole-v1", "--num-cpus", "0", "--num-gpus", "0",
                 "--local-mode", "--stop-iters", "1", "--quiet", "--output", str(tmp_path)]) == 0
    params = json.loads((trial_dir(tmp_path) / "params.json").read_text())
    assert params["num_env_runners"] == 0 and params["num_gpus"] == 0


def test_overrides_parse_types_and_nested_model_keys():
    from herdrl.cli import parse_overrides

    assert parse_overrides(["lr=1e-5", "model.fcnet_hiddens=[32, 32]", "vf_clip_param=null"]) == {
        "lr": 1e-5, "model": {"fcnet_hiddens": [32, 32]}, "vf_clip_param": None}
    # The shell splits an unquoted `env_config={step_latency_s: 0.002}` in two: it still means one value.
    assert parse_overrides(["env_config={step_latency_s:", "0.002}", "lr=1e-3"]) == {
        "env_config": {"step_latency_s": 0.002}, "lr": 1e-3}
    with pytest.raises(ConfigError, match="expects KEY=VALUE, got '0.002'"):
        parse_overrides(["lr=1e-3", "0.002"])


def test_herd_console_script_runs_in_a_fresh_process(tmp_path):
    herd = Path(sys.executable).parent / "herd"
    out = subprocess.run([str(herd), "train", "ppo", "--env", "CartPol-v1"], capture_output=True, text=True)
    assert out.returncode == 2 and "did you mean 'CartPole-v1'" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([str(herd), "train", "ppo", "--env", "CartPole-v1", "--stop-iters", "1", "--quiet",
                          "--output", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_every_command_has_a_description_in_its_help():
    import argparse

    from herdrl.cli import build_parser

    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    yield f"{name} {sub_name}", sub
                    yield from walk(sub, f"{name} {sub_name}")

    missing = [name for name, parser in walk(build_parser(), "herd") if not parser.description]
    assert missing == []


def test_a_kill_while_progress_csv_is_rewritten_keeps_the_curve(tmp_path, monkeypatch):
    """A new key (evaluation metrics) rewrites progress.csv under a wider header: a crash in that window leaves
    the rows already written."""
    import csv as csv_module

    from herdrl.logger import Logger

    log = Logger(tmp_path, {}, tensorboard=False)
    for i in (1, 2):
        log.log({"training_iteration": i, "episode_return_mean": float(i)})

    def killed(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(csv_module.DictWriter, "writeheader", killed)
    with pytest.raises(KeyboardInterrupt):
        log.log({"training_iteration": 3, "episode_return_mean": 3.0, "evaluation/episode_return_mean": 9.0})
    monkeypatch.undo()
    with open(tmp_path / "progress.csv", newline="") as f:
        assert [row["training_iteration"] for row in csv_module.DictReader(f)] == ["1", "2"]
    log.close()
    # A resume drops the rows after its checkpoint by rewriting the file: a crash there keeps it whole too.
    monkeypatch.setattr(csv_module.DictWriter, "writeheader", killed)
    with pytest.raises(KeyboardInterrupt):
        Logger(tmp_path, {}, tensorboard=False, resume_after=(1, 100))
    monkeypatch.undo()
    with open(tmp_path / "progress.csv", newline="") as f:
        assert [row["training_iteration"] for row in csv_module.DictReader(f)] == ["1", "2"]


def test_a_flag_or_key_an_algorithm_lacks_is_refused_as_the_user_typed_it(tmp_path, capsys):
    """`--input` sets `input_`, which only the offline algorithms have: the error names `--input` and them, never
    the key the user did not type; every flag's table entry is the flag argparse maps to that destination."""
    cases = [(["ppo", "--input", "data/x"], "--input is for the offline algorithms, which learn from a dataset "
                                            "(BC, MARWIL, CQL, IQL), not PPO"),
             (["ppo", "--config", "input=data/x"], "unknown config key 'input' for PPO (a key of BC, MARWIL, CQL, "
                                                   "IQL)"),
             (["dqn", "--config", "lambda=0.9"], "unknown config key 'lambda' for DQN (a key of PPO, A2C, TRPO)")]
    for argv, message in cases:
        assert main(["train", *argv, "--env", "CartPole-v1", "--output", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert message in err and "input_" not in err and "lambda_" not in err, err
    from herdrl.cli import FLAG_KEYS, build_parser

    parser = build_parser()
    for dest, _, flag in FLAG_KEYS:
        args = parser.parse_args(["train", flag, *([] if flag in ("--local-mode", "--dashboard") else ["1"])])
        assert getattr(args, dest) not in (None, False), flag
    assert not list(tmp_path.iterdir())


def test_yaml_syntax_errors_say_the_file_line_and_column_and_what_is_wrong(tmp_path, capsys):
    from herdrl.cluster.connect import ClusterError
    from herdrl.cluster.hosts import load_hosts

    def position(text, line_text, char):  # where `char` is on the line that starts with `line_text`, from 1
        lines = text.splitlines()
        row = next(i for i, line in enumerate(lines) if line.startswith(line_text))
        return f"line {row + 1}, column {lines[row].index(char) + 1}"

    indented = "run: PPO\nenv: CartPole-v1\nconfig:\n  lr: 1e-3\n   gamma: 0.9\n"
    unclosed = "run: PPO\nconfig: {lr: 1e-3\nstop: {}\n"
    tabbed = "run: PPO\n\tenv: CartPole-v1\n"
    expected = [(indented, f"{position(indented, '   gamma', ':')}: invalid YAML: mapping values are not allowed "
                           "here"),
                (unclosed, f"{position(unclosed, 'stop', ':')}: invalid YAML: expected ',' or '}}', but got ':' "
                           f"(while parsing a flow mapping that starts at {position(unclosed, 'config', '{')})"),
                (tabbed, f"{position(tabbed, chr(9), chr(9))}: invalid YAML: found character '\\t' that cannot "
                         "start any token (while scanning for the next token); YAML indents with spaces")]
    for i, (text, message) in enumerate(expected):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(text)
        assert main(["train", "-f", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"herd train: error: {path}, {message}" in err and len(err.strip().splitlines()) == 1, err
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("head: a\nworkers: [b, c\n")
    with pytest.raises(ClusterError, match=r"hosts\.yaml, line 3, column 1 is not valid YAML: expected ',' or "
                                           r"'\]', but got '<stream end>' \(while parsing a flow sequence that "
                                           r"starts at line 2, column 10\)"):
        load_hosts(hosts)


def test_checkpoint_every_zero_means_only_at_the_end_in_the_library_too(tmp_path):
    """The library takes what its message says (and the CLI's --checkpoint-every takes): 0 or None, only at the
    end; below 0 is refused, naming both."""
    from herdrl.algorithms.ppo import PPOConfig
    from herdrl.experiment import run_experiment

    config = PPOConfig().environment("CartPole-v1").training(train_batch_size=128, minibatch_size=64)
    with pytest.raises(ConfigError, match=r"checkpoint_every got -1; expected an int >= 1, or 0 or None"):
        run_experiment(config, checkpoint_every=-1, output=tmp_path, quiet=True)
    outcome = run_experiment(config, stop={"training_iteration": 3}, checkpoint_every=0, output=tmp_path,
                             quiet=True, tensorboard=False)
    assert sorted(p.name for p in outcome.logdir.glob("checkpoint_*")) == ["checkpoint_000003"]
