"""herd plot groups runs by what differs between them and draws each group's mean over its seeds."""

import csv
import json

import matplotlib.image
import numpy as np
import pytest

from herdrl.cli import main
from herdrl.plot import group_curves


def fake_trial(root, name, params, xs, ys):
    trial = root / name
    trial.mkdir(parents=True)
    (trial / "params.json").write_text(json.dumps(params))
    with open(trial / "progress.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["training_iteration", "num_env_steps_sampled_lifetime", "time_total_s",
                         "episode_return_mean"])
        for i, (x, y) in enumerate(zip(xs, ys, strict=True), start=1):
            writer.writerow([i, x, i * 0.5, y])


@pytest.fixture
def experiment(tmp_path):
    exp = tmp_path / "CartPole-v1"
    xs = np.arange(0, 1001, 100)
    base = {"env": "CartPole-v1", "model": {"fcnet_hiddens": [64, 64]}}
    fake_trial(exp, "PPO_a", {"algorithm": "PPO", "lr": 1e-3, "seed": 1, **base}, xs, xs * 1.0)
    fake_trial(exp, "PPO_b", {"algorithm": "PPO", "lr": 1e-3, "seed": 2, **base}, xs, xs * 3.0)
    fake_trial(exp, "PPO_c", {"algorithm": "PPO", "lr": 3e-3, "seed": 1, **base}, xs, xs * 0 + 10.0)
    fake_trial(exp, "DQN_d", {"algorithm": "DQN", "lr": 1e-3, "seed": 1, **base}, xs[:6], xs[:6] * 0 + 5.0)
    # A Tune trial: no "algorithm" in its params.json; the folder name says it.
    fake_trial(exp, "A2C_CartPole-v1_0_lr=0.001", {"lr": 1e-3, "seed": 1, **base}, xs, xs * 0 + 7.0)
    return exp


def test_runs_are_grouped_by_algorithm_and_swept_keys_never_by_seed(experiment):
    curves = {c.label: c for c in group_curves([experiment])}
    assert sorted(curves) == ["A2C", "DQN", "PPO lr=0.001", "PPO lr=0.003"]
    assert [curves[k].runs for k in sorted(curves)] == [1, 1, 2, 1]
    seeds = curves["PPO lr=0.001"]
    np.testing.assert_allclose(seeds.mean, np.interp(seeds.x, [0, 1000], [0, 2000]))  # (1x + 3x) / 2
    np.testing.assert_allclose(seeds.low, seeds.x * 1.0)
    np.testing.assert_allclose(seeds.high, seeds.x * 3.0)
    assert curves["DQN"].x[-1] == 500


def test_plot_any_key_on_named_axes_with_the_legend_beside_many_groups(experiment, tmp_path, capsys):
    for i in range(6):  # many groups: the legend goes beside the plot, inside the image
        fake_trial(experiment, f"PPO_x{i}", {"algorithm": "PPO", "lr": 1e-4 * (i + 1), "seed": 1},
                   [0, 100], [1.0, 2.0 + i])
    png = tmp_path / "curves.png"
    assert main(["plot", str(experiment), "--x", "time", "--y", "episode_return_mean", "--out", str(png)]) == 0
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[1] > pixels.shape[0] * 1.6  # widened for the legend beside the axes
    assert main(["plot", str(experiment), "--x", "iteration", "--out", str(tmp_path / "it.svg")]) == 0
    svg = (tmp_path / "it.svg").read_text()
    assert "training iteration" in svg and "episode return (mean of the last 100 episodes)" in svg


def test_scaling_plot_has_whole_runner_counts_on_its_axis(tmp_path, monkeypatch):
    import matplotlib.figure

    from herdrl.bench import ScalingRow, plot

    saved = []
    original = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: (saved.append(fig),
                                                                                   original(fig, *a, **k)))
    plot([ScalingRow(1, 1, 100, 100, 1, 1.0), ScalingRow(2, 1, 100, 190, 1, 1.9)], tmp_path / "s.png", "t")
    (ax,) = saved[0].axes
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_seeds_merge_however_given_and_defaults_never_split_a_group(tmp_path):
    """Trials given one by one still average their seeds; a Tune trial (only its swept keys in params.json)
    and a herd train trial (every key) with the same settings are one group; digits lead some labels."""
    from herdrl import PPOConfig

    xs = np.arange(0, 501, 100)
    full = {"algorithm": "PPO", **PPOConfig().environment("CartPole-v1").to_dict(), "seed": 1, "num_env_runners": 2}
    exp = tmp_path / "2024_ppo"
    fake_trial(exp, "PPO_train", full, xs, xs * 1.0)
    fake_trial(exp, "PPO_CartPole-v1_0_seed=2", {"env": "CartPole-v1", "seed": 2, "num_workers": 0}, xs, xs * 3.0)
    (curve,) = group_curves([exp / "PPO_train", exp / "PPO_CartPole-v1_0_seed=2"])
    assert curve.runs == 2 and curve.label == "PPO"
    np.testing.assert_allclose(curve.mean, curve.x * 2.0)
    fake_trial(tmp_path / "baseline", "PPO_b", full, xs, xs * 0.5)
    labels = [c.label for c in group_curves([exp, tmp_path / "baseline"])]
    assert labels == ["2024_ppo", "baseline"]


def test_each_run_is_drawn_on_the_metric_its_algorithm_is_judged_by(tmp_path):
    """DQN explores while it trains (its training return ends near 50 on CartPole) and is judged by greedy
    evaluation (500): by default it is drawn on that, PPO on its training return, and the legend says which."""
    exp = tmp_path / "CartPole-v1"
    fake_trial(exp, "PPO_a", {"algorithm": "PPO", "seed": 1}, [0, 1000], [20.0, 480.0])
    dqn = exp / "DQN_b"
    dqn.mkdir()
    (dqn / "params.json").write_text(json.dumps({"algorithm": "DQN", "seed": 1}))
    with open(dqn / "progress.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["training_iteration", "num_env_steps_sampled_lifetime", "episode_return_mean",
                         "evaluation/episode_return_mean"])
        writer.writerows([[1, 0, 9.0, 10.0], [2, 500, 40.0, ""], [3, 1000, 50.0, 500.0]])
    curves = {c.label: c for c in group_curves([exp])}
    assert sorted(curves) == ["DQN [greedy evaluation]", "PPO [training return]"]
    assert curves["DQN [greedy evaluation]"].mean[-1] == 500.0 and curves["PPO [training return]"].mean[-1] == 480
    assert {c.label for c in group_curves([exp], "episode_return_mean")} == {"DQN", "PPO"}  # --y: one metric
    assert curves["DQN [greedy evaluation]"].metric == "evaluation/episode_return_mean"


def test_an_offline_run_is_drawn_against_its_gradient_updates_beside_an_online_one(tmp_path, monkeypatch, capsys):
    """A BC run samples no env (its env steps stay 0): it is drawn against its gradient updates, and said so; an
    online run beside it keeps env steps. Folders may be given one relative, one absolute."""
    import matplotlib.figure

    from tests.test_offline import record_expert

    record_expert(tmp_path / "expert", 1)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "bc", "--input", "expert", "--env", "CartPole-v1", "--stop-iters", "3", "--seed", "0",
                 "--output", "offline", "--no-tensorboard", "--config", "updates_per_iteration=5",
                 "evaluation_duration=1"]) == 0
    (progress,) = (tmp_path / "offline").rglob("progress.csv")
    with open(progress, newline="") as f:
        rows = list(csv.DictReader(f))
    updates = [float(row["num_gradient_updates_lifetime"]) for row in rows]
    returns = [float(row["evaluation/episode_return_mean"]) for row in rows]
    assert updates == [5, 10, 15] and {row["num_env_steps_sampled_lifetime"] for row in rows} == {"0"}
    fake_trial(tmp_path / "online", "PPO_a", {"algorithm": "PPO", "seed": 1}, [0, 1000], [20.0, 480.0])
    saved = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
    assert main(["plot", "offline/CartPole-v1", "--out", "bc.png"]) == 0
    (ax,) = saved[-1].axes
    (line,) = ax.get_lines()
    assert line.get_xdata()[0] == 5 and line.get_xdata()[-1] == 15  # updates, not the env steps (all 0)
    np.testing.assert_allclose(line.get_ydata(), np.interp(line.get_xdata(), updates, returns))
    assert "gradient updates" in ax.get_xlabel()
    assert main(["plot", "offline/CartPole-v1", str(tmp_path / "online"), "--out", "both.png"]) == 0
    (ax,) = saved[-1].axes
    ranges = {text.get_text(): (line.get_xdata()[0], line.get_xdata()[-1])
              for text, line in zip(ax.get_legend().get_texts(), ax.get_lines(), strict=True)}
    assert ranges == {"offline/CartPole-v1 BC CartPole-v1 [greedy evaluation] [x: gradient updates] (1 run)": (5, 15),
                      "online PPO [training return] [x: env steps] (1 run)": (0, 1000)}
    assert "gradient updates" in ax.get_xlabel() and "env steps" in ax.get_xlabel()
    assert main(["train", "bc", "--input", "expert", "--stop-iters", "2", "--output", "no_env", "--no-tensorboard",
                 "--config", "updates_per_iteration=5"]) == 0  # no env: no evaluation, no return at all
    capsys.readouterr()
    assert main(["plot", "no_env", "--out", "none.png"]) == 2
    assert "an offline run without an env has no return; plot one of its losses" in capsys.readouterr().err
    assert main(["plot", "no_env", "--y", "policy_loss", "--out", "loss.png"]) == 0
    (line,) = saved[-1].axes[0].get_lines()
    assert list(line.get_xdata()[[0, -1]]) == [5, 10]


def test_a_damaged_progress_file_is_left_out_with_one_line(tmp_path, caplog):
    """Bytes that are not UTF-8, or a cell larger than csv's field limit: that run is left out, said in one line;
    the others are read."""
    import logging

    from herdrl.plot import read_runs

    for name, data in (("binary", b"training_iteration,episode_return_mean\n1,\xff\xfe\n"),
                       ("huge", b"training_iteration,episode_return_mean\n1," + b"9" * 200_000 + b"\n"),
                       ("good", b"num_env_steps_sampled_lifetime,episode_return_mean\n100,1.5\n200,2.5\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "progress.csv").write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="herdrl"):
        runs = read_runs(tmp_path, "episode_return_mean", None)
    assert [run.path.parent.name for run in runs] == ["good"] and list(runs[0].y) == [1.5, 2.5]
    assert caplog.text.count("is not a readable progress file") == 2
