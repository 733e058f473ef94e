"""QMIX and VDN: a cooperative PettingZoo env as one team, the monotonic mixer, the team's TD target."""

import numpy as np
import pytest
import torch

import herdrl
from herdrl import ConfigError, EnvError, HerdError, QMIXConfig
from herdrl.algorithms.qmix import QMixer, QMIXLearner
from herdrl.env.multi_agent import make_agent_env
from herdrl.env.team import TeamEnv
from herdrl.env.testing import CueRelay, TwoStepGame

herdrl.register_env("two_step", lambda cfg: TwoStepGame(cfg))
herdrl.register_env("relay", lambda cfg: CueRelay(cfg))


class EndingPair(TwoStepGame):
    """Two agents, one step, then the env ends with ``flags`` {agent: (terminated, truncated)}; agents left out of
    ``flags`` are dropped without a word."""

    def __init__(self, env_config=None):
        super().__init__(env_config)
        self.flags = (env_config or {}).get("flags", {})

    def step(self, actions):
        agents, self.agents = self.agents, []
        obs = {agent: np.full(3, 0.5, np.float32) for agent in self.flags}
        return obs, dict.fromkeys(agents, 1.0), {a: f[0] for a, f in self.flags.items()}, \
            {a: f[1] for a, f in self.flags.items()}, {a: {} for a in self.flags}


herdrl.register_env("ending_pair", lambda cfg: EndingPair(cfg))


def two_step_config(mixer, seed=0):
    # Uniform exploration throughout (epsilon 1), as in the paper's two-step game.
    return (QMIXConfig().environment("two_step").env_runners(num_envs_per_env_runner=8, rollout_fragment_length=8)
            .training(mixer=mixer, epsilon=1.0, lr=1e-3, train_batch_size=64, training_intensity=32.0,
                      num_steps_sampled_before_learning_starts=64, min_sample_timesteps_per_iteration=256,
                      target_network_update_freq=100)
            .evaluation(evaluation_interval=1, evaluation_duration=4).debugging(seed=seed))


def joint_values(module, state):
    """Q_tot of every joint action in the two-step game's state ``state`` (0: first step, 1: 2A, 2: 2B)."""
    one_hot = torch.eye(3)[state][None]
    obs = {"obs": one_hot[:, None].expand(1, 2, 3), "state": one_hot, "action_mask": torch.ones(1, 2, 2)}
    with torch.no_grad():
        q = module(obs)[0]
        return np.array([[float(module.mix(torch.stack([q[0, a], q[1, b]])[None], obs)) for b in range(2)]
                         for a in range(2)])


def test_qmix_finds_the_two_step_games_best_joint_payoff_that_vdn_misses():
    """The QMIX paper's two-step game under uniform exploration: QMIX's greedy team plays 2B and both pick their
    second action (8) and its Q_tot fits the payoffs; VDN's sum cannot fit 2B's payoffs (its best there is ~6.5, below
    2A's 7), so its greedy team settles for 7."""
    returns, values = {}, {}
    for mixer in ("qmix", "vdn"):
        algo = two_step_config(mixer).build()
        returns[mixer] = [algo.train()["evaluation/episode_return_mean"] for _ in range(12)]
        values[mixer] = {state: joint_values(algo.module, state) for state in (1, 2)}
        algo.stop()
    assert returns["qmix"][-4:] == [8.0] * 4, returns
    np.testing.assert_allclose(values["qmix"][2], TwoStepGame.PAYOFF_2B, atol=0.5)
    np.testing.assert_allclose(values["qmix"][1], np.full((2, 2), 7.0), atol=0.5)
    assert np.mean(returns["vdn"][-4:]) < 7.5, returns
    assert values["vdn"][2].max() < 7.5 and values["vdn"][2][1, 1] == values["vdn"][2].max()


def test_the_mixing_network_is_monotonic_in_every_agents_value():
    """dQ_tot/dQ_a >= 0 for random hypernetwork weights, states and agent values (the absolute values of the
    hypernetworks' outputs); and some gradients are strictly positive (it is not a constant)."""
    torch.manual_seed(0)
    for _ in range(5):
        mixer = QMixer(agents=4, state_dim=6, embed_dim=8, hypernet_dim=16)
        for p in mixer.parameters():
            torch.nn.init.normal_(p, 0.0, 1.0)  # negative weights too
        q = torch.randn(64, 4, requires_grad=True) * 5
        q.retain_grad()
        mixer(q, torch.randn(64, 6)).sum().backward()
        assert (q.grad >= 0).all() and (q.grad > 0).float().mean() > 0.5


def test_the_team_target_is_the_mixed_value_of_each_agents_best_allowed_action():
    """The learner's TD error against a backup computed by hand: each agent's best next action among those its mask
    allows, picked by the online network and valued by the target network, mixed by the target mixer."""
    config = two_step_config("qmix")
    config.validate()
    env = TeamEnv(make_agent_env("two_step", {}))
    learner = QMIXLearner(config, env.observation_space, env.action_space)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in learner.target.parameters():  # a target unlike the online network
            p.add_(0.3 * torch.randn_like(p))
    rows = 8
    obs = {"obs": torch.rand(rows, 2, 3), "state": torch.rand(rows, 3), "action_mask": torch.ones(rows, 2, 2)}
    masks = torch.tensor([[[1, 0], [1, 1]], [[0, 1], [0, 1]], [[1, 1], [1, 0]], [[0, 1], [1, 0]]])
    next_obs = {"obs": torch.rand(rows, 2, 3), "state": torch.rand(rows, 3), "action_mask": masks.repeat(2, 1, 1)}
    batch = {"obs": obs, "next_obs": next_obs, "actions": torch.randint(0, 2, (rows, 2)).float(),
             "rewards": torch.randn(rows), "discounts": torch.tensor([0.9, 0.7, 0.5, 0.99, 0.0, 0.9, 0.8, 0.6]),
             "weights": torch.ones(rows)}
    _, stats = learner.loss(batch)
    differs = 0
    with torch.no_grad():
        q_online, q_target = learner.module(next_obs), learner.target(next_obs)
        taken = learner.module(obs)
        for i in range(rows):
            one = {key: value[i:i + 1] for key, value in next_obs.items()}
            chosen = torch.stack([taken[i, agent, int(batch["actions"][i, agent])] for agent in range(2)])
            q_tot = learner.module.mix(chosen[None], {key: value[i:i + 1] for key, value in obs.items()})[0]
            backups = []
            for masked in (True, False):
                best = []
                for agent in range(2):
                    allowed = [a for a in range(2) if next_obs["action_mask"][i, agent, a] or not masked]
                    pick = max(allowed, key=lambda a, agent=agent: float(q_online[i, agent, a]))
                    best.append(q_target[i, agent, pick])
                mixed = learner.target.mix(torch.stack(best)[None], one)[0]
                backups.append(float(batch["rewards"][i] + batch["discounts"][i] * mixed))
            assert float(stats["td_error"][i]) == pytest.approx(backups[0] - float(q_tot), rel=1e-5, abs=1e-4)
            differs += abs(backups[0] - backups[1]) > 1e-3
    assert differs >= 2  # the masks changed some agents' best next action: the check can tell


def test_each_agent_explores_among_its_own_allowed_actions():
    """With epsilon 1 every agent's action is uniform over the actions its mask allows, drawn for each agent on
    its own; with epsilon 0 it is the greedy allowed one."""
    from herdrl.algorithms.qmix import TeamEpsilonGreedy, TeamQNetwork

    space = {"obs": (3, 4), "state": (5,)}
    import gymnasium as gym

    obs_space = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, space["obs"]), "state": gym.spaces.Box(-1, 1, (5,)),
                                 "action_mask": gym.spaces.Box(0, 1, (3, 4), np.int8)})
    module = TeamQNetwork(obs_space, gym.spaces.MultiDiscrete([4, 4, 4]), {"fcnet_hiddens": [8],
                                                                          "fcnet_activation": "relu"}, "vdn", 4, 4)
    policy = TeamEpsilonGreedy(module, np.random.default_rng(0))
    mask = np.array([[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 1, 1]], np.int8)
    batch = {"obs": np.random.default_rng(1).random((4000, 3, 4), dtype=np.float32),
             "state": np.zeros((4000, 5), np.float32), "action_mask": np.broadcast_to(mask, (4000, 3, 4)).copy()}
    policy.epsilon = 1.0
    actions = policy.act(batch, explore=True)
    for agent in range(3):
        counts = np.bincount(actions[:, agent], minlength=4) / len(actions)
        np.testing.assert_allclose(counts, mask[agent] / mask[agent].sum(), atol=0.03)
    assert not (actions[:, 0] == actions[:, 2]).all()
    policy.epsilon = 0.0
    greedy = policy.act(batch, explore=True)
    assert (greedy[:, 1] == 3).all() and set(np.unique(greedy[:, 0])) <= {0, 2}


def test_a_team_env_observes_each_agent_the_global_state_and_the_allowed_actions():
    """MPE simple_spread as a team: each row of the team's observation is that agent's observation, the state the
    env's state(), every action allowed, the reward the agents' mean; a game that takes turns, agents that join late
    and agents whose action spaces differ are refused in one line."""
    pytest.importorskip("mpe2")
    from herdrl.env.multi_agent import create_env

    raw = create_env("mpe2.simple_spread_v3", {"max_cycles": 5})
    team = TeamEnv(make_agent_env("mpe2.simple_spread_v3", {"max_cycles": 5}))
    obs, _ = team.reset(seed=3)
    expected, _ = raw.reset(seed=3)
    assert obs["obs"].shape == (3, 18) and team.action_space.nvec.tolist() == [5, 5, 5]
    for i, agent in enumerate(raw.possible_agents):
        np.testing.assert_array_equal(obs["obs"][i], expected[agent])
    np.testing.assert_array_equal(obs["state"], raw.state())
    assert obs["action_mask"].all()
    for _ in range(5):
        actions = np.array([1, 2, 3])
        obs, reward, terminated, truncated, _ = team.step(actions)
        expected, rewards, _, _, _ = raw.step({agent: int(a) for agent, a in zip(raw.possible_agents, actions,
                                                                                  strict=True)})
        assert reward == pytest.approx(np.mean(list(rewards.values())))
        for i, agent in enumerate(raw.possible_agents):
            np.testing.assert_array_equal(obs["obs"][i], expected[agent])
    assert truncated and not terminated
    # The team's episode: terminated only if every agent that ends then terminated; a truncation (or an agent the
    # env drops without a word, which keeps its last observation) is bootstrapped.
    for flags, expected in (({"a0": (True, False), "a1": (True, False)}, (True, False)),
                            ({"a0": (True, False), "a1": (False, True)}, (False, True)),
                            ({}, (False, True))):
        team = TeamEnv(make_agent_env("ending_pair", {"flags": flags}))
        first, _ = team.reset()
        final, _, terminated, truncated, _ = team.step(np.array([0, 0]))
        assert (terminated, truncated) == expected, flags
        if not flags:  # dropped: the last observations stand as the final ones
            np.testing.assert_array_equal(final["obs"], first["obs"])
    with pytest.raises(EnvError, match="takes turns"):
        TeamEnv(make_agent_env("pettingzoo/classic/tictactoe-v3", {}))
    with pytest.raises(EnvError, match="do not act at the first step"):
        TeamEnv(make_agent_env("relay", {})).reset()
    with pytest.raises(EnvError, match="same Discrete action space"):
        TeamEnv(make_agent_env("relay", {"continuous": True}))


def test_qmix_trains_on_two_ray_runners_resumes_and_refuses_what_it_has_not(tmp_path):
    config = two_step_config("qmix").env_runners(num_env_runners=2, num_envs_per_env_runner=4)
    algo = config.build()
    result = algo.train()
    assert result["num_healthy_env_runners"] == 2 and result["loss"] >= 0
    path = algo.save(tmp_path / "ckpt")
    weights = algo.get_weights()
    algo.stop()
    from herdrl.algorithms.base import Algorithm
    from herdrl.cli import main

    restored = Algorithm.from_checkpoint(path)  # the env it names, team: prefix and all, made again
    assert restored.config.env == "team:two_step" and restored.config.algo_name == "QMIX"
    assert all(np.array_equal(restored.get_weights()[k], weights[k]) for k in weights)
    restored.stop()
    assert main(["evaluate", str(path), "--episodes", "2"]) == 0
    assert main(["evaluate", str(path), "--episodes", "2", "--env", "two_step"]) == 0  # the user's name for it
    # The export takes the team's observation leaves (action_mask, obs, state) and gives every agent's action.
    from herdrl.export import export_policy
    from herdrl.policy import Policy

    program = torch.export.load(export_policy(path, "torch-export", tmp_path / "team.pt2")).module()
    rng = np.random.default_rng(0)
    obs = {"action_mask": np.ones((6, 2, 2), np.int8), "obs": rng.random((6, 2, 3), dtype=np.float32),
           "state": rng.random((6, 3), dtype=np.float32)}
    obs["action_mask"][:3, 0, 1] = 0  # agent 0 may take action 0 only in the first three
    exported = program(*[torch.as_tensor(obs[key]) for key in sorted(obs)]).numpy()
    assert exported.shape == (6, 2) and (exported[:3, 0] == 0).all()
    np.testing.assert_array_equal(exported, Policy.from_checkpoint(path).compute_actions(obs))
    # One agent alone (decentralised execution): its own rows in, the team's choice for it out.
    out = str(tmp_path / "a1.pt2")
    assert main(["export", str(path), "--format", "torch-export", "--out", out, "--agent", "1"]) == 0
    alone = torch.export.load(tmp_path / "a1.pt2").module()
    mask = obs["action_mask"][:, 1].copy()
    mask[::2, 1] = 0  # and a mask of its own: every other row may take action 0 only,
    mask[1::2] = 0  # the others nothing (an agent with no allowed action: its Q values as they are, as the team's)
    team_obs = {**obs, "action_mask": obs["action_mask"].copy()}
    team_obs["action_mask"][:, 1] = mask
    team = program(*[torch.as_tensor(team_obs[key]) for key in sorted(team_obs)]).numpy()
    mine = alone(torch.as_tensor(mask), torch.as_tensor(obs["obs"][:, 1])).numpy()
    np.testing.assert_array_equal(mine, team[:, 1])
    assert (mine[::2] == 0).all() and (mine[1::2] == 1).any()  # (a mask applied to every row would give 0)
    with pytest.raises(HerdError, match="the team has agents 0 .. 1"):
        export_policy(path, "torch-export", tmp_path / "a5.pt2", agent=5)
    with pytest.raises(ConfigError, match="leave .multi_agent\\(\\) out"):
        QMIXConfig().environment("two_step").multi_agent(policies={"p"}).validate()
    with pytest.raises(ConfigError, match="expected one of"):
        QMIXConfig().environment("two_step").training(mixer="sum").validate()


def test_one_agent_exported_alone_reads_its_row_of_the_teams_observation_filter(tmp_path):
    """With the observation filter on, an agent exported alone normalises its raw observation with its own row of
    the team's statistics: its actions equal the team program's for that agent, on raw observations."""
    from herdrl.export import export_policy
    from herdrl.policy import Policy

    algo = two_step_config("vdn").env_runners(observation_filter="MeanStdFilter").build()
    algo.train()
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    team = torch.export.load(export_policy(path, "torch-export", tmp_path / "team.pt2")).module()
    alone = torch.export.load(export_policy(path, "torch-export", tmp_path / "a0.pt2", agent=0)).module()
    rng = np.random.default_rng(0)
    rows = 512
    obs = {"action_mask": np.ones((rows, 2, 2), np.int8), "state": rng.random((rows, 3), dtype=np.float32),
           "obs": (rng.random((rows, 2, 3), dtype=np.float32) - 0.5) * 4}
    expected = team(*[torch.as_tensor(obs[key]) for key in sorted(obs)]).numpy()[:, 0]
    mine = alone(torch.as_tensor(obs["action_mask"][:, 0]), torch.as_tensor(obs["obs"][:, 0])).numpy()
    np.testing.assert_array_equal(mine, expected)
    with torch.no_grad():  # the same network on unfiltered observations picks otherwise somewhere: the check can tell
        raw = torch.cat([torch.as_tensor(obs["obs"][:, 0]), torch.tensor([[1.0, 0.0]]).expand(rows, -1)], -1)
        unfiltered = Policy.from_checkpoint(path).module.agent(raw).argmax(-1).numpy()
    assert (unfiltered != expected).any()
