import numpy as np
import pytest
import torch

from herdrl import Algorithm, ConfigError, DQNConfig
from herdrl.buffers import PrioritizedReplayBuffer, ReplayBuffer, fragment_transitions
from herdrl.cli import main
from herdrl.rollout import Fragment


def test_dqn_greedy_policy_solves_cartpole_within_a_fixed_budget():
    algo = DQNConfig().environment("CartPole-v1").debugging(seed=1).build()
    result = algo.train()
    assert result["epsilon"] < 1.0 and "evaluation/episode_return_mean" in result
    while result["evaluation/episode_return_mean"] < 475 and result["num_env_steps_sampled_lifetime"] < 60_000:
        result = algo.train()
    assert result["evaluation/episode_return_mean"] >= 475, result
    algo.stop()


@pytest.mark.parametrize("options", [
    {"replay_buffer_config": {"type": "prioritized"}, "dueling": True},
    {"n_step": 3, "double_q": False, "tau": 0.05},
])
def test_dqn_variants_train(options):
    config = (DQNConfig().environment("CartPole-v1").training(num_steps_sampled_before_learning_starts=256,
                                                                min_sample_timesteps_per_iteration=512, **options)
              .debugging(seed=0))
    algo = config.build()
    results = [algo.train() for _ in range(3)]
    assert results[-1]["num_gradient_updates"] > 0 and np.isfinite(results[-1]["loss"])
    algo.stop()


def test_dqn_checkpoint_keeps_the_target_network(tmp_path):
    algo = DQNConfig().environment("CartPole-v1").training(num_steps_sampled_before_learning_starts=256).build()
    algo.train()
    restored = Algorithm.from_checkpoint(algo.save(tmp_path / "ckpt"))
    for a, b in zip(algo.learner.target.parameters(), restored.learner.target.parameters(), strict=True):
        assert torch.equal(a, b)
    obs = np.zeros(4, np.float32)
    assert restored.compute_single_action(obs) == algo.compute_single_action(obs)


def test_dqn_rejects_box_actions_and_bad_replay_settings():
    with pytest.raises(ConfigError, match="DQN needs Discrete actions"):
        DQNConfig().environment("Pendulum-v1").build()
    with pytest.raises(ConfigError, match="replay_buffer_config type got 'fifo'"):
        DQNConfig().environment("CartPole-v1").training(replay_buffer_config={"type": "fifo"}).validate()
    with pytest.raises(ConfigError, match="unknown config key 'clip_param' for DQN"):
        DQNConfig().training(clip_param=0.2)


def test_herd_train_dqn_stops_on_the_evaluation_return(tmp_path, capsys):
    code = main(["train", "dqn", "--env", "CartPole-v1", "--budget", "2000", "--quiet", "--output", str(tmp_path)])
    assert code == 3
    assert capsys.readouterr().err.startswith("budget: evaluation/episode_return_mean")


def fragment(rewards, terminated, truncated, valid):
    steps = len(rewards)
    obs = np.arange(steps + 1, dtype=np.float32).reshape(steps + 1, 1, 1)
    to = lambda x, dtype: np.asarray(x, dtype).reshape(steps, 1)  # noqa: E731
    return Fragment(obs, np.zeros((steps, 1), np.int64), to(rewards, np.float32), to(terminated, bool),
                    to(truncated, bool), to(valid, bool))


def test_n_step_transitions_stop_at_episode_ends_and_bootstrap_truncation():
    # steps: 0, 1 (terminates), 2 (reset-only), 3, 4 (truncated)
    frag = fragment([1, 2, 0, 4, 5], [0, 1, 0, 0, 0], [0, 0, 0, 0, 1], [1, 1, 0, 1, 1])
    one = fragment_transitions(frag, gamma=0.5, n_step=1)
    assert one["rewards"].tolist() == [1, 2, 4, 5]
    assert one["discounts"].tolist() == [0.5, 0.0, 0.5, 0.5]  # the truncated step still bootstraps
    assert one["next_obs"][:, 0].tolist() == [1, 2, 4, 5]
    two = fragment_transitions(frag, gamma=0.5, n_step=2)
    assert two["rewards"].tolist() == [1 + 0.5 * 2, 2, 4 + 0.5 * 5, 5]
    assert two["discounts"].tolist() == [0.0, 0.0, 0.25, 0.5]
    assert two["next_obs"][:, 0].tolist() == [2, 2, 5, 5]


def test_replay_buffers_store_sample_and_prioritize():
    rng = np.random.default_rng(0)
    data = {"obs": np.arange(8, dtype=np.float32)[:, None], "next_obs": np.zeros((8, 1), np.float32),
            "actions": np.zeros(8, np.int64), "rewards": np.arange(8, dtype=np.float32),
            "discounts": np.ones(8, np.float32)}
    uniform = ReplayBuffer(6, 1, rng)
    uniform.add(data)
    assert len(uniform) == 6 and sorted(uniform.rewards.tolist()) == [2, 3, 4, 5, 6, 7]  # oldest overwritten
    prioritized = PrioritizedReplayBuffer(8, 1, rng, alpha=1.0, beta=1.0)
    slots = prioritized.add(data)
    prioritized.update_priorities(slots, np.where(slots == 3, 10.0, 1.0) - prioritized.eps)
    batch, sampled, weights = prioritized.sample(4000)
    assert (sampled == 3).mean() == pytest.approx(10 / 17, abs=0.03)  # p_i / sum p
    assert batch["rewards"][sampled == 3][0] == 3.0
    assert weights[sampled == 3].max() == pytest.approx(0.1 * weights[sampled != 3].max(), rel=1e-3)


def test_target_network_updates_exactly_on_schedule(monkeypatch):
    """Rounds of ~250 env steps with an update due every 100: one per 100 steps, not one per round."""
    import herdrl.algorithms.dqn as dqn

    updates = []  # k Polyak updates with tau 0.5 arrive as one with 1 - 0.5**k
    real = dqn.polyak_update
    monkeypatch.setattr(dqn, "polyak_update", lambda target, online, tau: (
        updates.append(round(np.log(1 - tau) / np.log(0.5))), real(target, online, tau)))
    algo = (DQNConfig().environment("CartPole-v1")
            .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=64)
            .training(target_network_update_freq=100, tau=0.5, num_steps_sampled_before_learning_starts=0,
                      min_sample_timesteps_per_iteration=1000).debugging(seed=0).build())
    result = algo.train()
    steps = result["num_env_steps_sampled_lifetime"]
    assert steps > 1000 and sum(updates) == steps // 100
    # Gradient steps are ~2 env steps apart: each update falls between two of them, none lumped per round.
    assert set(updates) == {1}
    algo.stop()


def _off_policy(algo_name, store):
    from herdrl import SACConfig

    if algo_name == "DQN":
        config = DQNConfig().environment("CartPole-v1").training(
            num_steps_sampled_before_learning_starts=600, min_sample_timesteps_per_iteration=512)
    else:
        config = SACConfig().environment("Pendulum-v1").training(
            num_steps_sampled_before_learning_starts=300, min_sample_timesteps_per_iteration=200,
            model={"fcnet_hiddens": [32]})
    return config.training(store_buffer_in_checkpoints=store).debugging(seed=0)


@pytest.mark.parametrize("algo_name", ["DQN", "SAC"])
@pytest.mark.parametrize("store", [False, True])
def test_a_resumed_run_learns_only_once_its_buffer_holds_enough(tmp_path, algo_name, store):
    algo = _off_policy(algo_name, store).build()
    while algo.train()["num_gradient_updates"] == 0:
        pass
    saved = algo.buffer.state()
    path = algo.save(tmp_path / "checkpoint_000002")
    algo.stop()
    resumed = Algorithm.from_checkpoint(path)
    if store:
        restored = resumed.buffer.state()
        assert saved.keys() == restored.keys() and all(np.array_equal(saved[k], restored[k]) for k in saved)
        assert resumed.train()["num_gradient_updates"] > 0  # learns at once, from the restored buffer
    else:
        assert len(resumed.buffer) == 0
        starts = resumed.config.num_steps_sampled_before_learning_starts
        result = resumed.train()
        while result["replay_buffer_size"] < starts:  # no gradient step from a near-empty buffer
            assert result["num_gradient_updates"] == 0, result
            result = resumed.train()
        assert result["num_gradient_updates"] > 0
    resumed.stop()


def test_the_buffer_lives_in_the_newest_checkpoint_only_and_is_never_unpickled(tmp_path, caplog):
    algo = _off_policy("DQN", True).build()
    algo.train()
    first = algo.save(tmp_path / "checkpoint_000001")
    algo.train()
    second = algo.save(tmp_path / "checkpoint_000002")
    algo.stop()
    assert not (first / "replay_buffer.npz").exists() and (second / "replay_buffer.npz").exists()
    assert Algorithm.from_checkpoint(first).buffer.size == 0  # still a valid checkpoint, without the buffer
    state = dict(np.load(second / "replay_buffer.npz"))
    state["obs"] = np.array([object()] * len(state["obs"]), dtype=object)  # a pickled object array
    with open(second / "replay_buffer.npz", "wb") as f:
        np.savez(f, **state)
    resumed = Algorithm.from_checkpoint(second)  # refused, and the run resumes without it
    assert resumed.buffer.size == 0 and "replay_buffer.npz is damaged or not plain arrays" in caplog.text
    resumed.stop()


def test_learning_starts_when_the_buffer_is_full_even_if_smaller_than_learning_starts():
    algo = DQNConfig().environment("CartPole-v1").training(
        replay_buffer_config={"capacity": 300}, num_steps_sampled_before_learning_starts=1000,
        min_sample_timesteps_per_iteration=512).build()
    assert algo.train()["num_gradient_updates"] > 0
    algo.stop()


def test_prioritized_buffer_state_round_trip_keeps_priorities_and_order():
    rng = np.random.default_rng(0)
    buffer = PrioritizedReplayBuffer(8, 2, rng)
    for start in range(0, 12, 3):  # wraps around: 12 transitions into 8 slots
        n = 3
        buffer.add({"obs": np.full((n, 2), start, np.float32), "next_obs": np.zeros((n, 2), np.float32),
                    "actions": np.arange(start, start + n), "rewards": np.arange(start, start + n, dtype=np.float32),
                    "discounts": np.ones(n, np.float32)})
        buffer.update_priorities(np.array([buffer.cursor - 1]) % 8, np.array([float(start + 1)]))
    state = buffer.state()
    assert state["rewards"].tolist() == list(range(4, 12))  # the newest 8, oldest first
    copy = PrioritizedReplayBuffer(8, 2, np.random.default_rng(0))
    copy.load_state(state)
    assert np.allclose(copy.state()["priorities"], state["priorities"]) and copy.max_priority == buffer.max_priority
    smaller = ReplayBuffer(5, 2, rng)
    smaller.load_state(state)
    assert smaller.state()["rewards"].tolist() == list(range(7, 12))


@pytest.mark.parametrize("buffer_class", [ReplayBuffer, PrioritizedReplayBuffer])
def test_a_dict_observation_buffer_saves_as_plain_arrays_and_loads_back(buffer_class):
    import io

    import gymnasium as gym

    from herdrl.obs import ObsSpec

    space = gym.spaces.Dict({"frame": gym.spaces.Box(0, 255, (3, 3), np.uint8), "speed": gym.spaces.Discrete(4)})
    spec = ObsSpec(space)
    n = 6
    obs = {"frame": np.arange(n * 9, dtype=np.uint8).reshape(n, 3, 3), "speed": np.arange(n) % 4}
    buffer = buffer_class(8, spec, np.random.default_rng(0))
    buffer.add({"obs": obs, "next_obs": obs, "actions": np.arange(n), "rewards": np.arange(n, dtype=np.float32),
                "discounts": np.ones(n, np.float32)})
    saved = io.BytesIO()
    np.savez(saved, **buffer.state())
    saved.seek(0)
    state = dict(np.load(saved, allow_pickle=False))  # a checkpoint's buffer is read without pickle
    assert state["obs/frame"].dtype == np.uint8
    copy = buffer_class(8, spec, np.random.default_rng(0))
    copy.load_state(state)
    assert np.array_equal(copy.obs["frame"][:n], obs["frame"]) and np.array_equal(copy.next_obs["speed"][:n],
                                                                                   obs["speed"])


def test_an_epsilon_schedule_out_of_order_is_refused():
    with pytest.raises(ConfigError, match="config key 'epsilon' got env steps \\[10000, 0\\]"):
        DQNConfig().environment("CartPole-v1").training(epsilon=[[10000, 0.05], [0, 1.0]]).validate()
    DQNConfig().environment("CartPole-v1").training(epsilon=[[0, 1.0], [10000, 0.05]]).validate()


@pytest.mark.parametrize("double_q", [False, True])
def test_masked_targets_are_the_bellman_backup_over_the_allowed_actions(double_q):
    """DQN's target with an action mask, against a backup computed here by hand from the networks' Q values:
    r + discount * Q_target(s', a*), a* the best action s' allows (by the online net with double Q; by the target
    net itself without), never a ruled-out one even where its Q value is the largest."""
    import gymnasium as gym

    from herdrl.algorithms.dqn import DQNLearner

    space = gym.spaces.Dict({"observation": gym.spaces.Box(-1, 1, (3,)),
                             "action_mask": gym.spaces.Box(0, 1, (4,), np.int8)})
    config = DQNConfig().environment("CartPole-v1").training(double_q=double_q, model={"fcnet_hiddens": [8]})
    config.validate()
    learner = DQNLearner(config, space, gym.spaces.Discrete(4))
    torch.manual_seed(1)
    for p in learner.target.parameters():  # a target that differs from the online net
        torch.nn.init.normal_(p)
    rng = np.random.default_rng(0)
    n = 64
    masks = (rng.random((n, 4)) < 0.5).astype(np.int8)
    masks[np.arange(n), rng.integers(0, 4, n)] = 1  # at least one allowed action
    masks[:4] = 0  # terminal rows: the game is over, nothing allowed (their discount is 0)
    masks[4] = 0  # a truncated row whose next observation allows nothing: bootstrapped from every action
    batch = {"obs": {"observation": torch.randn(n, 3), "action_mask": torch.ones(n, 4, dtype=torch.int8)},
             "next_obs": {"observation": torch.randn(n, 3), "action_mask": torch.from_numpy(masks)},
             "actions": torch.from_numpy(rng.integers(0, 4, n)), "rewards": torch.randn(n),
             "discounts": torch.cat([torch.zeros(4), torch.full((n - 4,), 0.9)]), "weights": torch.ones(n)}
    _, stats = learner.loss(batch)
    with torch.no_grad():
        q = learner.module(batch["obs"]).gather(1, batch["actions"][:, None])[:, 0].numpy()
        online_next = learner.module(batch["next_obs"]).numpy()
        target_next = learner.target(batch["next_obs"]).numpy()
    expected = np.empty(n)
    for i in range(n):
        allowed = np.flatnonzero(masks[i])
        if not len(allowed):
            allowed = np.arange(4)
        chooser = online_next if double_q else target_next
        best = allowed[np.argmax(chooser[i, allowed])]
        expected[i] = float(batch["rewards"][i]) + float(batch["discounts"][i]) * target_next[i, best]
    np.testing.assert_allclose(stats["td_error"].numpy() + q, expected, rtol=1e-5, atol=1e-5)
    # The unmasked argmax of s' is often a ruled-out action: the mask really decided these targets.
    assert (masks[np.arange(5, n), target_next[5:].argmax(1)] == 0).sum() > 5


def test_epsilon_greedy_with_a_mask_explores_and_exploits_only_allowed_actions():
    from herdrl.models.numpy_policy import EpsilonGreedy

    rng = np.random.default_rng(0)
    masks = np.zeros((20_000, 5), np.int8)
    masks[:, [1, 3, 4]] = 1
    masks[::2, 4] = 0  # half the rows allow 1 and 3 only
    policy = EpsilonGreedy(lambda obs: np.full(len(obs["action_mask"]), 3), 5, rng, masked=True)
    policy.epsilon = 1.0  # every action random
    actions = policy.act({"action_mask": masks})
    assert masks[np.arange(len(masks)), actions].all()
    odd = np.bincount(actions[1::2], minlength=5) / len(actions[1::2])  # 1, 3, 4 allowed: a third each
    np.testing.assert_allclose(odd[[1, 3, 4]], 1 / 3, atol=0.02)
    even = np.bincount(actions[::2], minlength=5) / len(actions[::2])
    np.testing.assert_allclose(even[[1, 3]], 1 / 2, atol=0.02)
    policy.epsilon = 0.0
    assert (policy.act({"action_mask": masks}) == 3).all()  # the greedy choice
