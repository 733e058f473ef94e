"""Offline learning: datasets (herdrl's and Minari's), recording, BC and MARWIL."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from herdrl.algorithms.base import Algorithm
from herdrl.cli import main
from herdrl.errors import ConfigError
from herdrl.offline import DatasetError, DatasetWriter, Episode, open_dataset, write_metadata

DICT_OBS = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (3,), np.float32), "mode": gym.spaces.Discrete(4)})
BOX_ACTIONS = gym.spaces.Box(-1, 1, (2,), np.float32)


def random_episodes(count: int, seed: int = 0) -> list[Episode]:
    """Episodes of a Dict observation space and Box actions, with numeric infos (T+1 rows)."""
    rng = np.random.default_rng(seed)
    episodes = []
    for i in range(count):
        steps = 3 + i
        episodes.append(Episode(
            {"pos": rng.uniform(-1, 1, (steps + 1, 3)).astype(np.float32), "mode": rng.integers(0, 4, steps + 1)},
            rng.uniform(-1, 1, (steps, 2)).astype(np.float32), rng.standard_normal(steps),
            np.arange(steps) == steps - 1 if i % 2 == 0 else np.zeros(steps, bool),
            np.zeros(steps, bool) if i % 2 == 0 else np.arange(steps) == steps - 1,
            {"speed": rng.standard_normal(steps + 1), "grid": rng.integers(0, 9, (steps + 1, 2, 2))}))
    return episodes


def assert_same_episode(read: Episode, written: Episode) -> None:
    for key in ("pos", "mode"):
        np.testing.assert_array_equal(read.observations[key], written.observations[key])
    for field in ("actions", "rewards", "terminations", "truncations"):
        np.testing.assert_array_equal(getattr(read, field), getattr(written, field))
    for key, value in written.infos.items():
        np.testing.assert_array_equal(read.infos[key], value)


@pytest.mark.parametrize("data_format", ["arrow", "hdf5", "parquet"])
def test_datasets_written_by_minari_read_field_by_field(tmp_path, monkeypatch, data_format):
    minari = pytest.importorskip("minari")
    from minari.data_collector import EpisodeBuffer

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    written = random_episodes(3)
    buffers = [EpisodeBuffer(id=i, observations=e.observations, actions=e.actions, rewards=e.rewards,
                             terminations=e.terminations, truncations=e.truncations,
                             infos={"speed": e.infos["speed"]}) for i, e in enumerate(written)]
    with pytest.warns(UserWarning):  # (minari: "no env_spec")
        minari.create_dataset_from_buffers(f"test/made{data_format}-v0", buffers, observation_space=DICT_OBS,
                                           action_space=BOX_ACTIONS, data_format=data_format)
    dataset = open_dataset(tmp_path / "test" / f"made{data_format}-v0")
    assert dataset.observation_space == DICT_OBS and dataset.action_space == BOX_ACTIONS
    read = list(dataset.episodes())
    assert [e.id for e in read] == [0, 1, 2]
    for r, w in zip(read, written, strict=True):
        assert_same_episode(r, Episode(w.observations, w.actions, w.rewards, w.terminations, w.truncations,
                                       {"speed": w.infos["speed"]}))
    info = dataset.info()
    assert info["episodes"] == 3 and info["steps"] == 3 + 4 + 5
    assert info["return_mean"] == pytest.approx(np.mean([w.rewards.sum() for w in written]))


@pytest.mark.parametrize("data_format", ["parquet", "arrow"])
def test_datasets_herdrl_writes_read_back_and_in_minari(tmp_path, monkeypatch, data_format):
    written = random_episodes(3)
    writer = DatasetWriter(tmp_path / "test" / "ours-v0", DICT_OBS, BOX_ACTIONS, data_format)
    for episode in written:
        writer.write(episode)
    write_metadata(tmp_path / "test" / "ours-v0", DICT_OBS, BOX_ACTIONS, data_format, dataset_id="test/ours-v0")
    for r, w in zip(open_dataset(tmp_path / "test" / "ours-v0").episodes(), written, strict=True):
        assert_same_episode(r, w)
    minari = pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    theirs = minari.load_dataset("test/ours-v0")
    assert theirs.total_episodes == 3 and theirs.total_steps == 12
    for r, w in zip(theirs.iterate_episodes(), written, strict=True):
        np.testing.assert_array_equal(r.observations["pos"], w.observations["pos"])
        np.testing.assert_array_equal(r.actions, w.actions)
        np.testing.assert_array_equal(r.rewards, w.rewards)
        np.testing.assert_array_equal(r.truncations, w.truncations)
        np.testing.assert_array_equal(r.infos["grid"], w.infos["grid"])


def test_a_dataset_minaris_data_collector_wrote_reads_as_the_episodes_played(tmp_path, monkeypatch):
    """minari.DataCollector (HDF5, as Minari's own tools record) around a real env: every episode reads back as
    played here, step by step (observations with the final one, actions, rewards, terminations, truncations)."""
    minari = pytest.importorskip("minari")
    pytest.importorskip("jax")  # (DataCollector's episode buffers need it: minari[create])

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    env = minari.DataCollector(gym.make("CartPole-v1", max_episode_steps=12), data_format="hdf5")
    rng = np.random.default_rng(0)
    played = []
    for episode in range(3):
        obs, _ = env.reset(seed=episode)
        steps = {"obs": [obs], "actions": [], "rewards": [], "terminations": [], "truncations": []}
        done = False
        while not done:
            action = int(rng.integers(2))
            obs, reward, terminated, truncated, _ = env.step(action)
            for key, value in zip(("obs", "actions", "rewards", "terminations", "truncations"),
                                  (obs, action, reward, terminated, truncated), strict=True):
                steps[key].append(value)
            done = terminated or truncated
        played.append(steps)
    with pytest.warns(UserWarning):  # (minari: no description, no eval env)
        env.create_dataset("test/collected-v0", algorithm_name="random")
    env.close()
    dataset = open_dataset(tmp_path / "test" / "collected-v0")
    assert dataset.data_format == "hdf5"
    read = list(dataset.episodes())
    assert len(read) == 3 and any(p["truncations"][-1] for p in played) and any(p["terminations"][-1] for p in played)
    for episode, steps in zip(read, played, strict=True):
        np.testing.assert_array_equal(episode.observations, np.asarray(steps["obs"]))
        for field in ("actions", "rewards", "terminations", "truncations"):
            np.testing.assert_array_equal(getattr(episode, field), np.asarray(steps[field]))


def _write_one(path, episode, obs_space=DICT_OBS, action_space=BOX_ACTIONS):
    DatasetWriter(path, obs_space, action_space).write(episode)


def test_bad_episodes_and_datasets_are_refused_in_one_line(tmp_path):
    good = random_episodes(1)[0]
    nan_obs = {**good.observations, "pos": good.observations["pos"].copy()}
    nan_obs["pos"][2, 1] = np.nan
    cases = {
        r"episode 0 observations.pos holds a NaN or infinity \(row 2\)": Episode(
            nan_obs, good.actions, good.rewards, good.terminations, good.truncations),
        r"actions has shape \(3, 3\)": Episode(good.observations, np.zeros((3, 3), np.float32), good.rewards,
                                              good.terminations, good.truncations),
        "observations.mode holds values outside": Episode({**good.observations, "mode": np.full(4, 7)},
                                                          good.actions, good.rewards, good.terminations,
                                                          good.truncations),
        "ends before its last step": Episode(good.observations, good.actions, good.rewards,
                                             np.array([True, False, False]), good.truncations),
        "rewards hold a NaN": Episode(good.observations, good.actions, np.array([0.0, np.inf, 1.0]),
                                      good.terminations, good.truncations),
    }
    for message, episode in cases.items():
        with pytest.raises(DatasetError, match=message) as caught:
            _write_one(tmp_path / "w", episode)
        assert "\n" not in str(caught.value)
    # Pixels given as floats would wrap when cast to uint8: refused instead.
    frames = gym.spaces.Box(0, 255, (4, 2), np.uint8)
    for value, message in ((300.0, "values outside"), (-1.0, "values outside"), (2.5, "fractions")):
        pixels = np.zeros((4, 4, 2), np.float32)
        pixels[1, 0, 0] = value
        with pytest.raises(DatasetError, match=f"episode 0 observations holds {message}"):
            _write_one(tmp_path / "w", Episode(pixels, np.zeros(3, np.int64), np.zeros(3), np.zeros(3, bool),
                                               np.array([False, False, True])), frames, gym.spaces.Discrete(2))
    # Each space of whole numbers is checked against its own bounds (a start, per-element sizes), fractions refused.
    from herdrl.offline.dataset import check_leaf

    shifted, multi = gym.spaces.Discrete(3, start=-1), gym.spaces.MultiDiscrete([2, 3], start=[1, 0])
    for space, values in ((shifted, [-1, 1.0]), (multi, [[1, 0], [2, 2]]), (gym.spaces.MultiBinary(2), [[0, 1]])):
        np.testing.assert_array_equal(check_leaf(space, values, len(values), "a"), np.asarray(values, space.dtype))
    for space, values, message in ((shifted, [-2], "outside"), (shifted, [2], "outside"), (shifted, [0.5], "fractions"),
                                   (multi, [[0, 0]], "outside"), (multi, [[1, 3]], "outside"),
                                   (multi, [[1.5, 0]], "fractions"), (gym.spaces.MultiBinary(2), [[0, 2]], "outside")):
        with pytest.raises(DatasetError, match=f"a holds (values )?{message}"):
            check_leaf(space, values, len(values), "a")
    # A file crafted by hand (bypassing the writer) is refused when read, naming the episode.
    _write_one(tmp_path / "d", good)
    write_metadata(tmp_path / "d", DICT_OBS, BOX_ACTIONS)
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "d" / "data" / "0" / "part-0.parquet")
    rewards = table.column("rewards").to_numpy().copy()
    rewards[1] = np.nan
    pq.write_table(table.set_column(table.column_names.index("rewards"), "rewards", pa.array(rewards)),
                   tmp_path / "d" / "data" / "0" / "part-0.parquet")
    with pytest.raises(DatasetError, match="episode 0 rewards hold a NaN or infinity"):
        list(open_dataset(tmp_path / "d").episodes())
    meta = json.loads((tmp_path / "d" / "data" / "metadata.json").read_text())
    (tmp_path / "d" / "data" / "metadata.json").write_text(json.dumps({**meta, "action_space": '{"type": "Graph"}'}))
    with pytest.raises(DatasetError, match="action_space has type 'Graph'"):
        open_dataset(tmp_path / "d")
    with pytest.raises(DatasetError, match="not a dataset"):
        open_dataset(tmp_path / "nothing")
    with pytest.raises(DatasetError, match="cannot record a Text space"):
        DatasetWriter(tmp_path / "t", gym.spaces.Text(5), BOX_ACTIONS)


def cartpole_expert(obs: np.ndarray) -> int:
    """A hand-written CartPole controller (push towards where the pole falls): 500 on every seed tried."""
    return int(obs[2] + 0.5 * obs[3] > 0)


def record_expert(path, episodes: int, seed: int = 0) -> None:
    from herdrl.offline.record import record_controller

    record_controller(cartpole_expert, "CartPole-v1", path, episodes, seed)


def train_until_solved(algo, tries: int) -> dict:
    """Train until greedy evaluation reaches 475 (CartPole solved), at most ``tries`` iterations; the last row."""
    for _ in range(tries):
        result = algo.train()
        if result["evaluation/episode_return_mean"] >= 475:
            break
    return result


def test_bc_learns_a_small_expert_dataset_in_seconds(tmp_path):
    from herdrl.algorithms.bc import BCConfig

    record_expert(tmp_path / "expert", 4)
    algo = (BCConfig().offline_data(input_=str(tmp_path / "expert")).environment("CartPole-v1")
            .training(updates_per_iteration=400).debugging(seed=0).build())
    result = train_until_solved(algo, 4)
    algo.stop()
    assert result["evaluation/episode_return_mean"] >= 475, result["evaluation/episode_return_mean"]
    assert result["dataset/transitions"] == 2000 and result["num_env_steps_sampled_lifetime"] == 0


def test_marwil_loss_on_a_fixed_batch_matches_a_hand_computation(tmp_path):
    """Weights exp(beta * (R - V) / sqrt(c)) on log-probabilities from a hand-written softmax, a halved squared
    value error, and the running mean c updated from the batch's squared advantages before it is used; R is the
    reward-to-go plus, the expert's episode being truncated at 500 steps, gamma^(500 - t) times the value of the
    observation it stopped at (read from the dataset here)."""
    from herdrl.algorithms.marwil import MARWILConfig

    record_expert(tmp_path / "expert", 1)
    config = (MARWILConfig().offline_data(input_=str(tmp_path / "expert"))
              .training(beta=0.7, vf_coeff=0.3, moving_average_sqd_adv_norm_start=4.0,
                        moving_average_sqd_adv_norm_update_rate=0.1).debugging(seed=1))
    algo = config.build()
    learner = algo.learner
    batch = algo.draw(64)
    torch_batch = {k: torch.as_tensor(v) for k, v in batch.items()}
    loss, stats = learner.loss(torch_batch)
    (episode,) = open_dataset(tmp_path / "expert").episodes()
    assert episode.truncations[-1] and not episode.terminations.any()
    steps = 500
    with torch.no_grad():
        logits, values = learner.module(torch_batch["obs"])
        logp = torch.log_softmax(logits, -1)[torch.arange(64), torch_batch["actions"]].numpy()
        values = values.numpy()
        _, tail_value = learner.module(torch.as_tensor(episode.observations[-1:], dtype=torch.float32))
    # The rows' own reward-to-go (CartPole pays 1 a step) tells each row's step t: 0.99^(500 - t) = 1 - 0.01 R.
    tail_discount = 1 - 0.01 * batch["returns"].astype(np.float64)
    advantages = batch["returns"] + tail_discount * float(tail_value[0]) - values
    c = 4.0 + 0.1 * (np.mean(advantages ** 2) - 4.0)
    weights = np.exp(0.7 * advantages / np.sqrt(c))
    expected = -np.mean(weights * logp) + 0.3 * 0.5 * np.mean(advantages ** 2)
    assert abs(float(tail_value[0])) > 0.01  # (the bootstrap moves the advantages)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-4)
    assert float(stats["sqd_adv_norm"]) == pytest.approx(c, rel=1e-5)
    # Weights are capped at max_weight (100): a normaliser putting an advantage of median size at the cap, and a tiny
    # one, which would overflow exp to inf (then NaN weights) without the cap.
    for norm in (0.7 * np.median(np.abs(advantages)) / np.log(100), 1e-3):
        learner.sqd_adv_norm = torch.tensor(norm**2)
        with torch.no_grad():  # (no running-mean update outside training)
            capped, _ = learner.loss(torch_batch)
        weights = np.minimum(np.exp(np.minimum(0.7 * advantages / norm, 50.0)), 100.0)
        assert (weights == 100).any() and ((weights < 100).any() or norm == 1e-3)
        expected = -np.mean(weights * logp) + 0.3 * 0.5 * np.mean(advantages ** 2)
        assert float(capped) == pytest.approx(expected, rel=1e-4)
    # The returns are each step's discounted reward-to-go inside its episode (rewards all 1 in CartPole).
    to_go = (1 - 0.99 ** np.arange(steps, 0, -1)) / (1 - 0.99)
    np.testing.assert_allclose(np.sort(algo.reader.transitions["returns"]), np.sort(to_go), rtol=1e-5)
    algo.stop()


def test_marwil_does_not_bootstrap_an_episode_that_terminated(tmp_path):
    """Rows of a terminated episode carry a zero tail discount (their return is the reward-to-go alone); a
    truncated one's go on from its last observation, gamma^(T - t) from step t."""
    from herdrl.offline.dataset import to_transitions

    episodes = random_episodes(2)  # episode 0 terminates after 3 steps, episode 1 is truncated after 4
    rows = to_transitions(episodes, DICT_OBS, BOX_ACTIONS, 0.9, tails=True)
    np.testing.assert_array_equal(rows["tail_discounts"][:3], 0.0)
    np.testing.assert_allclose(rows["tail_discounts"][3:], 0.9 ** np.arange(4, 0, -1), rtol=1e-6)
    np.testing.assert_array_equal(rows["tail_obs"]["pos"][3:], np.repeat(episodes[1].observations["pos"][-1:], 4, 0))
    assert "tail_obs" not in to_transitions(episodes, DICT_OBS, BOX_ACTIONS, 0.9)


def test_rows_streamed_by_ray_data_carry_their_episodes_tails(tmp_path, ray_session):
    """Streamed, shuffled rows keep the tail of the episode they came from: a truncated episode's last
    observation and gamma^(T - t), zeros in a terminated one (rows tell their episode and step by their obs); a
    learner rank's stream normalises every observation with the statistics its spec carries."""
    from herdrl.offline.reader import StreamSpec

    space, actions = gym.spaces.Box(-1, 50, (2,), np.float32), gym.spaces.Discrete(2)
    writer = DatasetWriter(tmp_path / "tails", space, actions)
    lengths = [3, 5, 4, 6]
    for i, steps in enumerate(lengths):  # even episodes terminate, odd ones are truncated
        obs = np.stack([np.full(steps + 1, i), np.arange(steps + 1)], 1).astype(np.float32)
        ends = np.arange(steps) == steps - 1
        writer.write(Episode(obs, np.zeros(steps, np.int64), np.ones(steps), ends & (i % 2 == 0),
                             ends & (i % 2 == 1)))
    write_metadata(tmp_path / "tails", space, actions)
    stats = {"obs/count": np.array(9.0), "obs/mean": np.array([1.0, 2.0]), "obs/m2": np.array([36.0, 9.0])}
    spec = StreamSpec(str(tmp_path / "tails"), 0.5, 0, 6, 6, tails=True, filter_state=stats, clip_obs=100.0)
    reader, transitions = spec.open(0, 1)  # a learner rank's stream, normalising with the run's statistics
    rows = reader.draw(sum(lengths))
    reader.stop()
    assert transitions == sum(lengths)
    for key in ("obs", "next_obs", "tail_obs"):  # (std 2 and 1: every observation shifted and scaled)
        rows[key] = rows[key] * np.sqrt([4.0, 1.0]) + [1.0, 2.0]
    rows["obs"] = np.round(rows["obs"], 4)
    np.testing.assert_allclose(rows["next_obs"], rows["obs"] + [0, 1], atol=1e-4)
    episode, step = rows["obs"][:, 0].astype(int), rows["obs"][:, 1].astype(int)
    assert sorted(zip(episode.tolist(), step.tolist(), strict=True)) == [(i, t) for i, n in enumerate(lengths)
                                                                          for t in range(n)]
    total = np.asarray(lengths)[episode]
    np.testing.assert_allclose(rows["tail_discounts"], np.where(episode % 2 == 1, 0.5 ** (total - step), 0.0))
    np.testing.assert_allclose(rows["tail_obs"], np.stack([episode, total], 1), atol=1e-4)


def test_an_offline_run_normalises_observations_with_the_datasets_statistics(tmp_path):
    """observation_filter='MeanStdFilter' offline: the statistics are the mean and variance of every observation
    the dataset holds (numpy here), fixed for the run; batches come normalised by them; BC learns CartPole with
    them and evaluates in the env; the checkpoint's policy and its export take raw observations (evaluation on
    runners: test_evaluation_runners_act_with_the_runs_statistics_and_add_nothing_to_them)."""
    from herdrl.algorithms.bc import BCConfig
    from herdrl.export import export_policy
    from herdrl.policy import Policy

    record_expert(tmp_path / "expert", 4)
    every = np.concatenate([e.observations for e in open_dataset(tmp_path / "expert").episodes()]).astype(np.float64)
    mean, std = every.mean(0), np.sqrt(every.var(0) + 1e-8)
    algo = (BCConfig().offline_data(input_=str(tmp_path / "expert")).environment("CartPole-v1")
            .env_runners(observation_filter="MeanStdFilter").training(updates_per_iteration=400)
            .debugging(seed=0).build())
    stats = algo.normalizer.state()
    assert stats["obs/count"] == len(every) == 2004
    np.testing.assert_allclose(stats["obs/mean"], mean, rtol=1e-6)
    np.testing.assert_allclose(stats["obs/m2"] / stats["obs/count"], every.var(0), rtol=1e-6)
    batch = algo.draw(64)
    for key in ("obs", "next_obs"):  # each row, de-normalised, is an observation of the dataset
        raw = batch[key] * std + mean
        assert np.abs(raw[:, None, :] - every[None]).max(-1).min(-1).max() < 1e-4
    result = train_until_solved(algo, 4)
    assert result["evaluation/episode_return_mean"] >= 475, result["evaluation/episode_return_mean"]
    assert algo.normalizer.state()["obs/count"] == len(every)  # fixed: learning adds nothing
    path = algo.save(tmp_path / "ckpt")
    raw_obs = every[::97][:20].astype(np.float32)
    with torch.no_grad():
        expected = algo.module.dist_inputs(torch.as_tensor((raw_obs - mean) / std, dtype=torch.float32))
    expected = expected.argmax(-1).tolist()
    algo.stop()
    assert Policy.from_checkpoint(path).compute_actions(raw_obs).tolist() == expected
    program = torch.export.load(export_policy(path, "torch-export", tmp_path / "bc.pt2")).module()
    assert program(torch.as_tensor(raw_obs)).tolist() == expected


def test_a_bc_run_resumes_with_its_step_count_and_the_lr_it_is_given(tmp_path):
    from herdrl.algorithms.bc import BCConfig

    record_expert(tmp_path / "expert", 1)
    config = (BCConfig().offline_data(input_=str(tmp_path / "expert")).training(updates_per_iteration=20)
              .debugging(seed=0))
    algo = config.build()
    algo.train()
    path = algo.save(tmp_path / "checkpoint_000001")
    algo.stop()
    moved = {}
    for lr in (1e-9, 1e-2):
        resumed = Algorithm.from_checkpoint(path, lr=lr)
        assert resumed.gradient_steps_lifetime == 20
        before = {k: v.copy() for k, v in resumed.get_weights().items()}
        row = resumed.train()
        assert row["num_gradient_updates_lifetime"] == 40 and row["lr"] == lr
        moved[lr] = max(float(np.abs(v - before[k]).max()) for k, v in resumed.get_weights().items())
        resumed.stop()
    assert moved[1e-9] < 1e-6 < 1e-3 < moved[1e-2], moved


def test_offline_configs_refuse_what_they_cannot_do_in_one_line(tmp_path):
    from herdrl.algorithms.bc import BCConfig
    from herdrl.algorithms.ppo import PPOConfig

    with pytest.raises(ConfigError, match="PPO learns from an env"):
        PPOConfig().offline_data(input_="x")
    with pytest.raises(ConfigError, match="learns from a dataset: set .offline_data"):
        BCConfig().environment("CartPole-v1").build()
    record_expert(tmp_path / "expert", 1)
    with pytest.raises(ConfigError, match="evaluation_interval needs an env"):
        BCConfig().offline_data(input_=str(tmp_path / "expert")).evaluation(evaluation_interval=2).build()
    with pytest.raises(DatasetError, match="observation space .* is not the env's"):
        BCConfig().offline_data(input_=str(tmp_path / "expert")).environment("Pendulum-v1").build()
    with pytest.raises(ConfigError, match="BC has beta=0"):
        BCConfig().offline_data(input_=str(tmp_path / "expert")).training(beta=1.0).build()
    with pytest.raises(ConfigError, match="num_learners=3 is more than train_batch_size=2"):
        BCConfig().offline_data(input_=str(tmp_path / "expert")).training(train_batch_size=2).learners(
            num_learners=3).validate()


def test_jpeg_images_decode_and_other_image_formats_are_refused():
    """Minari's JPEG-encoded frames decode; a cell holding another format (Pillow has decoders that call external
    programs) is refused in one line rather than decoded."""
    from PIL import Image

    from herdrl.offline.dataset import _jpeg_frames

    frame = np.zeros((32, 32, 3), np.uint8)
    frame[8:24, 8:24] = 200
    blobs = {}
    for kind in ("JPEG", "PNG"):
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format=kind)
        blobs[kind] = buffer.getvalue()
    decoded = _jpeg_frames([blobs["JPEG"]], (32, 32, 3))
    assert decoded.shape == (1, 32, 32, 3) and np.abs(decoded[0].astype(int) - frame).max() < 16  # (lossy)
    with pytest.raises(DatasetError, match="is not a readable JPEG"):
        _jpeg_frames([blobs["JPEG"], blobs["PNG"]], (32, 32, 3))
    # A crafted header claiming 6,000x8,000 pixels (~144 MB decoded) is refused from its header, before decoding
    # (decoding it would allocate the image, then fail on the missing data with another message).
    start = blobs["JPEG"].index(b"\xff\xc0") + 5  # SOF0: marker, length (2), precision (1), height (2), width (2)
    huge = blobs["JPEG"][:start] + (6000).to_bytes(2, "big") + (8000).to_bytes(2, "big") + blobs["JPEG"][start + 4:]
    assert Image.open(io.BytesIO(huge)).size == (8000, 6000)
    with pytest.raises(DatasetError, match="is 6000x8000; its space needs 32x32"):
        _jpeg_frames([blobs["JPEG"], huge], (32, 32, 3))


def test_an_env_whose_action_bounds_differ_from_the_datasets_is_refused(tmp_path):
    """CQL's and IQL's actors scale actions to the dataset's Box bounds: an env taking other units is refused."""
    from herdrl.offline.source import check_spaces

    pendulum = gym.make("Pendulum-v1")
    rng = np.random.default_rng(0)
    for high in (2.0, 1.0):
        actions = gym.spaces.Box(-high, high, (1,), np.float32)
        episode = Episode(rng.uniform(-1, 1, (4, 3)).astype(np.float32), rng.uniform(-1, 1, (3, 1)).astype(np.float32),
                          np.zeros(3), np.zeros(3, bool), np.array([False, False, True]))
        _write_one(tmp_path / str(high), episode, pendulum.observation_space, actions)
        write_metadata(tmp_path / str(high), pendulum.observation_space, actions)
    check_spaces(open_dataset(tmp_path / "2.0"), "Pendulum-v1", {})  # Pendulum's own bounds: taken
    with pytest.raises(DatasetError, match=r"action space Box\(-1.0, 1.0, \(1,\), float32\) is not the env's"):
        check_spaces(open_dataset(tmp_path / "1.0"), "Pendulum-v1", {})
    # A MultiDiscrete's start is its units too: actions are stored from 0 and shifted back by the env's start.
    from herdrl.offline.source import _same_space

    shifted = gym.spaces.MultiDiscrete([2, 3], start=[1, 0])
    assert _same_space(shifted, gym.spaces.MultiDiscrete([2, 3], start=[1, 0]))
    assert not _same_space(shifted, gym.spaces.MultiDiscrete([2, 3]))
    assert not _same_space(shifted, gym.spaces.MultiDiscrete([2, 4], start=[1, 0]))


def test_bc_reads_tuple_actions_from_episodes_of_different_lengths(tmp_path):
    """A nested Tuple(Discrete, Tuple(Discrete, Box)) action dataset: each row's stored action is [the discrete
    parts, the Box part], in the episodes' order, and BC trains on it."""
    from herdrl.algorithms.bc import BCConfig
    from herdrl.offline.reader import episode_transitions

    obs_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    inner = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-1, 1, (2,), np.float32)))
    action_space = gym.spaces.Tuple((gym.spaces.Discrete(3), inner))
    rng = np.random.default_rng(0)
    writer, episodes = DatasetWriter(tmp_path / "tuple", obs_space, action_space), []
    for steps in (3, 5):
        episodes.append(Episode(rng.uniform(-1, 1, (steps + 1, 2)).astype(np.float32),
                                (rng.integers(0, 3, steps),
                                 (rng.integers(0, 2, steps), rng.uniform(-1, 1, (steps, 2)).astype(np.float32))),
                                np.ones(steps), np.arange(steps) == steps - 1, np.zeros(steps, bool)))
        writer.write(episodes[-1])
    write_metadata(tmp_path / "tuple", obs_space, action_space)
    rows = episode_transitions(list(open_dataset(tmp_path / "tuple").episodes()), obs_space, action_space, 0.99)
    by_hand = np.concatenate([np.column_stack([e.actions[0], *e.actions[1]]) for e in episodes])
    np.testing.assert_array_equal(rows["actions"], by_hand.astype(rows["actions"].dtype))
    algo = (BCConfig().offline_data(input_=str(tmp_path / "tuple"))
            .training(updates_per_iteration=5, train_batch_size=4).debugging(seed=0).build())
    result = algo.train()
    assert result["dataset/transitions"] == 8 and np.isfinite(result["policy_loss"]), result
    algo.stop()


def test_herd_record_writes_what_the_policy_plays_and_herd_data_info_sums_it(tmp_path, capsys):
    """Every field recorded equals an independent replay of the recorded actions on the env from the same seeds;
    greedy actions are the policy's own; two Ray runners write the same episodes as one process."""
    from herdrl.algorithms.ppo import PPOConfig
    from herdrl.policy import Policy

    algo = (PPOConfig().environment("Pendulum-v1").debugging(seed=0)
            .training(train_batch_size=200, minibatch_size=50).build())
    algo.train()
    checkpoint = algo.save(tmp_path / "checkpoint_000001")
    algo.stop()
    out = tmp_path / "data"
    assert main(["record", str(checkpoint), "--episodes", "3", "--out", str(out), "--seed", "5", "--explore"]) == 0
    printed = capsys.readouterr().out
    assert "episodes      3    steps 600" in printed and "Pendulum-v1" in printed
    policy = Policy.from_checkpoint(checkpoint)
    env = gym.make("Pendulum-v1")
    read = list(open_dataset(out).episodes())
    for i, episode in enumerate(read):
        obs, _ = env.reset(seed=5 + i)
        assert np.array_equal(episode.observations[0], obs)
        for t in range(len(episode)):
            np.testing.assert_allclose(episode.observations[t], obs)
            obs, reward, terminated, truncated, _ = env.step(episode.actions[t])  # the recorded action, replayed
            assert episode.rewards[t] == pytest.approx(reward) and episode.terminations[t] == terminated
            assert episode.truncations[t] == truncated
        np.testing.assert_allclose(episode.observations[-1], obs)
    greedy = tmp_path / "greedy"
    assert main(["record", str(checkpoint), "--episodes", "1", "--out", str(greedy), "--seed", "5"]) == 0
    episode = next(open_dataset(greedy).episodes())
    expected = np.stack([policy.compute_single_action(o) for o in episode.observations[:-1]])
    np.testing.assert_allclose(episode.actions, expected, rtol=1e-6)  # greedy: the policy's own actions
    assert main(["record", str(checkpoint), "--episodes", "3", "--out", str(tmp_path / "two"), "--seed", "5",
                 "--explore", "--num-runners", "2"]) == 0
    two = list(open_dataset(tmp_path / "two").episodes())
    assert [e.id for e in two] == [0, 1, 2]
    for a, b in zip(two, read, strict=True):  # each episode's resets and noise seeded by its own index
        np.testing.assert_array_equal(a.observations, b.observations)
        np.testing.assert_array_equal(a.actions, b.actions)
    capsys.readouterr()
    assert main(["record", str(checkpoint), "--episodes", "1", "--out", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert main(["data", "info", str(tmp_path / "missing")]) == 2
    assert "not a dataset" in capsys.readouterr().err


def test_herd_train_bc_without_an_env_names_the_run_after_its_dataset(tmp_path, capsys):
    record_expert(tmp_path / "expert", 1)
    code = main(["train", "bc", "--input", str(tmp_path / "expert"), "--stop-iters", "1", "--output",
                 str(tmp_path / "results"), "--no-tensorboard", "--config", "updates_per_iteration=10"])
    assert code == 0
    out = capsys.readouterr().out
    assert "after 10 gradient steps" in out
    assert f"BC on the dataset {tmp_path / 'expert'}: results in" in out and " on None" not in out
    trials = list((tmp_path / "results" / "expert").iterdir())
    assert len(trials) == 1 and trials[0].name.startswith("BC_expert_")
    assert main(["export", str(trials[0]), "--format", "onnx", "--out", str(tmp_path / "bc.onnx")]) == 0
    assert os.path.getsize(tmp_path / "bc.onnx") > 0


def test_discrete_cql_learns_cartpole_from_expert_data_and_its_penalty_is_the_exact_logsumexp(tmp_path):
    from herdrl.algorithms.cql import CQLConfig, DiscreteCQLLearner

    record_expert(tmp_path / "expert", 4)
    algo = (CQLConfig().offline_data(input_=str(tmp_path / "expert")).environment("CartPole-v1")
            .training(updates_per_iteration=500, target_network_update_freq=500, min_q_weight=2.0,
                      model={"fcnet_hiddens": [64, 64]}).debugging(seed=0).build())
    assert isinstance(algo.learner, DiscreteCQLLearner)
    batch = {k: torch.as_tensor(v) for k, v in algo.draw(32).items()}
    batch["weights"] = torch.ones(32)
    with torch.no_grad():
        for p in algo.learner.target.parameters():  # a target network unlike the online one
            p.add_(0.1 * torch.randn_like(p))
        loss, stats = algo.learner.loss(batch)
        q = algo.learner.module(batch["obs"]).numpy().astype(np.float64)
        q_next_online = algo.learner.module(batch["next_obs"]).numpy()
        q_next_target = algo.learner.target(batch["next_obs"]).numpy().astype(np.float64)
    rows, actions = np.arange(32), batch["actions"].numpy()
    logsumexp = np.log(np.exp(q).sum(axis=1))
    penalty = np.mean(logsumexp - q[rows, actions])
    # Double DQN: the online network picks s' action, the target network scores it; Huber loss (delta 1).
    target = batch["rewards"].numpy() + batch["discounts"].numpy() * q_next_target[rows, q_next_online.argmax(1)]
    error = np.abs(q[rows, actions] - target)
    huber = np.mean(np.where(error < 1, 0.5 * error ** 2, error - 0.5))
    assert float(stats["cql_loss"]) == pytest.approx(penalty, rel=1e-5)
    assert float(loss) == pytest.approx(huber + 2.0 * penalty, rel=1e-4)
    returns = []
    for _ in range(5):
        returns.append(algo.train()["evaluation/episode_return_mean"])
        if returns[-1] >= 475:
            break
    algo.stop()
    assert returns[-1] >= 475, returns


def pendulum_dataset(path, episodes: int = 4, seed: int = 0) -> None:
    """Pendulum episodes of a noisy hand-written swing-up controller (pump energy, then a PD hold near the top:
    about -800 a episode without the noise), its actions often on the bounds."""
    from herdrl.offline.record import record_controller

    rng = np.random.default_rng(seed)

    def controller(obs: np.ndarray) -> np.ndarray:
        angle, speed = np.arctan2(obs[1], obs[0]), obs[2]
        torque = -(10 * angle + 2 * speed) if obs[0] > 0.85 else 2.0 * (np.sign(speed) or 1.0)
        return np.clip([torque + rng.normal(0, 0.3)], -2, 2).astype(np.float32)

    record_controller(controller, "Pendulum-v1", path, episodes, seed)


def test_bc_loss_on_box_actions_is_the_gaussian_negative_log_likelihood(tmp_path):
    """BC on Box actions (Pendulum's, on and off the bounds): minus the mean log-density of each recorded action
    under N(mean(s), exp(log_std)), summed over action dimensions, from torch.distributions."""
    from herdrl.algorithms.bc import BCConfig

    pendulum_dataset(tmp_path / "pendulum", 1)
    algo = BCConfig().offline_data(input_=str(tmp_path / "pendulum")).debugging(seed=0).build()
    learner = algo.learner
    batch = {k: torch.as_tensor(v) for k, v in algo.draw(32).items()}
    with torch.no_grad():
        learner.module.log_std.fill_(-0.3)
        loss, _ = learner.loss(batch)
        mean = learner.module.pi_head(learner.module.pi_encoder(batch["obs"]))
        normal = torch.distributions.Normal(mean, torch.full_like(mean, np.exp(-0.3)))
        expected = -normal.log_prob(batch["actions"].reshape(mean.shape)).sum(-1).mean()
    algo.stop()
    assert (batch["actions"].abs() == 2).any() and (batch["actions"].abs() < 2).any()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)


def test_continuous_cql_estimates_the_log_integral_of_exp_q_over_the_action_box(tmp_path):
    """Critics made blind to the action (Q(s, a) = f(s), f far from constant across states): the integral of
    exp(Q(s, .)) over the squashed box [-1, 1]^d is 2^d exp(f(s)), so per critic the penalty (an importance-sampled
    logsumexp over 3n actions, minus Q(s, a_data)) is log(3n) + d log 2 - for any f, only if every sample (those
    drawn at s' too) is scored at s and the dataset's action is subtracted at s. The batch's next states are
    shuffled so that f(s') is far from f(s)."""
    from herdrl.algorithms.cql import CQLConfig, CQLLearner

    pendulum_dataset(tmp_path / "pendulum", 1)
    n, d = 2000, 1
    algo = (CQLConfig().offline_data(input_=str(tmp_path / "pendulum"))
            .training(num_actions=n, model={"fcnet_hiddens": [16]}).debugging(seed=0).build())
    learner = algo.learner
    assert isinstance(learner, CQLLearner)
    with torch.no_grad():
        for critic in (learner.module.q1, learner.module.q2):
            critic.mlp[0].weight[:, -d:] = 0.0  # blind to the action (its columns come last)
            critic.head.weight.mul_(20.0)  # and far from constant across states
    batch = {k: torch.as_tensor(v) for k, v in algo.draw(8).items()}
    batch["next_obs"] = batch["next_obs"][torch.randperm(8)]
    with torch.no_grad():
        spread = float(learner.module.q1(batch["next_obs"], batch["actions"]).sub(
            learner.module.q1(batch["obs"], batch["actions"])).abs().mean())
        penalty = float(learner.conservative_penalty(batch))
    expected = 2 * (np.log(3 * n) + d * np.log(2.0))
    algo.stop()
    assert spread > 1.0, spread  # (scoring s' samples at s' would be far off)
    assert penalty == pytest.approx(expected, rel=0.03), (penalty, expected)


def test_continuous_cql_penalty_with_critics_that_read_the_action_matches_a_hand_computation(tmp_path):
    """Critics that depend on the action; the actor's samples at s and at s' fixed (different actions, different
    log-probabilities) and the uniform draws replayed from the seed: per critic, the mean over states of
    logsumexp(Q(s, u) + d log 2, Q(s, a_s) - log pi(a_s), Q(s, a_s') - log pi(a_s')) - Q(s, a_data), every
    critic called here on the [-1, 1] action by hand, summed over the two critics."""
    from herdrl.algorithms.cql import CQLConfig

    pendulum_dataset(tmp_path / "pendulum", 1)
    rows, n = 8, 3
    algo = (CQLConfig().offline_data(input_=str(tmp_path / "pendulum"))
            .training(num_actions=n, model={"fcnet_hiddens": [16]}).debugging(seed=0).build())
    learner, module = algo.learner, algo.learner.module
    batch = {k: torch.as_tensor(v) for k, v in algo.draw(rows).items()}
    rng = torch.Generator().manual_seed(2)
    at_s, at_next = (torch.rand(rows * n, 1, generator=rng) * 4 - 2 for _ in range(2))  # env units, [-2, 2]
    logp_s, logp_next = torch.rand(rows * n, generator=rng) * 2, torch.rand(rows * n, generator=rng) * 2 - 3
    module.sample_n = lambda obs, k: (at_s, logp_s) if obs is batch["obs"] else (at_next, logp_next)
    with torch.no_grad():
        for critic in (module.q1, module.q2):
            critic.mlp[0].weight[:, -1:] *= 30.0  # Q far from flat in the action
        torch.manual_seed(7)
        penalty = float(learner.conservative_penalty(batch))
        torch.manual_seed(7)
        uniform = torch.rand(rows * n, 1) * 2 - 1  # the penalty's draws, in [-1, 1] units
        obs = batch["obs"].repeat_interleave(n, dim=0)
        expected = 0.0
        for critic in (module.q1, module.q2):
            scores = torch.cat([(critic(obs, uniform) + np.log(2.0)).view(rows, n),
                                (critic(obs, at_s / 2) - logp_s).view(rows, n),
                                (critic(obs, at_next / 2) - logp_next).view(rows, n)], dim=1)
            expected += float((torch.logsumexp(scores, 1) - critic(batch["obs"], batch["actions"] / 2)).mean())
        spread = float(module.q1(obs, at_s / 2).std())
    algo.stop()
    assert spread > 1.0, spread  # (the action matters to the critics)
    assert penalty == pytest.approx(expected, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("deterministic", [True, False])
def test_continuous_cqls_critics_back_up_min_q_and_the_entropy_term_only_when_asked(tmp_path, deterministic):
    """Each critic's target and loss against a hand computation, the actor's next action and its log-probability
    fixed: r + discount * min(target Q1, target Q2)(s', a'), minus discount * alpha * log pi(a'|s') only with
    ``deterministic_backup=False`` (the CQL paper's Equation 3, as its code and RLlib, backs up min Q alone)."""
    from herdrl.algorithms.cql import CQLConfig

    pendulum_dataset(tmp_path / "pendulum", 1)
    algo = (CQLConfig().offline_data(input_=str(tmp_path / "pendulum"))
            .training(deterministic_backup=deterministic, model={"fcnet_hiddens": [16]}).debugging(seed=0).build())
    learner = algo.learner
    batch = {k: torch.as_tensor(v) for k, v in algo.draw(8).items()}
    batch["discounts"] = torch.linspace(0.5, 0.99, 8)  # (one per row, so a wrong pairing shows)
    batch["discounts"][3] = 0.0  # a terminated step backs up its reward alone
    batch["weights"] = torch.ones(8)
    rng = torch.Generator().manual_seed(1)
    next_action, next_logp = torch.rand(8, 1, generator=rng) * 4 - 2, torch.rand(8, generator=rng) * 3 + 1
    learner.module.sample = lambda obs: (next_action, next_logp)
    alpha = torch.tensor(0.7)
    box = gym.make("Pendulum-v1").action_space
    half, centre = torch.as_tensor((box.high - box.low) / 2), torch.as_tensor((box.high + box.low) / 2)
    with torch.no_grad():
        # Independent of the module's own q_values: each critic called on the [-1, 1] action by hand.
        unit = (next_action - centre) / half
        # The target critics level on average, so that each is the lower one on some rows.
        learner.target.q2.head.bias -= (learner.target.q2(batch["next_obs"], unit)
                                        - learner.target.q1(batch["next_obs"], unit)).mean()
        tq1, tq2 = learner.target.q1(batch["next_obs"], unit), learner.target.q2(batch["next_obs"], unit)
        q1 = learner.module.q1(batch["obs"], (batch["actions"] - centre) / half)
        q2 = learner.module.q2(batch["obs"], (batch["actions"] - centre) / half)
        loss, stats = learner._critic_loss(batch, alpha)
        penalty = learner.config.penalty_weight(False) * float(learner._penalty)
    algo.stop()
    assert not torch.allclose(torch.min(tq1, tq2), tq1)  # (so "Q1 alone" cannot pass)
    expected = batch["rewards"] + batch["discounts"] * (torch.min(tq1, tq2) - (0.0 if deterministic else
                                                                               alpha * next_logp))
    torch.testing.assert_close(stats["td_error"] + q1, expected, rtol=1e-5, atol=1e-5)
    by_hand = (q1 - expected).pow(2).mean() + (q2 - expected).pow(2).mean()
    assert float(loss) - penalty == pytest.approx(float(by_hand), rel=1e-4, abs=1e-4)


def test_continuous_cql_backs_up_at_the_actors_mean_action_when_asked(tmp_path):
    """``backup_action='mean'`` (d3rlpy's backup): each target is r + discount * min target Q at tanh of the actor's
    pre-squash mean at s', scaled to the env's bounds, computed here from the actor's layers by hand; no action is
    sampled. With the soft backup it is refused in one line."""
    from herdrl.algorithms.cql import CQLConfig

    pendulum_dataset(tmp_path / "pendulum", 1)
    config = CQLConfig().offline_data(input_=str(tmp_path / "pendulum")).training(model={"fcnet_hiddens": [16]})
    with pytest.raises(ConfigError, match="backup_action"):
        config.copy().training(backup_action="mean", deterministic_backup=False).validate()
    algo = config.copy().training(backup_action="mean").debugging(seed=0).build()
    learner, module = algo.learner, algo.learner.module
    batch = {k: torch.as_tensor(v) for k, v in algo.draw(8).items()}
    batch["discounts"], batch["weights"] = torch.linspace(0.5, 0.99, 8), torch.ones(8)

    def no_sampling(obs):
        raise AssertionError("the mean backup sampled an action")

    module.sample = no_sampling
    box = gym.make("Pendulum-v1").action_space
    half, centre = torch.as_tensor((box.high - box.low) / 2), torch.as_tensor((box.high + box.low) / 2)
    with torch.no_grad():
        mean = module.pi_head(module.pi_encoder(batch["next_obs"]))[:, :1]  # (mean, log std) per action dim
        # The target critics level on average, so that each is the lower one on some rows.
        learner.target.q2.head.bias -= (learner.target.q2(batch["next_obs"], torch.tanh(mean))
                                        - learner.target.q1(batch["next_obs"], torch.tanh(mean))).mean()
        tq = torch.min(learner.target.q1(batch["next_obs"], torch.tanh(mean)),
                       learner.target.q2(batch["next_obs"], torch.tanh(mean)))
        q1 = module.q1(batch["obs"], (batch["actions"] - centre) / half)
        _, stats = learner._critic_loss(batch, torch.tensor(0.7))
    algo.stop()
    assert not torch.allclose(tq, learner.target.q1(batch["next_obs"], torch.tanh(mean)))
    assert torch.tanh(mean).abs().max() < 0.99  # (not pinned to a bound, where the scaling would not show)
    torch.testing.assert_close(stats["td_error"] + q1, batch["rewards"] + batch["discounts"] * tq, rtol=1e-5,
                               atol=1e-5)


def test_a_cql_checkpoint_from_before_deterministic_backup_keeps_the_soft_backup_or_asks(tmp_path):
    """A continuous CQL checkpoint whose config lacks the key (written before it) loads with SAC's soft backup, as
    it was trained, and restoring it into a run built with the default is refused in one line; one that names the
    key keeps its value; a discrete CQL checkpoint is left alone (the key means nothing there)."""
    from herdrl.algorithms.cql import CQLConfig
    from herdrl.checkpoint import CheckpointError

    pendulum_dataset(tmp_path / "pendulum", 1)
    config = (CQLConfig().offline_data(input_=str(tmp_path / "pendulum"))
              .training(updates_per_iteration=2, model={"fcnet_hiddens": [16]}).debugging(seed=0))
    algo = config.build()
    algo.train()
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    meta_file = path / "checkpoint.json"
    meta = json.loads(meta_file.read_text())
    assert meta["config"]["deterministic_backup"] is True
    restored = Algorithm.from_checkpoint(path)
    assert restored.config.deterministic_backup is True
    restored.stop()
    del meta["config"]["deterministic_backup"]
    meta_file.write_text(json.dumps(meta))
    restored = Algorithm.from_checkpoint(path)
    assert restored.config.deterministic_backup is False and restored.learner.config.deterministic_backup is False
    restored.stop()
    fresh = config.build()
    with pytest.raises(CheckpointError, match="deterministic_backup=False"):
        fresh.restore(path)
    fresh.stop()
    chosen = config.copy().training(deterministic_backup=True).build()
    chosen.restore(path)  # (the user said which)
    chosen.stop()
    discrete = {"action": {"type": "Discrete", "n": 2, "start": 0}}
    assert "deterministic_backup" not in CQLConfig.migrate_checkpoint_config({"lr": 1e-3}, 3, discrete)


def small_iql(data, env: str, updates: int):
    """IQL (expectile 0.8, beta 2, max weight 5) with 64x64 networks on ``data``, evaluated in ``env``."""
    from herdrl.algorithms.iql import IQLConfig

    return (IQLConfig().offline_data(input_=str(data)).environment(env)
            .training(expectile=0.8, beta=2.0, max_weight=5.0, updates_per_iteration=updates,
                      model={"fcnet_hiddens": [64, 64], "fcnet_activation": "relu", "free_log_std": False})
            .evaluation(evaluation_duration=5).debugging(seed=0).build())


def test_iql_losses_on_a_fixed_batch_match_a_hand_computation_and_it_learns(tmp_path):
    pendulum_dataset(tmp_path / "pendulum", 4)
    algo = small_iql(tmp_path / "pendulum", "Pendulum-v1", 400)
    learner = algo.learner
    batch = {k: torch.as_tensor(v) for k, v in algo.draw(64).items()}
    with torch.no_grad():
        value_loss, _ = learner.value_loss(batch)
        actor_loss, _ = learner.actor_loss(batch)
        # Independent of the module's own q_values: each critic called on the [-1, 1] action by hand.
        unit = batch["actions"] / 2.0  # (Pendulum's bounds are +-2)
        q = torch.min(learner.target.q1(batch["obs"], unit), learner.target.q2(batch["obs"], unit)).numpy()
        v = learner.module.value(batch["obs"]).numpy()
        mean, log_std = learner.module.mean_log_std(batch["obs"])
    u = q - v
    expected_value = np.mean(np.where(u < 0, 0.2, 0.8) * u ** 2)
    assert float(value_loss) == pytest.approx(expected_value, rel=1e-5)
    # The actor's log-density of the recorded action (scaled to [-1, 1]) under N(tanh(mean), std), log std >= -5.
    a = batch["actions"].numpy()[:, 0] / 2.0
    mean, log_std = mean.numpy()[:, 0], np.clip(log_std.numpy()[:, 0], -5, 2)
    std = np.exp(log_std)
    logp = -0.5 * ((a - np.tanh(mean)) / std) ** 2 - log_std - 0.5 * np.log(2 * np.pi)
    weights = np.minimum(np.exp(2.0 * u), 5.0)
    assert float(actor_loss) == pytest.approx(-np.mean(weights * logp), rel=1e-4)
    # The critics regress on r + gamma * V(s') (0 after a termination: Pendulum has none, only truncations).
    with torch.no_grad():
        critic_loss, _ = learner.critic_loss(batch)
        q1, q2 = learner.module.q1(batch["obs"], unit), learner.module.q2(batch["obs"], unit)
        v_next = learner.module.value(batch["next_obs"]).numpy()
    assert (batch["discounts"].numpy() == np.float32(0.99)).all()
    target = batch["rewards"].numpy() + 0.99 * v_next
    expected_critic = np.mean((q1.numpy() - target) ** 2) + np.mean((q2.numpy() - target) ** 2)
    assert float(critic_loss) == pytest.approx(expected_critic, rel=1e-5)
    # After a step, every target weight has moved tau (0.005) of the way to the updated network's.
    before = {key: value.clone() for key, value in learner.target.state_dict().items()}
    learner.replay_step({**batch, "weights": torch.ones(64)})
    online = learner.module.state_dict()
    moved = 0
    for key, value in learner.target.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(value, 0.995 * before[key] + 0.005 * online[key], rtol=1e-5, atol=1e-6)
            moved += int(not torch.equal(value, before[key]))
    assert moved > 0
    returns = [algo.train()["evaluation/episode_return_mean"] for _ in range(3)]
    algo.stop()
    assert max(returns) > -1000, returns  # random actions score about -1,200, the dataset's episodes -1,056


def test_iql_actor_learns_one_log_std_per_action_dimension_by_default(tmp_path):
    """IQL's default actor (the paper's): the head gives the mean, one learned log std serves every state, kept in
    [-5, 2]; the actor loss by hand with it; runners (the numpy twin, and a light runner's copy of the weights) and
    the policy explore with it, a ~ N(tanh(mean), std) clipped; a checkpoint's policy acts as the run did; a
    checkpoint of a per-state log std still restores; a BC actor (no tanh) is refused as its start."""
    from herdrl.algorithms.bc import BCConfig
    from herdrl.algorithms.iql import IQLConfig
    from herdrl.checkpoint import CheckpointError
    from herdrl.models.numpy_policy import MLPWeights, light_policy
    from herdrl.policy import Policy

    pendulum_dataset(tmp_path / "pendulum", 2)
    config = (IQLConfig().offline_data(input_=str(tmp_path / "pendulum")).environment("Pendulum-v1")
              .training(updates_per_iteration=30, model={"fcnet_hiddens": [32]}).evaluation(evaluation_duration=1)
              .debugging(seed=0))
    algo = config.build()
    module, learner = algo.module, algo.learner
    assert module.free_log_std and tuple(module.log_std.shape) == (1,) and module.pi_head.out_features == 1
    with torch.no_grad():
        module.log_std.fill_(-0.7)
    batch = {k: torch.as_tensor(v) for k, v in algo.draw(64).items()}
    with torch.no_grad():
        actor_loss, _ = learner.actor_loss(batch)
        q = torch.min(*learner.target.q_values(batch["obs"], batch["actions"])).numpy()
        mean = module.pi_head(module.pi_encoder(batch["obs"])).numpy()[:, 0]
        v = module.value(batch["obs"]).numpy()
    a = batch["actions"].numpy()[:, 0] / 2.0
    logp = -0.5 * ((a - np.tanh(mean)) / np.exp(-0.7)) ** 2 + 0.7 - 0.5 * np.log(2 * np.pi)
    weights = np.minimum(np.exp(3.0 * (q - v)), 100.0)
    assert float(actor_loss) == pytest.approx(-np.mean(weights * logp), rel=1e-4)
    twin = config.runner_policy(module, np.random.default_rng(0))  # (built before learning: it reads the weights)
    with torch.no_grad():
        module.log_std.fill_(-7.0)  # past the bound, where the clamp passes no gradient
    algo.train()
    learned = float(module.log_std.detach()[0])
    # Kept at the bound after each step, the log std learns from there, up towards the data's spread (std ~0.15).
    assert -5.0 < learned < -4.9, learned
    obs = np.random.default_rng(1).uniform(-1, 1, (6, 3)).astype(np.float32)
    noise = np.random.default_rng(2).standard_normal((6, 1)).astype(np.float32) * 100
    with torch.no_grad():
        mean = module.pi_head(module.pi_encoder(torch.from_numpy(obs))).numpy()
    expected = np.clip(np.tanh(mean) + noise * np.exp(learned), -1, 1) * 2.0
    np.testing.assert_allclose(twin.act(obs, True, noise), expected, rtol=1e-5, atol=1e-6)
    light = MLPWeights(config.runner_blueprint(module))
    light.load({k: v.numpy() for k, v in module.state_dict().items()})
    acted = light_policy(light, None, np.random.default_rng(0)).act(obs, True, noise)
    np.testing.assert_allclose(acted, expected, rtol=1e-5, atol=1e-6)
    checkpoint = algo.save(tmp_path / "free" / "checkpoint_000001")
    policy = algo.get_policy()
    greedy = policy.compute_actions(obs)
    np.testing.assert_allclose(greedy, np.tanh(mean) * 2.0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(Policy.from_checkpoint(checkpoint).compute_actions(obs), greedy, rtol=1e-6)
    # Exploring, the policy samples IQL's actor too: with the mean 1 and std 1 (a pure bias), the mean of
    # clip(tanh(1) + N(0, 1), -1, 1) * 2, not of tanh(1 + N(0, 1)) * 2 (a SAC actor's), over 20,000 draws.
    with torch.no_grad():
        module.pi_head.weight.zero_()
        module.pi_head.bias.fill_(1.0)
        module.log_std.fill_(0.0)
    torch.manual_seed(0)
    explored = policy.compute_actions(np.repeat(obs[:1], 20_000, 0), explore=True)
    draws = np.random.default_rng(3).standard_normal(200_000)
    iql_mean, sac_mean = 2 * np.clip(np.tanh(1) + draws, -1, 1).mean(), 2 * np.tanh(1 + draws).mean()
    assert abs(explored.mean() - iql_mean) < 0.03 < abs(iql_mean - sac_mean), (explored.mean(), iql_mean, sac_mean)
    algo.stop()
    per_state = config.copy().training(model={"free_log_std": False}).build()  # (the actor before the change)
    assert not hasattr(per_state.module, "log_std") and per_state.module.pi_head.out_features == 2
    per_state.train()
    saved = per_state.save(tmp_path / "per-state" / "checkpoint_000001")
    per_state.stop()
    assert Policy.from_checkpoint(saved).module.pi_head.out_features == 2
    bc = (BCConfig().offline_data(input_=str(tmp_path / "pendulum")).training(updates_per_iteration=1,
                                                                               model={"fcnet_hiddens": [32]}).build())
    bc_checkpoint = bc.save(tmp_path / "bc" / "checkpoint_000000")
    bc.stop()
    with pytest.raises(CheckpointError, match="is a BC actor, which does not squash its actions with tanh"):
        config.copy().training(online=True, init_from=str(bc_checkpoint)).build()


def test_discrete_iql_losses_match_a_hand_computation_and_it_learns_cartpole(tmp_path):
    """Discrete actions: V's expectile loss under min over the target critics of Q(s, a_data) (picked by hand from
    every action's values), the actor's advantage-weighted log-softmax of the recorded action, the critics' error
    to r + gamma V(s'); it learns the expert's CartPole and its checkpoint's policy is the actor's argmax."""
    from herdrl.algorithms.iql import DiscreteIQLModule, IQLConfig
    from herdrl.policy import Policy

    record_expert(tmp_path / "expert", 4)
    algo = small_iql(tmp_path / "expert", "CartPole-v1", 300)
    learner = algo.learner
    assert isinstance(learner.module, DiscreteIQLModule)
    batch = {k: torch.as_tensor(v) for k, v in algo.draw(64).items()}
    rows, actions = np.arange(64), batch["actions"].numpy()
    with torch.no_grad():
        value_loss, _ = learner.value_loss(batch)
        actor_loss, _ = learner.actor_loss(batch)
        critic_loss, _ = learner.critic_loss(batch)
        target_q = [q.numpy()[rows, actions] for q in learner.target.all_q_values(batch["obs"])]
        online_q = [q.numpy()[rows, actions] for q in learner.module.all_q_values(batch["obs"])]
        v = learner.module.value(batch["obs"]).numpy()
        v_next = learner.module.value(batch["next_obs"]).numpy()
        logits = learner.module.pi_head(learner.module.pi_encoder(batch["obs"])).numpy().astype(np.float64)
    u = np.minimum(*target_q) - v
    assert float(value_loss) == pytest.approx(np.mean(np.where(u < 0, 0.2, 0.8) * u ** 2), rel=1e-5)
    logp = logits[rows, actions] - np.log(np.exp(logits).sum(-1))
    assert float(actor_loss) == pytest.approx(-np.mean(np.minimum(np.exp(2.0 * u), 5.0) * logp), rel=1e-4)
    target = batch["rewards"].numpy() + batch["discounts"].numpy() * v_next
    assert float(critic_loss) == pytest.approx(sum(np.mean((q - target) ** 2) for q in online_q), rel=1e-5)
    result = train_until_solved(algo, 5)
    assert result["evaluation/episode_return_mean"] >= 475, result["evaluation/episode_return_mean"]
    path = algo.save(tmp_path / "ckpt")
    obs = np.asarray(algo.draw(32)["obs"], np.float32)
    with torch.no_grad():
        greedy = learner.module.dist_inputs(torch.as_tensor(obs)).argmax(-1).tolist()
    algo.stop()
    assert Policy.from_checkpoint(path).compute_actions(obs).tolist() == greedy
    with pytest.raises(ConfigError, match="online IQL learns continuous"):
        IQLConfig().offline_data(input_=str(tmp_path / "expert")).environment("CartPole-v1").training(
            online=True).build()


def test_ray_data_streams_a_dataset_larger_than_the_object_store_in_bounded_memory(tmp_path, ray_session):
    """A dataset of ~180 MB of transitions, read by Ray Data through the suite's 150 MB object store: every
    transition of an epoch comes through (each episode's rows whole: its steps' ids), the driver's own memory
    stays far below the dataset's size, and a second epoch begins by itself."""
    from herdrl.algorithms.bc import BCConfig

    obs_space = gym.spaces.Box(-1, 1, (1500,), np.float32)
    action_space = gym.spaces.Discrete(3)
    writer = DatasetWriter(tmp_path / "big", obs_space, action_space)
    rng = np.random.default_rng(0)
    steps, episodes = 200, 80
    for i in range(episodes):
        obs = rng.uniform(-1, 1, (steps + 1, 1500)).astype(np.float32)
        obs[:, 0] = i  # which episode a row came from,
        obs[:, 1] = np.arange(steps + 1)  # and which step
        writer.write(Episode(obs, rng.integers(0, 3, steps), np.ones(steps), np.arange(steps) == steps - 1,
                             np.zeros(steps, bool)))
    write_metadata(tmp_path / "big", obs_space, action_space)
    dataset_bytes = episodes * steps * 2 * 1500 * 4
    assert ray_session.cluster_resources()["object_store_memory"] < dataset_bytes
    algo = (BCConfig().offline_data(input_=str(tmp_path / "big"), offline_read_method="ray_data",
                                    shuffle_buffer_rows=2000)
            .training(train_batch_size=500, model={"fcnet_hiddens": [8]}).debugging(seed=0).build())
    assert algo.read_method == "ray_data"
    seen = [algo.draw(500)["obs"][:, :2].astype(np.int64)]
    baseline, peak = _rss_mb(), 0.0  # (after the first batch: Ray Data's own start-up is not the data)
    for _ in range(episodes * steps // 500 - 1):
        batch = algo.draw(500)
        seen.append(batch["obs"][:, :2].astype(np.int64))
        peak = max(peak, _rss_mb() - baseline)
    assert algo.reader.epochs == 1
    seen = np.concatenate(seen)
    assert len(np.unique(seen[:, 0] * 1000 + seen[:, 1])) == episodes * steps  # each transition once
    next_obs_step = algo.draw(1)
    assert algo.reader.epochs == 2 and next_obs_step["obs"].shape == (1, 1500)
    algo.stop()
    assert peak < dataset_bytes / 2**20 / 3, (peak, dataset_bytes / 2**20)


def _rss_mb() -> float:
    """This process's own memory (RssAnon: the object store's shared pages it maps are not its own)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_ppo_init_from_a_bc_checkpoint_starts_with_its_policy_and_warms_a_fresh_value_head_first(tmp_path):
    """PPO starts acting as the cloned policy (its greedy actions on the dataset's states are BC's); for
    init_value_warmup_iters iterations only the value head moves; then the policy learns too."""
    from herdrl.algorithms.bc import BCConfig
    from herdrl.algorithms.ppo import PPOConfig
    from herdrl.checkpoint import CheckpointError
    from herdrl.policy import Policy

    record_expert(tmp_path / "expert", 2)
    bc = (BCConfig().offline_data(input_=str(tmp_path / "expert")).training(updates_per_iteration=300)
          .debugging(seed=0).build())
    bc.train()
    checkpoint = bc.save(tmp_path / "bc" / "checkpoint_000001")
    bc.stop()
    states = np.stack([e.observations[:-1] for e in open_dataset(tmp_path / "expert").episodes()]).reshape(-1, 4)
    cloned = Policy.from_checkpoint(checkpoint).compute_actions(states)
    algo = (PPOConfig().environment("CartPole-v1").training(init_from=str(checkpoint), init_value_warmup_iters=1,
                                                             train_batch_size=512, minibatch_size=128)
            .debugging(seed=1).build())
    np.testing.assert_array_equal(algo.get_policy().compute_actions(states), cloned)
    policy_names = {n for n, p in algo.module.named_parameters()
                    if any(p is q for q in algo.module.policy_parameters())}
    moved = []
    for _ in range(2):
        before = {k: v.copy() for k, v in algo.get_weights().items()}
        row = algo.train()
        after = algo.get_weights()
        moved.append({kind: max(float(np.abs(after[k] - before[k]).max()) for k in after
                                if (k in policy_names) == (kind == "policy")) for kind in ("policy", "value")})
        moved[-1]["frozen"] = row.get("policy_frozen", 0)
    algo.stop()
    assert moved[0]["policy"] == 0.0 and moved[0]["value"] > 1e-4 and moved[0]["frozen"] == 1, moved
    assert moved[1]["policy"] > 1e-4 and moved[1]["frozen"] == 0, moved
    with pytest.raises(CheckpointError, match="init_from: checkpoint .* has observation space"):
        PPOConfig().environment("Acrobot-v1").training(init_from=str(checkpoint)).build()


def test_training_episodes_recorded_with_output_obey_the_env_and_add_up_across_runs(tmp_path, capsys):
    """Every recorded CartPole transition is what the env does from the recorded state with the recorded action
    (stepped again from that state here), each episode ends exactly where the env ended it, the count is the
    run's own count of finished episodes, and a second run into the same folder adds its episodes to the first's."""
    from herdrl.algorithms.ppo import PPOConfig

    out = tmp_path / "played"
    config = (PPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=4)
              .training(train_batch_size=512, minibatch_size=128).offline_data(output=str(out)).debugging(seed=0))
    algo = config.build()
    for _ in range(2):
        algo.train()
    first = algo.episodes_lifetime
    algo.stop()
    dataset = open_dataset(out)
    assert dataset.total_episodes == first > 0
    env = gym.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    for episode in dataset.episodes():
        assert (episode.rewards == 1.0).all() and len(episode) <= 500
        for t in range(len(episode)):
            env.state, env.steps_beyond_terminated = episode.observations[t].astype(np.float64), None
            obs, _, terminated, _, _ = env.step(int(episode.actions[t]))
            np.testing.assert_allclose(obs, episode.observations[t + 1], rtol=1e-5, atol=1e-6)
            assert terminated == bool(episode.terminations[t])
        assert episode.terminations[-1] or episode.truncations[-1]
    algo = config.build()  # a second run recording into the same folder: killed before it stops
    algo.train()
    second = algo.episodes_lifetime
    algo.runners.stop()
    assert main(["data", "finish", str(out)]) == 0
    assert f"episodes      {first + second}" in capsys.readouterr().out
    assert sorted(int(p.name) for p in (out / "data").iterdir() if p.is_dir()) == list(range(first + second))
    with pytest.raises(ConfigError, match="an offline run plays none"):
        from herdrl.algorithms.bc import BCConfig

        BCConfig().offline_data(input_=str(out), output=str(tmp_path / "x")).build()


def test_transitions_discount_zero_only_after_a_termination_and_returns_stop_at_the_episode_end():
    from herdrl.offline.dataset import to_transitions

    space = gym.spaces.Box(-10, 10, (1,), np.float32)
    ended = Episode(np.arange(4, dtype=np.float32)[:, None], np.zeros(3, np.int64), np.array([1.0, 2.0, 4.0]),
                    np.array([False, False, True]), np.zeros(3, bool))
    cut = Episode(np.arange(10, 13, dtype=np.float32)[:, None], np.zeros(2, np.int64), np.array([1.0, 1.0]),
                  np.zeros(2, bool), np.array([False, True]))
    t = to_transitions([ended, cut], space, gym.spaces.Discrete(2), 0.5)
    np.testing.assert_array_equal(t["discounts"], [0.5, 0.5, 0.0, 0.5, 0.5])  # a truncation still bootstraps
    np.testing.assert_array_equal(t["obs"][:, 0], [0, 1, 2, 10, 11])
    np.testing.assert_array_equal(t["next_obs"][:, 0], [1, 2, 3, 11, 12])
    np.testing.assert_allclose(t["returns"], [1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4, 4, 1 + 0.5, 1])


def test_herd_record_with_a_seed_records_the_same_exploring_episodes_again(tmp_path):
    from herdrl.algorithms.ppo import PPOConfig

    algo = (PPOConfig().environment("Pendulum-v1").debugging(seed=0)
            .training(train_batch_size=200, minibatch_size=50).build())
    checkpoint = algo.save(tmp_path / "checkpoint_000000")
    algo.stop()
    for name in ("a", "b"):
        assert main(["record", str(checkpoint), "--episodes", "2", "--out", str(tmp_path / name), "--seed", "3",
                     "--explore"]) == 0
    for a, b in zip(open_dataset(tmp_path / "a").episodes(), open_dataset(tmp_path / "b").episodes(), strict=True):
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.observations, b.observations)


def test_finishing_a_recording_left_by_a_killed_run_drops_half_written_episodes_and_resumes_a_renumbering(tmp_path):
    from herdrl.offline.recorder import RENAMED, EpisodeRecorder, finish_recording

    space, actions = gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2)
    recorder = EpisodeRecorder(tmp_path, space, actions, num_envs=1, worker_index=2, incarnation=0)
    obs = np.zeros((4, 1, 2), np.float32)
    done = np.array([[False], [False], [True]])
    for _ in range(3):
        recorder.add(obs, [np.zeros(1, np.int64)] * 3, np.ones((3, 1)), done, np.zeros((3, 1), bool),
                     np.ones((3, 1), bool))
    data = tmp_path / "data"
    ids = sorted(int(p.name) for p in data.iterdir() if p.name.isdigit())
    assert len(ids) == 3 and ids[0] == 2000 * 10**6
    (data / str(ids[1]) / "metadata.json").unlink()  # killed while writing this one
    (data / str(ids[2])).rename(data / f"{RENAMED}0")  # and an earlier finish killed after its first rename
    metadata = finish_recording(tmp_path)
    assert metadata["total_episodes"] == 2 and metadata["total_steps"] == 6
    assert sorted(p.name for p in data.iterdir() if p.is_dir()) == ["0", "1"]
    assert [e.id for e in open_dataset(tmp_path).episodes()] == [0, 1]


def test_init_from_refuses_a_network_of_another_shape_and_filters_on_one_side_only(tmp_path):
    from herdrl.algorithms.bc import BCConfig
    from herdrl.algorithms.ppo import PPOConfig
    from herdrl.checkpoint import CheckpointError

    record_expert(tmp_path / "expert", 1)
    bc = (BCConfig().offline_data(input_=str(tmp_path / "expert")).training(updates_per_iteration=1,
                                                                              model={"fcnet_hiddens": [32]}).build())
    checkpoint = bc.save(tmp_path / "bc" / "checkpoint_000000")
    bc.stop()
    with pytest.raises(CheckpointError, match="have no match in checkpoint .* give this run the model config"):
        PPOConfig().environment("CartPole-v1").training(init_from=str(checkpoint)).build()
    with pytest.raises(CheckpointError, match="learned on raw observations"):
        (PPOConfig().environment("CartPole-v1").env_runners(observation_filter="MeanStdFilter")
         .training(init_from=str(checkpoint), model={"fcnet_hiddens": [32]}).build())


def test_bc_on_two_learner_actors_takes_the_same_steps_as_one_learner(tmp_path):
    """Each batch split between two learner actors (gradients summed) gives the weights one learner gets."""
    from herdrl.algorithms.bc import BCConfig

    record_expert(tmp_path / "expert", 1)
    weights = []
    for learners in (0, 2):
        algo = (BCConfig().offline_data(input_=str(tmp_path / "expert"))
                .training(updates_per_iteration=20, updates_per_call=10, model={"fcnet_hiddens": [32]})
                .learners(num_learners=learners).resources(include_dashboard=False).debugging(seed=0).build())
        algo.train()
        weights.append(algo.get_weights())
        algo.stop()
    for key, value in weights[0].items():
        np.testing.assert_allclose(weights[1][key], value, rtol=1e-4, atol=1e-5)


def test_a_run_streaming_with_ray_data_stops_its_stream_before_the_ray_it_started(tmp_path):
    """Ray Data's threads still fetch for a moment after their iterator closes; Ray shut down under them ends the
    process. A run that started its own Ray (a fresh process: the suite's Ray is shared) stops cleanly mid-epoch."""
    import subprocess

    record_expert(tmp_path / "expert", 2)
    script = f"""
import ray
from herdrl.algorithms.bc import BCConfig
algo = (BCConfig().offline_data(input_={str(tmp_path / "expert")!r}, offline_read_method="ray_data")
        .training(updates_per_iteration=6, updates_per_call=3).debugging(seed=0).build())
row = algo.train()
assert row["dataset/epochs"] >= 1
algo.stop()
print("stopped", ray.is_initialized())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "stopped False" in out.stdout, out.stderr[-2000:]


def test_learner_actors_stream_their_own_shares_and_step_on_the_union_of_their_rows(tmp_path):
    """With learner actors a streamed dataset bypasses the driver: rank r reads episode files r, r+2, ... and each
    reads a share of every batch in proportion to the transitions its files hold (60 and 30 here); a gradient step
    is one learner's step on both ranks' rows. A batch of 90 is then exactly one pass over each share (every row
    distinct), so both steps learn on all 90 transitions, whatever each stream's shuffle."""
    from herdrl.algorithms.bc import BCConfig

    space, actions = gym.spaces.Box(-1, 2, (4,), np.float32), gym.spaces.Discrete(2)
    writer = DatasetWriter(tmp_path / "uneven", space, actions)
    obs_rows, action_rows = [], []
    for i, steps in enumerate([30, 10, 30, 20]):
        obs = np.zeros((steps + 1, 4), np.float32)
        obs[:, i % 2] = 1.0
        obs[:, 2] = np.arange(steps + 1) / 40 + i
        writer.write(Episode(obs, np.arange(steps) % 2, np.ones(steps), np.arange(steps) == steps - 1,
                             np.zeros(steps, bool)))
        obs_rows.append(obs[:-1])
        action_rows.append(np.arange(steps) % 2)
    write_metadata(tmp_path / "uneven", space, actions)
    config = (BCConfig().offline_data(input_=str(tmp_path / "uneven"), offline_read_method="ray_data")
              .training(updates_per_iteration=2, updates_per_call=1, train_batch_size=90,
                        model={"fcnet_hiddens": [8]})
              .learners(num_learners=2).resources(include_dashboard=False).debugging(seed=0))
    algo = config.build()
    try:
        assert algo.reader is None and algo._stream_rows == (60, 30)  # (no reader in the driver)
        start = algo.get_weights()
        row = algo.train()
        learned = algo.get_weights()
        one = algo.learner_class(algo.config, space, actions)
        saved = algo.save(tmp_path / "run" / "checkpoint_000001")
    finally:
        algo.stop()
    resumed = config.build()  # (its streams open again, in new orders, and go on)
    try:
        resumed.restore(saved)
        assert resumed.train()["num_gradient_updates_lifetime"] == 4
    finally:
        resumed.stop()
    assert row["dataset/epochs"] == 2 and row["num_gradient_updates"] == 2
    from herdrl.offline.reader import share_rows

    assert share_rows(15, [1000, 10]) == (14, 1) and share_rows(7, [5, 5, 5]) == (3, 2, 2)
    one.module.load_state_dict({key: torch.tensor(value) for key, value in start.items()})
    every = {"obs": np.concatenate(obs_rows), "actions": np.concatenate(action_rows), "rewards": np.ones(90),
             "next_obs": np.zeros((90, 4), np.float32), "discounts": np.ones(90), "returns": np.ones(90)}
    one.update({key: np.concatenate([value] * 2) for key, value in every.items()}, 2)
    for key, value in one.get_weights().items():
        np.testing.assert_allclose(learned[key], value, rtol=1e-4, atol=1e-6)
    assert sum(not np.allclose(start[key], value) for key, value in learned.items()) >= 4  # (the policy moved)


def test_iql_continues_online_from_its_offline_checkpoint_with_its_dataset_in_replay(tmp_path):
    """online=True (one key): the replay buffer starts as the dataset's transitions (checked against the recorded
    episodes), runners' transitions join them, the learner starts from the offline run's weights (--init-from),
    and a resume whose checkpoint holds no buffer gets the dataset again."""
    from herdrl.algorithms.iql import IQLConfig

    pendulum_dataset(tmp_path / "pendulum", 2)
    small = {"fcnet_hiddens": [32], "fcnet_activation": "relu"}  # (IQL's actor: one log std, whatever the state)
    offline = (IQLConfig().offline_data(input_=str(tmp_path / "pendulum")).environment("Pendulum-v1")
               .training(updates_per_iteration=20, model=small).evaluation(evaluation_duration=1)
               .debugging(seed=0).build())
    offline.train()
    checkpoint = offline.save(tmp_path / "offline" / "checkpoint_000000")
    trained = offline.get_weights()
    offline.stop()

    online_config = (IQLConfig().offline_data(input_=str(tmp_path / "pendulum")).environment("Pendulum-v1")
                     .training(online=True, init_from=str(checkpoint), model=small, train_batch_size=64,
                               min_sample_timesteps_per_iteration=100, training_intensity=64.0)
                     .evaluation(evaluation_duration=1).debugging(seed=0))
    algo = online_config.build()
    try:
        episodes = list(open_dataset(tmp_path / "pendulum").episodes())
        recorded = sum(len(e.rewards) for e in episodes)
        assert len(algo.buffer) == recorded == 400
        stored = algo.buffer.state()
        first = episodes[0]
        np.testing.assert_allclose(stored["obs"][:200], first.observations[:-1], rtol=0, atol=0)
        np.testing.assert_allclose(stored["next_obs"][:200], first.observations[1:], rtol=0, atol=0)
        np.testing.assert_allclose(stored["actions"][:200], first.actions, rtol=0, atol=0)
        np.testing.assert_allclose(stored["rewards"][:200], first.rewards, rtol=1e-6)
        np.testing.assert_allclose(stored["discounts"][:200], 0.99, rtol=1e-6)  # (Pendulum only truncates)
        for key, value in trained.items():  # every weight of the offline run, value net included
            np.testing.assert_array_equal(algo.get_weights()[key], value)
        # The runners explore with IQL's own actor: a ~ N(tanh(mean), std), log std in [-5, 2], clipped to the Box.
        obs = np.random.default_rng(1).uniform(-1, 1, (6, 3)).astype(np.float32)
        noise = np.random.default_rng(2).standard_normal((6, 1)).astype(np.float32) * 3
        acted = online_config.runner_policy(algo.module, np.random.default_rng(0)).act(obs, True, noise)
        with torch.no_grad():
            mean, log_std = (t.numpy() for t in algo.module.mean_log_std(torch.from_numpy(obs)))
        expected = np.clip(np.tanh(mean) + noise * np.exp(np.clip(log_std, -5, 2)), -1, 1) * 2.0
        np.testing.assert_allclose(acted, expected, rtol=1e-5, atol=1e-6)
        row = algo.train()
        assert row["num_env_steps_sampled_lifetime"] >= 100 and len(algo.buffer) == recorded + \
            row["num_env_steps_sampled_lifetime"]
        assert row["num_gradient_updates"] >= 90 and "evaluation/episode_return_mean" in row
        assert not all(np.array_equal(algo.get_weights()[k], v) for k, v in trained.items())
        saved = algo.save(tmp_path / "online" / "checkpoint_000001")
    finally:
        algo.stop()
    resumed = online_config.build()
    try:
        resumed.restore(saved)
        assert len(resumed.buffer) == recorded  # (no buffer in the checkpoint: the dataset's again)
    finally:
        resumed.stop()


RLLIB_EPISODES = os.path.join(os.path.dirname(__file__), "golden", "rllib-episodes")


def test_rllibs_recorded_episodes_convert_to_a_dataset_as_rllib_itself_reads_them(tmp_path, capsys):
    """RLlib 2.60's recording (tests/golden/rllib-episodes, made by its make.py): `herd data from-rllib` writes a
    dataset whose episodes are, field by field, what RLlib's own reader decoded (reference.json), with the spaces
    RLlib described; nothing is unpickled."""
    assert main(["data", "from-rllib", os.path.join(RLLIB_EPISODES, "output"), "--out", str(tmp_path / "d")]) == 0
    assert "episodes      6" in capsys.readouterr().out
    with open(os.path.join(RLLIB_EPISODES, "reference.json")) as f:
        reference = json.load(f)
    dataset = open_dataset(tmp_path / "d")
    assert dataset.action_space == gym.spaces.Discrete(2)
    assert dataset.observation_space == gym.make("CartPole-v1").observation_space
    read = list(dataset.episodes())
    assert len(read) == len(reference) == 6
    for episode, expected in zip(read, reference, strict=True):
        np.testing.assert_array_equal(episode.observations, np.asarray(expected["observations"], np.float32))
        np.testing.assert_array_equal(episode.actions, expected["actions"])
        np.testing.assert_array_equal(episode.rewards, expected["rewards"])
        assert episode.terminations.tolist() == [False] * (len(episode) - 1) + [expected["terminated"]]
        assert episode.truncations.tolist() == [False] * (len(episode) - 1) + [expected["truncated"]]


def test_what_rllib_data_cannot_be_read_safely_is_refused_in_one_line(tmp_path):
    """An object array (it would need unpickling), RLlib's per-step column format, an episode chunk."""
    import msgpack
    import pyarrow as pa
    import pyarrow.parquet as pq

    from herdrl.offline.rllib_data import convert_rllib

    first = sorted(Path(RLLIB_EPISODES, "output").rglob("*.parquet"))[0]
    state = msgpack.unpackb(pq.read_table(first).column("item")[0].as_py(), strict_map_key=False)

    def write(name, item=None, columns=None):
        folder = tmp_path / name
        folder.mkdir()
        pq.write_table(pa.table(columns or {"item": [msgpack.packb(item)]}), folder / "part.parquet")
        return folder

    pickled = dict(state, custom={b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": b"\x80"})
    with pytest.raises(DatasetError, match="only booleans, integers and floats are read"):
        convert_rllib(write("pickled", pickled), tmp_path / "a")
    with pytest.raises(DatasetError, match="output_write_episodes=True"):
        convert_rllib(write("columns", columns={"obs": [1.0], "actions": [0]}), tmp_path / "b")
    with pytest.raises(DatasetError, match="batch_mode='complete_episodes'"):
        convert_rllib(write("chunk", dict(state, t_started=40)), tmp_path / "c")


def test_evaluation_runners_act_with_the_runs_statistics_and_add_nothing_to_them(tmp_path):
    """An offline run's evaluation on runners (here: one built as the run builds its evaluation runners) reads
    every observation normalised with the dataset's statistics as they are: evaluating counts nothing, so the
    statistics the policy was trained with are the ones it is evaluated with."""
    from herdrl.algorithms.bc import BCConfig
    from herdrl.rollout.runner import EnvRunner

    record_expert(tmp_path / "expert", 1)
    algo = (BCConfig().offline_data(input_=str(tmp_path / "expert")).environment("CartPole-v1")
            .env_runners(observation_filter="MeanStdFilter").training(updates_per_iteration=10)
            .debugging(seed=0).build())
    runner = EnvRunner(algo.config.evaluation_runner_config())
    stats = algo.normalizer.state()
    runner.evaluation_sample(algo.runner_weights(), False, (1, 0), True, 300)
    local = runner.normalizer.local.state()
    runner.stop()
    algo.stop()
    for key in ("obs/count", "obs/mean", "obs/m2"):
        np.testing.assert_array_equal(local[key], stats[key])


def test_online_iql_keeps_raw_observations_in_replay_beside_the_datasets_and_normalises_each_batch(tmp_path):
    """observation_filter online: the env's transitions go into replay raw, as the dataset's (Pendulum's cos and
    sin stay within [-1, 1]), and each replayed batch is normalised once, with the statistics of the moment (the
    dataset's observations and the env's since)."""
    from herdrl.algorithms.iql import IQLConfig

    pendulum_dataset(tmp_path / "pendulum", 2)
    algo = (IQLConfig().offline_data(input_=str(tmp_path / "pendulum")).environment("Pendulum-v1")
            .env_runners(observation_filter="MeanStdFilter")
            .training(online=True, min_sample_timesteps_per_iteration=200, train_batch_size=32,
                      num_steps_sampled_before_learning_starts=0,
                      model={"fcnet_hiddens": [16], "fcnet_activation": "relu", "free_log_std": False})
            .debugging(seed=0).build())
    assert algo.normalizer.state()["obs/count"] == 2 * 201  # the dataset's observations, final ones included
    algo.train()
    obs = algo.buffer.state()["obs"]
    assert len(obs) > 400 and np.abs(obs[:, :2]).max() <= 1.0 + 1e-6  # raw: never normalised before replay
    assert algo.normalizer.state()["obs/count"] > 2 * 201  # the env's observations counted too
    algo.stop()
