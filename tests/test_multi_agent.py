"""Multi-agent training on PettingZoo envs: rows in agent time, policy mapping, masks, self-play, checkpoints."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import herdrl
from herdrl import ConfigError, PPOConfig
from herdrl.checkpoint import CheckpointError
from herdrl.env.testing import CueRelay, TwoStepGame
from herdrl.models.actor_critic import ActorCritic
from herdrl.policy import Policy
from herdrl.rollout.multi_agent import MultiAgentEnvRunner

herdrl.register_env("relay", lambda cfg: CueRelay(cfg))
SEPARATE = {"policies": {"p0", "p1"}, "policy_mapping_fn": lambda agent, episode, **kw: "p" + agent[1]}


def relay_config(**multi_agent):
    return (PPOConfig().environment("relay").env_runners(num_envs_per_env_runner=4)
            .training(train_batch_size=256, minibatch_size=64, lr=3e-3).multi_agent(**multi_agent).debugging(seed=3))


def _paid(obs, actions):
    """CueRelay's reward, computed from the observation (cue, id bit) and the action alone."""
    names_positive = actions == 1
    wants_positive = (obs[..., 0] > 0) == (obs[..., 1] == 0)
    return (names_positive == wants_positive).astype(np.float32)


def test_rows_are_agent_decisions_with_their_own_rewards_ends_and_final_observations():
    """Each valid row is one decision paid what the env pays for it; a1 (joins late, leaves early) ends its 3
    decisions terminated, a0 its 8 truncated; the observation after an ending row is the env's final one (what a
    truncated row bootstraps from); and every decision is shipped exactly once."""
    config = relay_config(**SEPARATE)
    config.validate()
    runner = MultiAgentEnvRunner(config)
    shipped = {"p0": 0, "p1": 0}
    decisions = 0
    for _ in range(6):
        fragment = runner.sample(13)  # not a multiple of the episode length: rows carry over fragments
        decisions += fragment.agent_steps
        for pid, part in fragment.policies.items():
            obs, valid = part.obs, part.valid
            assert (obs[:-1][valid][:, 1] == (pid == "p1")).all()  # each agent's rows go to its policy only
            np.testing.assert_array_equal(part.rewards[valid], _paid(obs[:-1][valid], part.actions[valid]))
            ends = part.terminateds | part.truncateds
            assert not (ends & ~valid).any()
            if pid == "p1":
                assert not part.truncateds.any()
            else:
                assert not part.terminateds.any()
            t, b = np.nonzero(ends)
            final = np.stack([np.zeros(len(t)), np.full(len(t), float(pid == "p1"))], axis=1)
            np.testing.assert_array_equal(obs[t + 1, b], final)  # final observations: no cue, the agent's id bit
            last_real = valid[-1] & ~ends[-1]  # columns that go on: the next decision's observation follows
            assert (obs[-1, last_real, 1] == (pid == "p1")).all() and (np.abs(obs[-1, last_real, 0]) == 1).all()
            for column in range(valid.shape[1]):  # whole episodes inside a column have 3 (a1) or 8 (a0) rows
                rows = np.nonzero(valid[:, column])[0]
                ended = np.nonzero(ends[:, column])[0]
                for first, last in zip(ended[:-1], ended[1:], strict=True):
                    assert ((rows > first) & (rows <= last)).sum() == (3 if pid == "p1" else 8)
            shipped[pid] += int(valid.sum())
    still_open = sum(1 for rows in runner._lanes.values() for row in rows)
    assert shipped["p0"] + shipped["p1"] + still_open == decisions
    assert shipped["p1"] / (shipped["p0"] + shipped["p1"]) == pytest.approx(3 / 11, abs=0.05)


@pytest.mark.parametrize("multi_agent", [{"policies": {"shared"}}, SEPARATE], ids=["shared", "separate"])
def test_agents_that_join_late_and_leave_early_learn_with_shared_and_separate_policies(multi_agent):
    algo = relay_config(**multi_agent).build()
    results = [algo.train() for _ in range(20)]
    last = results[-1]
    assert results[0]["episode_return_mean"] < 9  # random: 5.5, best: 11
    assert last["episode_return_mean"] > 10.3
    # The sum over agents is what episode_return_mean reports; each agent's and policy's own are there too.
    assert last["agent_return_mean/a0"] + last["agent_return_mean/a1"] == pytest.approx(last["episode_return_mean"])
    if "p0" in multi_agent["policies"]:
        assert last["policy_return_mean/p1"] == pytest.approx(last["agent_return_mean/a1"])
        assert "p0/policy_loss" in last and "p1/policy_loss" in last
    assert last["num_agent_steps_sampled"] > last["num_env_steps_sampled"]
    algo.stop()


@pytest.mark.parametrize("algo_name", ["PPO", "IMPALA"])
def test_a_minibatch_larger_than_the_env_steps_of_a_batch_is_its_whole_batch_of_agent_rows(algo_name, monkeypatch):
    """A multi-agent batch holds a row per agent decision, more than its env steps for a shared policy (the
    MAPPO paper's one minibatch per epoch): such a minibatch is accepted, and each step reads every row once."""
    from herdrl.learner.learner import Learner
    from herdrl.registry import get_config_class

    with pytest.raises(ConfigError, match="minibatch_size"):  # single-agent, as before
        get_config_class(algo_name)().environment("CartPole-v1").training(train_batch_size=64,
                                                                          minibatch_size=1000).validate()
    steps, original = [], Learner.gradient_step

    def recording(self, optimizer, loss_fn, batch, index=None, grad_clip=None):
        real = len(batch["actions"]) if "valid" not in batch else int(batch["valid"].sum())
        steps.append((len(batch["actions"]), real, None if index is None else np.sort(index)))
        return original(self, optimizer, loss_fn, batch, index, grad_clip)

    monkeypatch.setattr(Learner, "gradient_step", recording)
    config = (get_config_class(algo_name)().environment("relay").env_runners(num_envs_per_env_runner=4,
                                                                             rollout_fragment_length=16)
              .training(train_batch_size=64, minibatch_size=1000).multi_agent(policies={"shared"})
              .debugging(seed=3))
    if algo_name == "PPO":
        config.training(num_epochs=3)
    algo = config.build()
    result = algo.train()
    assert len(steps) == (3 if algo_name == "PPO" else result["num_gradient_updates"])  # (IMPALA: one per update)
    for rows, real, index in steps:  # every row of the batch, once; more real rows than the batch's 64 env steps
        assert real > 64 and (index is None or np.array_equal(index, np.arange(rows)))
    algo.stop()


def test_a_multi_policy_checkpoint_round_trips_and_loads_one_policy(tmp_path):
    algo = (relay_config(**SEPARATE, policies_to_train={"p1", "p0"})  # a set: saved as a sorted list
            .evaluation(evaluation_interval=12, evaluation_duration=5).build())
    for _ in range(12):
        result = algo.train()
    # Greedy evaluation episodes of every policy (on an env copy of their own): the best return, per agent too.
    assert result["evaluation/num_episodes"] == 5 and result["evaluation/episode_return_mean"] == 11
    assert result["evaluation/agent_return_mean/a1"] == result["evaluation/policy_return_mean/p1"] == 3
    path = algo.save(tmp_path / "ckpt")
    weights = algo.get_weights()
    assert {key.split(".")[0] for key in weights} == {"p0", "p1"}
    # The mapping is a function: a resumed run is given it again.
    restored = herdrl.Algorithm.from_checkpoint(path, policy_mapping_fn=SEPARATE["policy_mapping_fn"])
    assert all(np.array_equal(weights[k], v) for k, v in restored.get_weights().items())
    assert restored.iteration == 12 and restored.train()["training_iteration"] == 13
    restored.stop()
    # The a1 policy names the side opposite the cue; the a0 policy the cue's own.
    p0, p1 = Policy.from_checkpoint(path, policy_id="p0"), Policy.from_checkpoint(path, policy_id="p1")
    cue_up = np.array([1.0, 1.0], np.float32)
    assert p1.compute_single_action(cue_up) == 0 and p0.compute_single_action(np.array([1.0, 0.0], np.float32)) == 1
    assert algo.compute_single_action(cue_up, policy_id="p1") == 0
    with pytest.raises(CheckpointError, match=r"holds policies \['p0', 'p1'\]: pass policy_id="):
        Policy.from_checkpoint(path)
    algo.stop()


def test_bad_mappings_name_the_agent_and_the_policies():
    config = relay_config(policies={"p0", "p1"}, policy_mapping_fn=lambda agent, episode, **kw: "nope")
    with pytest.raises(ConfigError, match=r"mapped agent 'a0' to 'nope', which is not a policy; policies: "
                                          r"\['p0', 'p1'\]"):
        config.build()
    with pytest.raises(ConfigError, match="set policy_mapping_fn"):  # two policies, agents a0/a1: no default
        relay_config(policies={"x", "y"}).build()
    with pytest.raises(ConfigError, match="policies_to_train"):
        relay_config(policies={"p0"}, policies_to_train=["p9"]).validate()
    solo = type("SoloConfig", (PPOConfig,), {"algo_name": "Solo", "supports_multi_agent": False})
    with pytest.raises(ConfigError, match="Solo does not train multi-agent runs: use PPO, A2C, TRPO, IMPALA, APPO"):
        solo().environment("relay").multi_agent(policies={"p"}).validate()


def test_per_agent_without_policies_gives_each_agent_a_policy_of_its_own_spaces_that_learns_and_acts_for_it():
    """policy_mapping_fn='per_agent' and no policies: a policy per agent, named as it. On MPE's speaker and listener
    (other observations and actions) each has its agent's spaces, as the env gives them, and an iteration moves
    each one's weights, and compute_actions acts for each agent with its policy; on the relay each policy's rows
    are its agent's (the id bit they show)."""
    from mpe2 import simple_speaker_listener_v4

    env = simple_speaker_listener_v4.parallel_env()
    config = (PPOConfig().environment("mpe2.simple_speaker_listener_v4", env_config={"max_cycles": 10})
              .training(train_batch_size=40, minibatch_size=40, num_epochs=1).multi_agent(policy_mapping_fn="per_agent")
              .debugging(seed=0))
    algo = config.build()
    assert sorted(algo.policies) == sorted(env.possible_agents) == ["listener_0", "speaker_0"]
    for agent in env.possible_agents:
        assert algo.observation_space[agent] == env.observation_space(agent)
        assert algo.action_space[agent] == env.action_space(agent)
    before = {pid: {k: v.clone() for k, v in algo.module[pid].state_dict().items()} for pid in algo.policies}
    algo.train()
    for pid in algo.policies:
        after = algo.module[pid].state_dict()
        assert any(not torch.equal(after[k], before[pid][k]) for k in after), pid
    observations, _ = env.reset(seed=0)  # (the two agents' observations differ in size: each needs its own policy)
    for agent, action in algo.compute_actions(observations).items():
        assert env.action_space(agent).contains(action)
    algo.stop()

    relay = relay_config(policy_mapping_fn="per_agent")
    relay.validate()
    assert sorted(relay.policies) == ["a0", "a1"]
    runner = MultiAgentEnvRunner(relay)
    for pid, part in runner.sample(16).policies.items():
        assert part.valid.any() and (part.obs[:-1][part.valid][:, 1] == (pid == "a1")).all()
    runner.stop()
    # a dict agent -> policy and no policies: the policies it names, each agent's rows its own policy's
    relay = relay_config(policy_mapping_fn={"a0": "left", "a1": "right"})
    relay.validate()
    assert sorted(relay.policies) == ["left", "right"]
    with pytest.raises(ConfigError, match=r"mapped agent 'a0' to 1, which is not a policy"):  # (not a TypeError)
        relay_config(policy_mapping_fn={"a0": 1, "a1": "right"}).build()
    runner = MultiAgentEnvRunner(relay)
    for pid, part in runner.sample(16).policies.items():
        assert part.valid.any() and (part.obs[:-1][part.valid][:, 1] == (pid == "right")).all()
    runner.stop()


LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def test_turn_based_self_play_never_plays_a_masked_move_and_pays_each_player_its_game():
    """Tic-tac-toe (PettingZoo classic, AEC, action masks): no shipped move is one its mask ruled out, and a
    player's last move is paid +1 exactly when it completes a line of its own marks (read off the board it saw)
    and -1 only when it does not (the opponent's next move won, on the opponent's turn)."""
    config = (PPOConfig().environment("pettingzoo/classic/tictactoe-v3").env_runners(num_envs_per_env_runner=4)
              .training(train_batch_size=256, minibatch_size=64).multi_agent(policies={"main"}).debugging(seed=0))
    algo = config.build()
    assert algo.train()["episode_return_mean"] == 0.0  # zero-sum: the sum over both players
    fragment = algo.runners.runner.sample(60).policies["main"]
    valid, actions = fragment.valid, fragment.actions
    allowed = np.take_along_axis(fragment.obs["action_mask"][:-1], actions[..., None], axis=-1)[..., 0]
    assert valid.sum() > 100 and (allowed[valid] == 1).all()
    final = fragment.terminateds & valid
    assert (fragment.rewards[valid & ~final] == 0).all() and not fragment.truncateds.any()
    mine = fragment.obs["observation"][:-1][..., 0].reshape(*valid.shape, 9).copy()  # the mover's marks
    np.put_along_axis(mine, actions[..., None], 1, axis=-1)  # ...with its move
    wins = np.zeros(valid.shape, bool)
    for line in LINES:
        wins |= mine[..., list(line)].all(axis=-1)
    np.testing.assert_array_equal(fragment.rewards[final] == 1, wins[final])
    assert (fragment.rewards[final] == -1).any() and wins[final].any()
    algo.stop()


@pytest.mark.parametrize("use_lstm", [False, True])
def test_a_turn_based_row_carried_into_the_next_fragment_keeps_the_log_probability_of_the_weights_that_chose_it(
        use_lstm):
    """A fragment cut mid-game leaves each game's last mover waiting for its reward: its row ships with the next
    fragment, sampled after new weights came. PPO's old log-probability for that row is the one of the weights that
    chose the move (PPO's ratio is to the acting policy), not the new weights' again; every other row's is what the
    learner computes (LSTM: from its own unroll, so that the first epoch's ratio stays 1 there)."""
    import copy
    import dataclasses

    from herdrl.models.encoders import to_torch
    from herdrl.obs import obs_map
    from herdrl.rollout.batch import from_sequences, learner_batch

    config = (PPOConfig().environment("pettingzoo/classic/tictactoe-v3").env_runners(num_envs_per_env_runner=4)
              .training(train_batch_size=64, minibatch_size=32, model={"use_lstm": use_lstm, "max_seq_len": 4})
              .multi_agent(policies={"main"}).debugging(seed=0))
    config.validate()
    runner = MultiAgentEnvRunner(config)
    runner.sample(7)  # (games last 5 to 9 moves: most are cut in the middle)
    module = runner.module["main"]
    before = copy.deepcopy(module)
    with torch.no_grad():  # new weights, loaded in place as set_weights does
        for p in module.parameters():
            p.add_(0.5 * torch.randn_like(p))
    part = runner.sample(7).policies["main"]
    runner.stop()
    valid = part.valid
    carried = ~np.isnan(part.logp[valid])  # the rows the runner recorded
    first_rows = valid & (np.cumsum(valid, axis=0) == 1)  # each column's first real row
    assert 1 <= carried.sum() <= 4 and first_rows[valid][carried].all()  # at most one per env copy, at the top
    device = torch.device("cpu")

    def old_logp(fragment):  # the learner's, at the fragment's real rows in grid order
        batch = learner_batch(module, [fragment], config, device)
        if use_lstm:  # (sequences back onto the fragment's grid)
            return from_sequences(batch, batch["old_logp"].numpy(), *valid.shape)[valid]
        return batch["old_logp"].numpy()

    old, recomputed = old_logp(part), old_logp(dataclasses.replace(part, logp=None))
    np.testing.assert_array_equal(old[~carried], recomputed[~carried])  # the others: as the learner computes them
    if not use_lstm:  # the recorded ones: the weights before, against both weights recomputed on their own
        obs = to_torch(obs_map(lambda o: o[:-1][valid], part.obs), device)
        actions = torch.as_tensor(part.actions[valid])
        with torch.no_grad():
            by = {name: net.log_prob_entropy(net(obs)[0], actions)[0].numpy() for name, net in
                  (("before", before), ("after", module))}
        np.testing.assert_allclose(old[carried], by["before"][carried], atol=1e-5)
        np.testing.assert_allclose(recomputed, by["after"], atol=1e-5)
        assert (np.abs(by["before"] - by["after"])[carried] > 1e-3).any()  # (the check can tell them apart)
    else:
        np.testing.assert_array_equal(old[carried], part.logp[valid][carried])
        assert (np.abs(old - recomputed)[carried] > 1e-3).any()


def test_self_play_snapshots_start_as_the_learner_and_move_one_older_each_time():
    config = (PPOConfig().environment("pettingzoo/classic/tictactoe-v3").env_runners(num_envs_per_env_runner=2)
              .training(train_batch_size=64, minibatch_size=32).debugging(seed=0)
              .multi_agent(policies={"main", "v1", "v2"}, self_play={"main": ["v1", "v2"]}, self_play_interval=1,
                           policy_mapping_fn="self_play"))
    algo = config.build()
    weights = lambda pid: {k: v.clone() for k, v in algo.module[pid].state_dict().items()}  # noqa: E731
    same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a)  # noqa: E731
    initial = weights("main")
    assert same(weights("v1"), initial) and same(weights("v2"), initial)
    algo.train()
    first = weights("main")
    assert not same(first, initial) and same(weights("v1"), first) and same(weights("v2"), initial)
    algo.train()
    assert same(weights("v1"), weights("main")) and same(weights("v2"), first)
    algo.stop()


def test_an_action_mask_rules_actions_out_of_sampling_greedy_choice_and_log_probabilities():
    space = gym.spaces.Dict({"action_mask": gym.spaces.Box(0, 1, (4,), np.int8),
                             "observation": gym.spaces.Box(-1, 1, (3,), np.float32)})
    module = ActorCritic(space, gym.spaces.Discrete(4), PPOConfig().model)
    torch.nn.init.normal_(module.pi_head.weight, std=5.0)  # strong preferences, so a mask has work to do
    mask = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1]] * 500, dtype=torch.int8)
    obs = {"action_mask": mask, "observation": torch.randn(1000, 3)}
    sampled = module.act(obs, explore=True)
    assert mask.gather(1, sampled[:, None]).all() and module.act(obs, explore=False)[1::2].eq(3).all()
    dist_inputs, _ = module(obs)
    logp, entropy = module.log_prob_entropy(dist_inputs, sampled)
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
    assert torch.allclose(logp[1::2], torch.zeros(500), atol=1e-6)  # one allowed action: probability 1
    with pytest.raises(ConfigError, match="needs a Discrete action space"):
        ActorCritic(space, gym.spaces.Discrete(5), PPOConfig().model)


@pytest.mark.usefixtures("ray_session")
def test_multi_agent_training_on_two_ray_runners():
    """With centralised critics and value normalisation (MAPPO): Ray runners store the global state too."""
    algo = (relay_config(**SEPARATE, centralized_critic=True).training(value_normalization=True)
            .env_runners(num_env_runners=2, num_envs_per_env_runner=2).build())
    results = [algo.train() for _ in range(15)]
    assert results[-1]["num_healthy_env_runners"] == 2
    assert results[-1]["episode_return_mean"] > 10
    algo.stop()


def test_one_policy_of_a_run_exports_with_its_mask_and_the_cli_evaluates_every_policy(tmp_path, capsys, monkeypatch):
    from herdrl.cli import main
    from herdrl.export import export_policy

    config = (PPOConfig().environment("pettingzoo/classic/tictactoe-v3").env_runners(num_envs_per_env_runner=2)
              .training(train_batch_size=64, minibatch_size=32).multi_agent(policies={"main"}).debugging(seed=0))
    algo = config.build()
    algo.train()
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    program = torch.export.load(export_policy(path, "torch-export", tmp_path / "main.pt2", "main")).module()
    masks = torch.eye(9, dtype=torch.int8)  # row i allows move i only
    boards = torch.zeros(9, 3, 3, 2, dtype=torch.int8)
    names = sorted(["action_mask", "observation"])  # the exported inputs, in leaf order
    inputs = {"action_mask": masks, "observation": boards}
    actions = program(*[inputs[name] for name in names])
    assert actions.tolist() == list(range(9))
    monkeypatch.setattr("herdrl.evaluation.PROGRESS_EVERY_S", 0.0)  # a line every step: long games show progress
    assert main(["evaluate", str(path), "--episodes", "4", "--seed", "1"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "4 episodes (greedy)" in out and "agent_return_mean/player_1" in out and "policy_return_mean/main" in out
    assert "0/4 episodes done, 1 env step\n" in captured.err


@pytest.mark.usefixtures("ray_session")
def test_two_learners_update_every_policy_like_one_learner():
    """Two gloo learners update both policies, in the same order, as one learner does on the whole batch."""
    from herdrl.learner.group import RayLearnerGroup
    from herdrl.learner.multi_agent import MultiAgentLearner

    config = relay_config(**SEPARATE).learners(num_learners=2)
    config.validate()
    runner = MultiAgentEnvRunner(config)
    one = MultiAgentLearner(config, runner.observation_space, runner.action_space)
    group = RayLearnerGroup(config, MultiAgentLearner, runner.observation_space, runner.action_space, init_seed=0)
    group.load_state(one.state())
    for update in range(5):
        fragments = [runner.sample(16)]
        single, split = one.update(fragments, update), group.update(fragments, update)
        assert split["p1/num_gradient_updates"] == single["p1/num_gradient_updates"]
        if update == 0:
            diff = max(float(np.abs(v - group.get_weights()[k]).max()) for k, v in one.get_weights().items())
            assert diff < 1e-5
        runner.set_weights(one.get_weights())
    ranks = group.call("get_weights")
    assert all(np.array_equal(ranks[0][k], ranks[1][k]) for k in ranks[0])
    group.stop()


def test_the_self_play_mapping_plays_every_side_in_turn_against_each_snapshot():
    from herdrl.multi_agent import EpisodeInfo, PolicyMapper

    mapper = PolicyMapper("self_play", ["main", "v1", "v2"], ["x", "o"], {"main": ["v1", "v2"]})
    table = [(mapper("x", EpisodeInfo("", 0, 0, i)), mapper("o", EpisodeInfo("", 0, 0, i))) for i in range(4)]
    assert table == [("main", "v1"), ("v1", "main"), ("main", "v2"), ("v2", "main")]
    with pytest.raises(ConfigError, match="policy_mapping_fn='self_play' needs self_play="):
        relay_config(policies={"p0", "p1"}, policy_mapping_fn="self_play").validate()


def test_an_mpe_env_made_by_module_name_runs_through_its_aec_to_parallel_wrapper():
    """MPE's parallel_env() is an AEC env under PettingZoo's aec_to_parallel wrapper: stepped as a Parallel env,
    every live agent decides each step and all are truncated after max_cycles."""
    config = (PPOConfig().environment("mpe2.simple_spread_v3", env_config={"max_cycles": 5})
              .env_runners(num_envs_per_env_runner=2).debugging(seed=0))
    config.validate()
    runner = MultiAgentEnvRunner(config)
    fragment = runner.sample(12)
    assert fragment.env_steps == 24 and fragment.agent_steps == 72
    assert len(fragment.episode_returns) == 4 and fragment.episode_lengths == [5] * 4
    part = fragment.policies["default_policy"]
    assert part.truncateds.sum() == 12 and not part.terminateds.any()


def test_value_targets_follow_each_agent_through_padding_episode_breaks_and_fragment_ends():
    """The learner's GAE (lambda 1) on a policy's fragment gives each decision the discounted sum of that agent's
    later rewards in its episode, plus the discounted value of its final observation (truncated) or of its next
    decision after the fragment (still going); nothing after a termination: computed here by walking each
    column's real rows only."""
    from herdrl.rollout.batch import on_policy_batch

    config = relay_config(**SEPARATE).training(gamma=0.9)
    config.validate()
    runner = MultiAgentEnvRunner(config)
    runner.sample(7)
    for pid, part in runner.sample(13).policies.items():
        module = runner.module[pid]
        value = lambda o, module=module: float(module.value(torch.as_tensor(o[None]))[0])  # noqa: E731
        expected = np.zeros(part.valid.shape)
        for b in range(part.valid.shape[1]):
            rows = np.nonzero(part.valid[:, b])[0]
            for i, t in enumerate(rows):
                total, discount = 0.0, 1.0
                for u in rows[i:]:
                    total += discount * part.rewards[u, b]
                    discount *= 0.9
                    if part.terminateds[u, b] or part.truncateds[u, b]:
                        total += discount * value(part.obs[u + 1, b]) if part.truncateds[u, b] else 0.0
                        break
                else:
                    total += discount * value(part.obs[-1, b])
                expected[t, b] = total
        batch = on_policy_batch(module, [part], 0.9, 1.0, torch.device("cpu"))
        np.testing.assert_allclose(batch["returns"].numpy(), expected[part.valid], atol=1e-5)


def test_a_pettingzoo_module_id_must_be_a_plain_module_path():
    from herdrl import EnvError
    from herdrl.env.multi_agent import make_agent_env

    with pytest.raises(EnvError, match="names no valid module"):
        make_agent_env("mpe2.simple_spread_v3; import os")


def test_fragments_of_two_runners_with_different_lengths_learn_together():
    """A policy's fragment is as long as its busiest column, so two runners' fragments differ in length (tic-tac-toe
    games vary); the learner aligns them with invalid rows in front, which leave every real row's advantage as its
    own fragment gives it."""
    from herdrl.learner.multi_agent import MultiAgentLearner
    from herdrl.rollout.batch import on_policy_batch
    from herdrl.rollout.multi_agent import pad_front

    config = (PPOConfig().environment("pettingzoo/classic/tictactoe-v3").env_runners(num_envs_per_env_runner=4)
              .training(train_batch_size=256, minibatch_size=64).multi_agent(policies={"main"}).debugging(seed=0))
    config.validate()
    runners = [MultiAgentEnvRunner(config, worker_index=i) for i in (1, 2)]
    learner = MultiAgentLearner(config, runners[0].observation_space, runners[0].action_space)
    for _ in range(5):
        fragments = [runner.sample(config.fragment_length()) for runner in runners]
        short, long = sorted((f.policies["main"] for f in fragments), key=lambda part: len(part.valid))
        if len(short.valid) < len(long.valid):
            break
    assert len(short.valid) < len(long.valid)
    module, device = learner.learners["main"].module, torch.device("cpu")
    alone = on_policy_batch(module, [short], 0.99, 0.95, device)
    padded = pad_front(short, len(long.valid))
    assert padded.valid.sum() == short.valid.sum() and len(padded.obs["observation"]) == len(long.obs["observation"])
    together = on_policy_batch(module, [padded, long], 0.99, 0.95, device)
    side_by_side = np.concatenate([padded.valid, long.valid], axis=1).reshape(-1)
    mine = np.concatenate([padded.valid, np.zeros_like(long.valid)], axis=1).reshape(-1)[side_by_side]
    for key in ("advantages", "returns", "old_logp"):
        torch.testing.assert_close(together[key][torch.from_numpy(mine)], alone[key])
    assert learner.update(fragments, 0)["main/num_gradient_updates"] > 0


# The multi-agent matrix: every algorithm the docs call multi-agent, on a turn-based and a parallel env.
def documented_multi_agent_algorithms() -> list[str]:
    """The algorithms docs/multi_agent.md lists ("Algorithms: **PPO, A2C, TRPO, ...**")."""
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "multi_agent.md").read_text()
    listed = re.search(r"Algorithms: \*\*(.+?)\*\*", text).group(1)
    return sorted(re.split(r",\s*|\s+and\s+", listed))


MULTI_AGENT_ALGORITHMS = documented_multi_agent_algorithms()
MULTI_AGENT_ENVS = {  # env id -> multi_agent settings
    "pettingzoo/classic/tictactoe-v3": {"policies": {"main"}},  # turn-based, masked moves, one shared policy
    "relay": SEPARATE,  # parallel, agents join late and leave early, a policy each
}
CONTINUOUS = {"SAC", "TD3", "DDPG"}  # Box actions: the relay with continuous actions, shared and separate policies
CONTINUOUS_ENVS = ["relay-continuous-shared", "relay-continuous"]
MATRIX = [(algo, env) for algo in MULTI_AGENT_ALGORITHMS
          for env in (CONTINUOUS_ENVS if algo in CONTINUOUS else sorted(MULTI_AGENT_ENVS))]


def test_an_algorithm_overriding_build_module_is_refused_where_it_is_defined():
    """Overriding build_module (not build_policy_module) is how TRPO lost multi-agent runs: a TypeError at once."""
    from herdrl.config import AlgorithmConfig

    with pytest.raises(TypeError, match="override build_policy_module"):
        type("MyConfig", (AlgorithmConfig,), {"build_module": lambda self, obs, act: None})


def test_the_documented_multi_agent_algorithms_are_the_ones_that_take_a_multi_agent_config():
    from herdrl.registry import ALGORITHMS, get_config_class

    supported = sorted(name for name in ALGORITHMS if get_config_class(name).supports_multi_agent)
    assert MULTI_AGENT_ALGORITHMS == supported


@pytest.mark.parametrize("algo_name,env", MATRIX)
def test_every_multi_agent_algorithm_trains_turn_based_and_parallel_envs(algo_name, env):
    """Discrete algorithms on tic-tac-toe (turn-based) and the relay (parallel); SAC, TD3 and DDPG on the relay with
    continuous actions, once with a policy per agent and once with one shared policy."""
    from herdrl.registry import get_config_class

    training = {"train_batch_size": 256}
    if algo_name in {"DQN", *CONTINUOUS}:  # learning from the first iteration's replay
        training = {"train_batch_size": 32, "num_steps_sampled_before_learning_starts": 64,
                    "min_sample_timesteps_per_iteration": 256, "training_intensity": 32.0}
    env_config, multi_agent = {}, MULTI_AGENT_ENVS.get(env)
    if env.startswith("relay-continuous"):
        env_config = {"continuous": True}
        multi_agent = {"policies": {"shared"}} if env.endswith("shared") else SEPARATE
        env = "relay"
    config = (get_config_class(algo_name)().environment(env, env_config=env_config)
              .env_runners(num_envs_per_env_runner=4).training(**training).multi_agent(**multi_agent)
              .debugging(seed=0))
    algo = config.build()
    before = {pid: {k: v.clone() for k, v in algo.module[pid].state_dict().items()} for pid in algo.policies}
    result = algo.train()
    for pid in algo.policies:  # each policy's weights moved: it learned from its own agents' rows
        after = algo.module[pid].state_dict()
        assert any(not torch.equal(after[k], before[pid][k]) for k in after), pid
    assert result["num_agent_steps_sampled"] >= 100
    if "replay_buffer_size/p1" in result:  # relay, a replay buffer per agent's policy: a0 decides at every step,
        steps = result["num_env_steps_sampled_lifetime"]  # a1 at 3 of 8 (whole episodes per fragment)
        assert (result["replay_buffer_size/p0"], result["replay_buffer_size/p1"]) == (steps, steps * 3 // 8)
    algo.stop()


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("algo_name,training", [
    ("TRPO", {"train_batch_size": 128}),
    ("DQN", {"num_steps_sampled_before_learning_starts": 64, "min_sample_timesteps_per_iteration": 128}),
    ("APPO", {"train_batch_size": 400}),  # asynchronous: fragments as they come
])
def test_a_turn_based_game_trains_on_two_ray_runners(algo_name, training):
    from herdrl.registry import get_config_class

    algo = (get_config_class(algo_name)().environment("pettingzoo/classic/tictactoe-v3").env_runners(
        num_env_runners=2, num_envs_per_env_runner=2).training(**training)
        .multi_agent(policies={"main"}).debugging(seed=0)).build()
    results = [algo.train() for _ in range(2)]
    assert results[-1]["num_healthy_env_runners"] == 2 and results[-1]["num_episodes_lifetime"] > 0
    if algo_name == "APPO":  # the policy's own lag, from the versions its fragments were stamped with
        row = results[-1]
        # A fragment waits at most while the queue and the calls in flight (circular_buffer_num_batches = 4 batches
        # in all) are learned, each batch 2 passes (circular_buffer_iterations_per_batch), the weights it was
        # sampled with up to one broadcast old: under load (a slow learner) the lag reaches that, not less.
        assert 0 <= row["policy_lag_mean/main"] <= row["policy_lag_max/main"] <= (4 + 1) * 2 + 1
    algo.stop()


RAINBOW_LITE = {"n_step": 3, "dueling": True, "double_q": True, "replay_buffer_config": {"type": "prioritized"}}


@pytest.mark.parametrize("options", [{}, RAINBOW_LITE], ids=["plain", "nstep-dueling-per"])
def test_dqn_learns_a_shared_policy_from_each_agents_own_replayed_rows(options):
    """DQN with one policy for two agents that join late and leave early: it must read the id bit to answer both
    (best return 11, random 5.5), learning from a buffer of both agents' decisions, each in its own time; with
    3-step returns, a dueling head and prioritized replay as well as without."""
    from herdrl import DQNConfig
    from herdrl.buffers import PrioritizedReplayBuffer

    algo = (DQNConfig().environment("relay").env_runners(num_envs_per_env_runner=4)
            .training(lr=3e-3, train_batch_size=32, num_steps_sampled_before_learning_starts=200,
                      min_sample_timesteps_per_iteration=256, epsilon=[[0, 1.0], [1000, 0.05]],
                      training_intensity=4.0, model={"fcnet_hiddens": [32]}, **options)
            .multi_agent(policies={"shared"}).debugging(seed=3)).build()
    results = [algo.train() for _ in range(6)]
    assert results[0]["episode_return_mean"] < 7
    # Greedy play near the best; the training mean (epsilon 0.05, over the last 100 episodes) well past random.
    assert results[-1]["evaluation/episode_return_mean"] >= 10.5 and results[-1]["episode_return_mean"] > 9
    assert results[-1]["epsilon/shared"] == pytest.approx(0.05) and results[-1]["replay_buffer_size/shared"] > 1000
    assert results[-1]["shared/loss"] >= 0 and results[-1]["num_gradient_updates"] > 0
    buffer = algo.streams["shared"].buffer
    assert isinstance(buffer, PrioritizedReplayBuffer) == bool(options)
    if options:  # the policy's TD errors came back as its rows' priorities: no longer all the initial one
        leaves = buffer.tree[buffer.tree_size:][:len(buffer)]
        assert leaves.min() < leaves.max()
    assert (algo.module["shared"].value_head is not None) == bool(options)
    algo.stop()


def test_n_step_transitions_of_each_agent_sum_its_own_next_decisions_rewards():
    """DQN's 3-step transitions in a multi-agent run: each is built from the next decisions of the same agent in
    the same episode (a1 decides 3 times per episode and ends terminated, a0 8 times and is truncated), computed
    here from each column's episodes, cut at the fragment's end; the buffer of each policy holds exactly these."""
    from herdrl import DQNConfig

    gamma, n = 0.9, 3
    algo = (DQNConfig().environment("relay").env_runners(num_envs_per_env_runner=3)
            .training(gamma=gamma, n_step=n, num_steps_sampled_before_learning_starts=10_000)
            .multi_agent(**SEPARATE).debugging(seed=5)).build()
    runner = algo.runners.runner
    runner.sample(5)
    fragment = runner.sample(21)  # episodes of 8 env steps: starts and ends inside the fragment, rows carried over
    for pid, part in fragment.policies.items():
        valid, ends = part.valid, part.terminateds | part.truncateds
        expected = {}  # (row, column) -> (n-step reward, discount, next observation)
        for column in range(valid.shape[1]):
            rows = list(np.nonzero(valid[:, column])[0])
            episodes, current = [], []
            for row in rows:
                current.append(row)
                if ends[row, column]:
                    episodes.append(current)
                    current = []
            episodes.append(current)
            for episode in episodes:
                for j, row in enumerate(episode):
                    used = episode[j:j + n]
                    reward = sum(gamma ** k * part.rewards[r, column] for k, r in enumerate(used))
                    discount = 0.0 if part.terminateds[used[-1], column] else gamma ** len(used)
                    expected[row, column] = (reward, discount, part.obs[used[-1] + 1, column])
        whole = []  # (facts of the env, not of the layout) each whole episode of a1: 3 decisions, then terminated
        for column in range(valid.shape[1]):
            rows = np.nonzero(valid[:, column])[0]
            ended = rows[ends[rows, column]]
            if pid == "p1":
                assert len(ended) and all(part.terminateds[ended, column])
                np.testing.assert_array_equal(part.obs[ended + 1, column], [[0.0, 1.0]] * len(ended))
                whole += [int(np.sum((rows > a) & (rows <= b))) for a, b in zip(ended, ended[1:], strict=False)]
        assert (pid == "p0") or (whole and set(whole) == {3})
        discounts = {e[1] for e in expected.values()}
        if pid == "p0":  # a0: 8 decisions, truncated: whole 3-step sums and sums cut short, never a terminal one
            assert gamma ** n in discounts and max(discounts) > gamma ** n and 0.0 not in discounts
        else:  # a1: 3 decisions, then terminated: its sums reach that end
            assert 0.0 in discounts
        order = sorted(expected)  # the buffer's order: time, then column
        before = len(algo.streams[pid].buffer)
        algo.store(pid, part)
        stored = algo.streams[pid].buffer
        assert len(stored) - before == len(order)
        slots = np.arange(before, len(stored))
        data = stored._gather(slots)
        np.testing.assert_allclose(data["rewards"], [expected[key][0] for key in order], rtol=1e-6)
        np.testing.assert_allclose(data["discounts"], [expected[key][1] for key in order], rtol=1e-6)
        np.testing.assert_array_equal(data["next_obs"], np.stack([expected[key][2] for key in order]))
        np.testing.assert_array_equal(data["obs"], np.stack([part.obs[key] for key in order]))
    algo.stop()


def test_a_zero_sum_turn_based_run_reports_its_score_against_random_legal_moves():
    """Tic-tac-toe's summed return is 0 whatever the policy: the rows carry the policy's score against uniformly
    random legal moves instead, checked against games played here with the public API (seats alternating)."""
    from pettingzoo.classic import tictactoe_v3

    config = (PPOConfig().environment("pettingzoo/classic/tictactoe-v3").env_runners(num_envs_per_env_runner=8)
              .training(train_batch_size=512, minibatch_size=128).debugging(seed=0)
              .multi_agent(policies={"main"}, random_opponent_interval=2, random_opponent_games=400))
    algo = config.build()
    rows = [algo.train() for _ in range(4)]
    assert "score_vs_random/main" not in rows[0] and "score_vs_random/main" in rows[1]  # every 2nd iteration
    reported = rows[3]["score_vs_random/main"]
    rng = np.random.default_rng(1)
    env = tictactoe_v3.env()
    results = []
    for game in range(400):
        env.reset(seed=10_000 + game)
        seat = env.possible_agents[game % 2]
        for agent in env.agent_iter():
            obs, reward, terminated, truncated, _ = env.last()
            if terminated or truncated:
                if agent == seat:
                    results.append(np.sign(reward))
                action = None
            elif agent == seat:
                action = algo.compute_single_action(obs, policy_id="main")
            else:
                action = int(rng.choice(np.flatnonzero(obs["action_mask"])))
            env.step(action)
    mine = float(np.mean(results))
    assert abs(reported - mine) < 0.15, (reported, mine)  # two estimates of one number, 400 games each
    assert mine > 0.2  # a few iterations already beat random play (a random policy scores ~0 over both seats)
    algo.stop()
    relay = relay_config(policies={"shared"}).multi_agent(random_opponent_interval=1).build()
    assert not [key for key in relay.train() if key.startswith("score_vs_random")]  # not zero-sum, not turn-based
    relay.stop()


def test_sac_learns_a_shared_continuous_policy_from_each_agents_own_replayed_rows():
    """SAC, one policy for both relay agents with continuous actions (pay 1 - |action - side| / 2: best 11, uniform
    random 5.5; ignoring the id bit at most 8): it must read the id bit to answer both, learning from both agents'
    decisions in their own time."""
    from herdrl import SACConfig

    algo = (SACConfig().environment("relay", env_config={"continuous": True}).env_runners(num_envs_per_env_runner=4)
            .training(num_steps_sampled_before_learning_starts=200, min_sample_timesteps_per_iteration=256, lr=3e-3,
                      training_intensity=64.0, train_batch_size=64, model={"fcnet_hiddens": [32, 32]})
            .multi_agent(policies={"shared"}).debugging(seed=3)).build()
    results = [algo.train() for _ in range(8)]
    assert results[0]["episode_return_mean"] < 7  # its first episodes: the initial, near-random policy
    assert results[-1]["evaluation/episode_return_mean"] >= 9.8 and results[-1]["shared/critic_loss"] >= 0
    algo.stop()


def test_dqn_explores_each_policy_at_its_own_agent_steps_and_snapshots_at_the_schedules_end():
    """Relay: a0 decides at every env step, a1 at 3 of every 8; a linear epsilon over 1,000 agent steps is then
    further along for a0's policy than a1's, computed here from the env steps; a policy that does not learn plays
    at the schedule's end (0.05). The runner's policies act with those epsilons."""
    from herdrl import DQNConfig

    def linear(env_steps: int) -> dict[str, float]:  # each policy's epsilon after env_steps, by its agents' moves
        return {"a0": 1.0 - 0.95 * min(1.0, env_steps / 1000), "a1": 1.0 - 0.95 * min(1.0, env_steps * 3 / 8 / 1000)}

    for trained in (["a0", "a1"], ["a0"]):
        algo = (DQNConfig().environment("relay").env_runners(num_envs_per_env_runner=2, rollout_fragment_length=64)
                .training(epsilon=[[0, 1.0], [1000, 0.05]], min_sample_timesteps_per_iteration=128,
                          num_steps_sampled_before_learning_starts=10_000)
                .multi_agent(policies={"a0", "a1"}, policy_mapping_fn="per_agent", policies_to_train=trained)
                .debugging(seed=0)).build()
        algo.train()
        row = algo.train()  # one round of 2 x 64 steps (whole 8-step episodes) per iteration
        assert row["num_env_steps_sampled_lifetime"] == 256
        at_row, at_round = linear(256), linear(128)  # the row's; the one its round was sampled with
        assert {k: v for k, v in row.items() if k.startswith("epsilon/")} == pytest.approx(
            {f"epsilon/{pid}": at_row[pid] for pid in trained})
        runner = algo.runners.runner
        assert {pid: runner.policies[pid].epsilon for pid in ("a0", "a1")} == pytest.approx(
            {pid: at_round[pid] if pid in trained else 0.05 for pid in ("a0", "a1")})
        algo.stop()
    assert at_row["a0"] < at_row["a1"] < 1.0  # (each policy its own count)


def test_td3_acts_at_random_for_each_trained_policys_first_agent_steps_and_keys_every_policy_shares_are_refused():
    from herdrl import TD3Config

    def relay(**training):
        return (TD3Config().environment("relay", env_config={"continuous": True}).env_runners(
            num_envs_per_env_runner=2).training(min_sample_timesteps_per_iteration=32, **training)
            .multi_agent(policies={"a0", "a1", "a2"}, policy_mapping_fn="per_agent", policies_to_train=["a0", "a1"])
            .debugging(seed=0))

    algo = relay(num_steps_sampled_before_learning_starts=40).build()  # a0: 32 agent steps a round, a1: 12
    algo.train()
    algo.train()  # the second round was sampled after a0's 32 and a1's 12 agent steps
    assert {pid: policy.random_actions for pid, policy in algo.runners.runner.policies.items()} == \
        {"a0": True, "a1": True, "a2": False}  # a2 never learns: its actor acts from the start
    algo.train()  # a0 at 64 >= 40: its actor; a1 at 24: still at random
    assert {pid: policy.random_actions for pid, policy in algo.runners.runner.policies.items()} == \
        {"a0": False, "a1": True, "a2": False}
    algo.stop()
    for key, value in (("twin_q", False), ("exploration_noise", 0.5), ("min_sample_timesteps_per_iteration", 8)):
        config = relay().multi_agent(policies={"a0": {"config": {key: value}}, "a1": None, "a2": None})
        with pytest.raises(ConfigError, match=f"policy 'a0' config key '{key}' is shared by every policy"):
            config.validate()
    config = relay().multi_agent(policies={"a0": {"config": {"replay_buffer_config": {"type": "prioritised"}}},
                                           "a1": None, "a2": None})
    with pytest.raises(ConfigError, match="prioritised"):
        config.validate()


def test_a_multi_agent_dqn_checkpoint_keeps_each_policys_buffer_targets_and_replay_accounting(tmp_path):
    from herdrl import Algorithm, DQNConfig

    config = (DQNConfig().environment("relay").env_runners(num_envs_per_env_runner=2)
              .training(num_steps_sampled_before_learning_starts=64, min_sample_timesteps_per_iteration=100,
                        train_batch_size=16, store_buffer_in_checkpoints=True)
              .multi_agent(policies={"a0", "a1"}, policy_mapping_fn="per_agent").debugging(seed=0))
    algo = config.build()
    algo.train()
    algo.train()
    path = algo.save(tmp_path / "ckpt")
    assert {p.name for p in path.glob("replay_buffer*.npz")} == {"replay_buffer.a0.npz", "replay_buffer.a1.npz"}
    restored = Algorithm.from_checkpoint(path)
    for pid in ("a0", "a1"):
        mine, theirs = algo.streams[pid], restored.streams[pid]
        assert len(theirs.buffer) == len(mine.buffer) > 0
        for key, value in mine.buffer.state().items():
            assert np.array_equal(theirs.buffer.state()[key], value), (pid, key)
        assert (theirs.debt, theirs.pending_clock) == (mine.debt, mine.pending_clock)
        for a, b in zip(algo.learner.learners[pid].target.parameters(),
                        restored.learner.learners[pid].target.parameters(), strict=True):
            assert torch.equal(a, b)
    assert len(algo.streams["a0"].buffer) != len(algo.streams["a1"].buffer)  # each its own agent's rows
    assert restored.train()["num_gradient_updates"] > 0
    algo.stop()
    restored.stop()


def impala_relay_config(algo_name="IMPALA", **training):
    from herdrl.registry import get_config_class

    return (get_config_class(algo_name)().environment("relay")
            .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=16)
            .training(**{"train_batch_size": 64, "lr": 3e-3, **training}).multi_agent(**SEPARATE).debugging(seed=3))


def test_vtrace_targets_follow_each_agent_through_padding_episode_breaks_and_fragment_ends():
    """IMPALA's V-trace on a policy's fragment (padded in front, as beside a longer one) gives each decision the
    targets of the V-trace recursion walked over that agent's own real rows, here: importance weights of the
    moved policy against the logged behaviour log-probabilities, clipped at rho-bar and c-bar, cut at
    terminations, bootstrapped from the final observation on truncation and from the last observation at the
    fragment's end."""
    from herdrl.algorithms.impala import vtrace_batch
    from herdrl.rollout.multi_agent import pad_front

    config = impala_relay_config(gamma=0.9, vtrace_clip_rho_threshold=1.2)
    config.validate()
    runner = MultiAgentEnvRunner(config)
    runner.sample(7)
    fragment = runner.sample(13)
    torch.manual_seed(0)
    p0, p1 = fragment.policies["p0"], fragment.policies["p1"]  # a0 is truncated at step 8, a1 terminates at 5
    assert p0.truncateds.any() and p1.terminateds.any() and not p0.terminateds.any()
    breaks = [b for b in range(p0.valid.shape[1]) if (np.diff(p0.valid[:, b].astype(int)) == 1).any()]
    assert breaks  # an episode break: an invalid row between two episodes' rows
    for pid, part in fragment.policies.items():
        module = runner.module[pid]
        with torch.no_grad():  # the learner has moved on since the rows were sampled: ratios differ from 1
            for weight in module.parameters():
                weight.add_(0.3 * torch.randn_like(weight))
        value = lambda o, module=module: float(module.value(torch.as_tensor(o[None]))[0])  # noqa: E731

        def logp(o, a, module=module):
            dist_inputs, _ = module(torch.as_tensor(o[None]))
            return float(module.log_prob_entropy(dist_inputs, torch.as_tensor(a[None]))[0][0])

        expected = np.zeros(part.valid.shape)
        for b in range(part.valid.shape[1]):
            rows = list(np.nonzero(part.valid[:, b])[0])
            later = None  # (vs, V) of the row after, in the same episode
            for t in reversed(rows):
                ratio = np.exp(logp(part.obs[t, b], part.actions[t, b]) - part.logp[t, b])
                rho, c = min(1.2, ratio), min(1.0, ratio)
                v = value(part.obs[t, b])
                if part.terminateds[t, b]:
                    next_v, later = 0.0, None
                elif part.truncateds[t, b]:
                    next_v, later = value(part.obs[t + 1, b]), None
                elif later is None:  # the column's last row, its episode still going: bootstrap
                    next_v = value(part.obs[-1, b])
                else:
                    next_v = later[1]
                vs = v + rho * (part.rewards[t, b] + 0.9 * next_v - v)
                if later is not None:
                    vs += 0.9 * c * (later[0] - later[1])
                expected[t, b] = vs
                later = (vs, v)
        batch = vtrace_batch(module, [pad_front(part, len(part.valid) + 3)], config, torch.device("cpu"))
        np.testing.assert_allclose(batch["vs"].numpy(), expected[part.valid], atol=1e-5)


def test_impala_learns_a_policy_per_agent_from_v_trace_on_each_agents_rows():
    algo = impala_relay_config().build()
    results = [algo.train() for _ in range(8)]
    assert results[-1]["episode_return_mean"] > 10  # 11 at best, 5.5 at random
    algo.stop()


@pytest.mark.parametrize("algo_name", ["IMPALA", "APPO"])
def test_asynchronous_algorithms_version_each_policy_by_its_own_updates_and_resume_them(algo_name, tmp_path):
    """Policy "b" plays a1 in one episode of three: it is updated only on batches with its rows, so its version
    (its updates) trails "a"'s; the runner samples with the versions of the last broadcast (every 3rd update), and
    a restored run (with another lr) goes on from the saved versions."""
    from herdrl.learner.multi_agent import MultiAgentLearner

    def rare_b(agent, episode, **kw):
        return "b" if agent == "a1" and episode.episode_index % 3 == 0 else "a"

    config = (impala_relay_config(algo_name, train_batch_size=16, broadcast_interval=3, num_updates_per_iteration=4)
              .env_runners(num_envs_per_env_runner=1, rollout_fragment_length=16)
              .multi_agent(policies={"a", "b"}, policy_mapping_fn=rare_b))
    algo = config.build()
    counts, history = {"a": 0, "b": 0}, [{"a": 0, "b": 0}]  # history[n]: each policy's updates after n batches
    inner = algo.learners.learner
    passes = config.circular_buffer_iterations_per_batch
    for pid, learner in inner.learners.items():
        def counted(*args, pid=pid, update=learner.update):
            counts[pid] += passes
            return update(*args)
        learner.update = counted
    outer = inner.update

    def recorded(*args):
        result = outer(*args)
        history.append(dict(counts))
        return result
    inner.update = recorded
    results = [algo.train() for _ in range(6)]
    batches = len(history) - 1
    assert algo.policy_updates == counts and 0 < counts["b"] < counts["a"] == batches * passes
    broadcast_at = max(n for n in range(batches + 1) if n == 0 or n * passes // 3 > (n - 1) * passes // 3)
    assert algo.sampler.runner.weights_version == history[broadcast_at]
    lags = [r for r in results if "policy_lag_max/a" in r]
    assert lags and all(0 <= r["policy_lag_max/a"] <= 2 and "policy_lag_mean/b" in r for r in lags)
    assert isinstance(algo.learners.learner, MultiAgentLearner)
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    restored = config.copy().training(lr=1e-4).build()
    restored.restore(path)
    assert restored.policy_updates == counts and restored.learners.learner.learners["a"].hp["lr"] == 1e-4
    restored.train()
    assert restored.policy_updates["a"] > counts["a"]
    restored.stop()


def test_a_global_state_without_the_envs_state_is_every_agents_latest_observation():
    """CueRelay has no state(): the global state is a0's and a1's latest observations side by side, zeros for a1
    before it joins, its final observation after it left — built here from what each step returned."""
    from herdrl.env.multi_agent import make_agent_env

    env = make_agent_env("relay")
    env.track_observations = True
    step = env.reset(seed=1)
    assert env.global_state_space().shape == (4,)
    latest = {"a0": np.zeros(2, np.float32), "a1": np.zeros(2, np.float32)}
    steps = 0
    while True:
        for agent, obs in step.decide.items():
            latest[agent] = obs
        for agent, (_, _, obs) in step.ended.items():
            latest[agent] = obs
        np.testing.assert_array_equal(env.global_state(), np.concatenate([latest["a0"], latest["a1"]]))
        if step.over:
            break
        step = env.step({agent: 1 for agent in step.decide})
        steps += 1
    assert steps == 8 and latest["a1"][0] == 0.0  # a1 left: its final observation (no cue) stays in the state


class StatedTwoStep(TwoStepGame):
    """The two-step game with a ``state()`` that is not its agents' observations (each a one-hot of the step):
    ``[10 k + 3, -1, k, 7]`` for step code k, 4 numbers where the observations side by side would be 6."""

    def state(self) -> np.ndarray:
        return np.array([10 * self._state + 3, -1, self._state, 7], np.float32)

    def _observe(self) -> dict[str, np.ndarray]:
        return {agent: np.eye(3, dtype=np.float32)[self._state] for agent in self.agents}


herdrl.register_env("stated_two_step", lambda cfg: StatedTwoStep(cfg))


def test_a_centralised_critic_reads_the_envs_own_state_not_the_observations_side_by_side():
    """Where the env has a ``state()``, the critic's input at each decision is that state: every stored row's
    global state is the one the env gave at the step its own observation shows."""
    config = (PPOConfig().environment("stated_two_step").env_runners(num_envs_per_env_runner=3)
              .training(train_batch_size=24, minibatch_size=12)
              .multi_agent(policies={"shared"}, centralized_critic=True).debugging(seed=0))
    config.validate()
    runner = MultiAgentEnvRunner(config)
    part = runner.sample(8).policies["shared"]
    runner.stop()
    own, state = part.obs["own_observation"], part.obs["global_state"]
    assert state.shape[-1] == 4
    rows = 0
    for t, b in zip(*np.nonzero(part.valid), strict=True):
        k = int(np.argmax(own[t, b]))
        np.testing.assert_array_equal(state[t, b], [10 * k + 3, -1, k, 7])
        rows += 1
    assert rows >= 2 * 3 * 3  # both agents, at both steps, in every env copy


def test_a_centralised_critic_reads_the_envs_global_state_at_each_decision_and_the_actor_its_own_observation(
        tmp_path):
    """MPE simple_spread's state() is its three agents' observations side by side: every row a shared policy
    stores holds, beside its agent's observation, the state whose blocks are the observations of the three rows
    of that env step. The checkpoint's policy acts on an agent's observation alone, as its export does."""
    from herdrl.export import export_policy

    config = (PPOConfig().environment("mpe2.simple_spread_v3", env_config={"max_cycles": 25})
              .env_runners(num_envs_per_env_runner=2).training(train_batch_size=150, minibatch_size=50)
              .multi_agent(policies={"shared"}, centralized_critic=True).debugging(seed=0))
    config.validate()
    runner = MultiAgentEnvRunner(config)
    part = runner.sample(30).policies["shared"]
    own, state = part.obs["own_observation"], part.obs["global_state"]
    assert own.shape[-1] == 18 and state.shape[-1] == 54
    checked = 0
    for t in range(len(part.valid)):
        rows = [b for b in range(part.valid.shape[1]) if part.valid[t, b]]
        by_state: dict[bytes, list[int]] = {}
        for b in rows:
            by_state.setdefault(state[t, b].tobytes(), []).append(b)
        assert len(by_state) <= 2  # one state per env copy (fewer where an episode break or padding is)
        for columns in by_state.values():
            assert len(columns) == 3
            blocks = sorted(state[t, columns[0]].reshape(3, 18).tolist())
            assert blocks == sorted(own[t, b].tolist() for b in columns)
            checked += 1
    assert checked == 2 * 30
    runner.stop()

    algo = config.build()
    algo.train()
    path = algo.save(tmp_path / "ckpt")
    obs = own[-1, :4].copy()
    live = [algo.compute_single_action(row, policy_id="shared") for row in obs]
    algo.stop()
    policy = Policy.from_checkpoint(path, policy_id="shared")
    assert policy.observation_space == gym.spaces.Box(-np.inf, np.inf, (18,), np.float32)
    assert policy.compute_actions(obs).tolist() == live
    program = torch.export.load(export_policy(path, "torch-export", tmp_path / "p.pt2", "shared")).module()
    assert program(torch.as_tensor(obs)).tolist() == policy.compute_actions(obs).tolist()


@pytest.mark.parametrize("algo_name", ["PPO", "A2C", "TRPO"])
def test_centralised_critics_learn_beside_actors_that_see_their_own_observations(algo_name):
    """Each policy's actor and critic move; PPO's learns the relay (11 at best, 5.5 at random)."""
    from herdrl.registry import get_config_class

    training = {"train_batch_size": 256, "lr": 3e-3, **({"minibatch_size": 64} if algo_name == "PPO" else {})}
    algo = (get_config_class(algo_name)().environment("relay").env_runners(num_envs_per_env_runner=4)
            .training(**training).multi_agent(**SEPARATE, centralized_critic=True).debugging(seed=3)).build()
    before = {pid: {k: v.clone() for k, v in algo.module[pid].state_dict().items()} for pid in algo.policies}
    module = algo.module["p0"]  # the actor: its agent's observation; the critic: that and both agents'
    assert (module.pi_encoder.mlp[0].in_features, module.vf_encoder.mlp[0].in_features) == (2, 2 + 4)
    results = [algo.train() for _ in range(12 if algo_name == "PPO" else 1)]
    for pid in algo.policies:
        after = algo.module[pid].state_dict()
        for prefix in ("pi_", "vf_"):
            assert any(not torch.equal(after[k], before[pid][k]) for k in after if k.startswith(prefix)), (pid, prefix)
    if algo_name == "PPO":
        assert results[-1]["episode_return_mean"] > 10
    algo.stop()


def test_a_centralised_critics_checkpoint_of_dict_observations_restores_as_it_trained_and_evaluates(tmp_path,
                                                                                                    capsys):
    """Tic-tac-toe's agents observe a Dict (board, action mask): the checkpoint holds it with the global state
    beside. from_checkpoint rebuilds the spaces the run trained with (the state added once, not twice) and its
    weights, and herd evaluate plays the checkpoint. (Box observations: tests/test_examples.py, MAPPO's example.)"""
    from herdrl.cli import main

    algo = (PPOConfig().environment("pettingzoo/classic/tictactoe-v3").env_runners(num_envs_per_env_runner=2)
            .training(train_batch_size=64, minibatch_size=32, num_epochs=1)
            .multi_agent(policies={"main"}, centralized_critic=True).debugging(seed=0)).build()
    algo.train()
    assert set(algo.observation_space["main"].spaces) == {"action_mask", "observation", "global_state"}
    path = algo.save(tmp_path / "ckpt")
    weights = algo.get_weights()
    algo.stop()
    restored = herdrl.Algorithm.from_checkpoint(path)
    assert restored.observation_space == algo.observation_space
    assert restored.get_weights().keys() == weights.keys()
    assert all(np.array_equal(restored.get_weights()[k], v) for k, v in weights.items())
    restored.stop()
    capsys.readouterr()
    assert main(["evaluate", str(path), "--episodes", "2", "--seed", "0"]) == 0, capsys.readouterr().err
    assert "2 episodes (greedy)" in capsys.readouterr().out


def test_a_centralised_critic_is_refused_where_the_algorithm_has_none():
    with pytest.raises(ConfigError, match="centralized_critic=True is for PPO \\(MAPPO\\), A2C and TRPO, not DQN"):
        herdrl.DQNConfig().environment("relay").multi_agent(**SEPARATE, centralized_critic=True).validate()


def test_value_normalization_standardises_the_critics_targets_by_their_running_statistics():
    """The statistics after two updates are the mean and variance of both batches' value targets (computed here
    from the same fragments with the critic as it was), and the critic's values are its head's output
    de-standardised by them."""
    from herdrl.models.actor_critic import ValueNormalizer
    from herdrl.rollout.batch import on_policy_batch

    rng = np.random.default_rng(0)
    norm, seen = ValueNormalizer(), []
    for size in (5, 1, 40):
        batch = rng.normal(3.0, 7.0, size)
        seen.append(batch)
        norm.observe(torch.as_tensor(batch))
    every = np.concatenate(seen)
    np.testing.assert_allclose([norm.mean.item(), norm.var.item()], [every.mean(), every.var()], rtol=1e-10)

    config = relay_config(**SEPARATE, centralized_critic=True).training(value_normalization=True)
    algo = config.build()
    runner, learner = algo.runners.runner, algo.learners.learner
    targets = {pid: [] for pid in algo.policies}
    for seed in range(2):
        fragment = runner.sample()
        for pid, part in fragment.policies.items():
            module = learner.learners[pid].module
            targets[pid].append(on_policy_batch(module, [part], config.gamma, config.lambda_, torch.device("cpu"))
                                ["returns"].numpy())
        learner.update([fragment], seed)
        runner.set_weights(algo.get_weights())
    for pid, module in algo.module.items():
        every = np.concatenate(targets[pid])
        stats = module.value_normalizer
        np.testing.assert_allclose([stats.mean.item(), stats.var.item()], [every.mean(), every.var()], rtol=1e-5)
        obs = {key: torch.as_tensor(value[:, 0]) for key, value in fragment.policies[pid].obs.items()}
        raw = module.vf_head(module.vf_encoder(obs)).squeeze(-1)
        torch.testing.assert_close(module.value(obs), raw * stats.std().float() + stats.mean.float())
    for _ in range(12):
        result = algo.train()
    assert result["episode_return_mean"] > 10
    algo.stop()


def test_each_policy_normalises_its_own_agents_observations_and_returns(tmp_path):
    """Relay, a policy per agent, observation filter and reward scaling: each policy's statistics count its own
    agent's decisions only (a0 decides at all 8 steps of an episode, a1 at 3), a1's id bit is always 1 (so it
    normalises to 0), and the reward statistics are the running discounted returns of each agent's rows, walked
    here over the fragment's columns; the run learns, and a checkpoint's policy reads raw observations."""
    config = (relay_config(**SEPARATE).env_runners(observation_filter="MeanStdFilter", norm_reward=True)
              .training(gamma=0.9))
    config.validate()
    runner = MultiAgentEnvRunner(config)
    fragment = runner.sample(16)  # two whole episodes in each of 4 env copies
    delta = {key: np.asarray(value) for key, value in fragment.filter_delta.items()}
    assert (delta["p0.obs/count"], delta["p1.obs/count"]) == (4 * 16, 4 * 2 * 3)
    assert delta["p1.obs/mean"][1] == 1.0 and delta["p0.obs/mean"][1] == 0.0  # the id bits: a1's 1, a0's 0
    assert np.all(fragment.policies["p1"].obs[:-1, :, 1][fragment.policies["p1"].valid] == 0.0)
    for pid, part in fragment.policies.items():
        scale = runner.normalizers[pid].local.reward_scale()
        returns = []
        for b in range(part.valid.shape[1]):
            running = 0.0
            for t in np.nonzero(part.valid[:, b])[0]:
                running = running * 0.9 + part.rewards[t, b] / scale
                returns.append(running)
                if part.terminateds[t, b] or part.truncateds[t, b]:
                    running = 0.0
        assert delta[f"{pid}.reward/count"] == len(returns)
        np.testing.assert_allclose(delta[f"{pid}.reward/mean"], np.mean(returns), rtol=1e-5)
    runner.stop()

    algo = config.training(gamma=0.99).build()
    results = [algo.train() for _ in range(12)]
    assert results[-1]["episode_return_mean"] > 10
    path = algo.save(tmp_path / "ckpt")
    stats = algo.normalizer.parts["p1"].state()
    algo.stop()
    policy = Policy.from_checkpoint(path, policy_id="p1")
    assert all(np.array_equal(policy.normalizer.state()[key], value) for key, value in stats.items())
    raw = np.array([[1.0, 1.0], [-1.0, 1.0]], np.float32)
    mean, var = stats["obs/mean"], stats["obs/m2"] / stats["obs/count"]
    by_hand = np.clip((raw - mean) / np.sqrt(var + 1e-8), -10, 10).astype(np.float32)
    greedy = policy.module.act(torch.as_tensor(by_hand), explore=False).numpy()
    assert policy.compute_actions(raw).tolist() == greedy.tolist()


def test_replay_algorithms_keep_raw_rows_and_normalise_each_replayed_batch_with_its_policys_statistics():
    """DQN, a policy per agent, observation filter and reward scaling: fragments keep raw observations and rewards
    (a1's id bit stays 1, rewards 0 or 1) while the runner counts each policy's own statistics (a1 decides at 3 of
    an episode's 8 steps); a batch replayed from p1's buffer is filtered and scaled with p1's statistics (computed
    by hand here, p0's differ), and the run learns."""
    from herdrl import DQNConfig

    config = (DQNConfig().environment("relay")
              .env_runners(num_envs_per_env_runner=4, observation_filter="MeanStdFilter", norm_reward=True)
              .training(lr=3e-3, train_batch_size=32, num_steps_sampled_before_learning_starts=200,
                        min_sample_timesteps_per_iteration=256, epsilon=[[0, 1.0], [1000, 0.05]],
                        training_intensity=4.0, model={"fcnet_hiddens": [32]})
              .multi_agent(**SEPARATE).debugging(seed=3))
    config.validate()
    runner = MultiAgentEnvRunner(config)
    fragment = runner.sample(16)
    part = fragment.policies["p1"]
    assert np.all(part.obs[:-1, :, 1][part.valid] == 1.0) and set(np.unique(part.rewards[part.valid])) <= {0.0, 1.0}
    assert (fragment.filter_delta["p0.obs/count"], fragment.filter_delta["p1.obs/count"]) == (4 * 16, 4 * 2 * 3)
    assert fragment.filter_delta["p1.reward/count"] == 4 * 2 * 3
    runner.stop()

    algo = config.build()
    results = [algo.train() for _ in range(6)]
    assert results[-1]["evaluation/episode_return_mean"] >= 10.5
    data, _, _ = algo.streams["p1"].buffer.sample(16)
    stats = algo.normalizer.parts["p1"].state()
    assert not np.allclose(stats["obs/mean"], algo.normalizer.parts["p0"].state()["obs/mean"])
    mean, var = stats["obs/mean"], stats["obs/m2"] / stats["obs/count"]
    scale = 1.0 / np.sqrt(stats["reward/m2"] / stats["reward/count"] + 1e-8)
    batch = algo.normalized(data, "p1")
    for key in ("obs", "next_obs"):
        np.testing.assert_allclose(batch[key], np.clip((data[key] - mean) / np.sqrt(var + 1e-8), -10, 10), atol=1e-5)
    np.testing.assert_allclose(batch["rewards"], np.clip(data["rewards"] * scale, -10, 10), rtol=1e-5)
    assert scale != pytest.approx(1.0, abs=0.05)
    algo.stop()


def test_mappo_normalises_the_global_state_beside_the_own_observation_and_its_actor_reads_its_own_statistics(
        tmp_path):
    """MeanStdFilter with a centralised critic: the run keeps statistics of both leaves (the relay's own
    observation is a Box, so it sits under 'own_observation'); PPO learns the relay with them; the live policy,
    the checkpoint's and the exported program read an agent's raw observation alone, normalised with the run's
    statistics of its own leaf (by hand here), and act as the module does on that."""
    from herdrl.export import export_policy

    algo = relay_config(**SEPARATE, centralized_critic=True).env_runners(observation_filter="MeanStdFilter").build()
    results = [algo.train() for _ in range(12)]
    assert results[-1]["episode_return_mean"] > 10
    stats = algo.normalizer.state()
    for leaf in ("own_observation", "global_state"):
        assert stats[f"p0.obs/{leaf}/count"] > 1000
    mean = stats["p0.obs/own_observation/mean"]
    std = np.sqrt(stats["p0.obs/own_observation/m2"] / stats["p0.obs/own_observation/count"] + 1e-8)
    assert not np.allclose(std, 1.0, atol=0.05) or not np.allclose(mean, 0.0, atol=0.05)  # normalising moves them
    raw = np.random.default_rng(0).uniform(-2, 2, (64, 2)).astype(np.float32)
    by_hand = torch.as_tensor(np.clip((raw - mean) / std, -10, 10), dtype=torch.float32)
    module = algo.module["p0"]
    with torch.no_grad():
        expected = module.dist_inputs(by_hand).argmax(-1).numpy()
        unfiltered = module.dist_inputs(torch.as_tensor(raw)).argmax(-1).numpy()
    assert (expected != unfiltered).any()  # (the check can tell a policy that forgot the statistics)
    live = algo.policies["p0"]
    torch.testing.assert_close(live._model_input(raw), by_hand)
    assert live.compute_actions(raw).tolist() == expected.tolist()
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    policy = Policy.from_checkpoint(path, policy_id="p0")
    assert policy.compute_actions(raw).tolist() == expected.tolist()
    program = torch.export.load(export_policy(path, "torch-export", tmp_path / "p0.pt2", "p0")).module()
    assert program(torch.as_tensor(raw)).tolist() == expected.tolist()


def test_a_turn_based_games_global_state_holds_every_live_agents_observation_as_it_is_now():
    """Tic-tac-toe has no state(): after each move, the global state is both players' observations as the env
    shows them at that moment (observe()), not the waiting player's view from before its opponent moved."""
    from herdrl.env.multi_agent import make_agent_env

    env = make_agent_env("pettingzoo/classic/tictactoe-v3")
    env.track_observations = True
    step = env.reset(seed=0)
    space = env.global_state_space()
    for move in (4, 0, 8):
        step = env.step({next(iter(step.decide)): move})
        expected = np.concatenate([gym.spaces.flatten(env.observation_space(a), env.env.observe(a))
                                   for a in env.possible_agents]).astype(np.float32)
        np.testing.assert_array_equal(env.global_state(), expected)
    assert space.shape == expected.shape


def test_value_normalization_keeps_values_in_return_units_everywhere_and_clips_only_the_heads_change(tmp_path):
    """A critic with value normalisation: the old values PPO clips against are re-expressed in the new statistics
    (equal to the critic's values after the update of the statistics, before any gradient step); an LSTM's
    bootstrap value is in return units like every other value; the variance is floored; a checkpoint restores
    with the option toggled either way; a per-policy or single-agent misuse is one line."""
    from herdrl.models.actor_critic import ValueNormalizer
    from herdrl.rollout.batch import sequence_batch

    config = relay_config(**SEPARATE).training(value_normalization=True)
    algo = config.build()
    module = algo.module["p0"]
    obs = torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, (16, 2)).astype(np.float32))
    before = module.value(obs)
    reexpressed = module.observe_value_targets(torch.linspace(50, 90, 64), before)
    torch.testing.assert_close(reexpressed, module.value(obs))
    assert float(module.value_normalizer.mean) == pytest.approx(70.0)
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    restored = relay_config(**SEPARATE).build()  # without the option: the statistics are left out
    restored.restore(path)
    restored.stop()
    again = relay_config(**SEPARATE).training(value_normalization=True).build()
    again.restore(path)
    assert float(again.module["p0"].value_normalizer.mean) == pytest.approx(70.0)
    again.stop()

    norm = ValueNormalizer()
    norm.observe(torch.zeros(10))
    assert float(norm.std()) == pytest.approx(0.1)  # a constant target: the floor, not 1e-4

    lstm = (PPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2, rollout_fragment_length=16)
            .training(value_normalization=True, train_batch_size=32, minibatch_size=16,
                      model={"use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 4}))
    lstm.validate()
    runner = herdrl.rollout.EnvRunner(lstm)
    recurrent = lstm.build_module(runner.observation_space, runner.action_space)
    recurrent.value_normalizer.mean.fill_(1000.0)
    runner_fragment = runner.sample()
    with torch.no_grad():
        _, _, grid = sequence_batch(recurrent, [runner_fragment], 4, torch.device("cpu"))
    assert np.all(np.abs(grid - 1000.0) < 50)  # the bootstrap row (last) too: heads start near 0
    runner.stop()

    with pytest.raises(ConfigError, match="'value_normalization' is shared by every policy"):
        relay_config(policies={"p0": {"config": {"value_normalization": True}}, "p1": None},
                     policy_mapping_fn=SEPARATE["policy_mapping_fn"]).validate()
    with pytest.raises(ConfigError, match="centralized_critic=True is for multi-agent runs"):
        PPOConfig().environment("CartPole-v1").multi_agent(centralized_critic=True).validate()


class IntegerRelay(CueRelay):
    """The relay with integer observations in [0, 4] (the cue + 1 and the id bit): an integer Box encoders scale."""

    def __init__(self, env_config=None):
        super().__init__(env_config)
        self._obs_space = gym.spaces.Box(0, 4, (2,), np.int64)

    def _observe(self):
        return {agent: np.array([obs[0] + 1, obs[1]], np.int64) for agent, obs in super()._observe().items()}


def test_filtered_runners_act_as_the_learner_reads_and_frozen_policies_keep_their_statistics():
    """Integer observations, filtered: the runner's network reads the fragment's rows as the learner's does (both
    on the filtered float leaves, not one of them rescaling them as raw integers); a policy that does not learn
    counts nothing, so its statistics stay what they were (here: none)."""
    herdrl.register_env("int_relay", lambda cfg: IntegerRelay(cfg))
    config = (PPOConfig().environment("int_relay").env_runners(num_envs_per_env_runner=4,
                                                                observation_filter="MeanStdFilter")
              .training(train_batch_size=256, minibatch_size=64)
              .multi_agent(**SEPARATE, policies_to_train=["p0"]).debugging(seed=3))
    algo = config.build()
    algo.train()
    runner = algo.runners.runner
    runner.set_weights(algo.runner_weights())
    part = runner.sample(16).policies["p0"]
    rows = torch.as_tensor(part.obs[:-1][part.valid])
    torch.testing.assert_close(runner.module["p0"].dist_inputs(rows), algo.module["p0"].dist_inputs(rows))
    stats = algo.normalizer.state()
    assert stats["p0.obs/count"] > 0 and stats["p1.obs/count"] == 0
    algo.stop()


def test_a_filtered_policy_exports_with_its_own_statistics_and_turn_based_rewards_scale_per_row(tmp_path):
    """The relay with an observation filter: policy p1's exported program takes raw observations and acts as
    its checkpoint's Policy does. Tic-tac-toe with reward scaling: each shipped row (a move, paid what happened
    until the player's next move) counts one running return, and its scaled reward is the game's -1, 0 or +1
    times the policy's scale."""
    from herdrl.export import export_policy

    algo = relay_config(**SEPARATE).env_runners(observation_filter="MeanStdFilter").build()
    algo.train()
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    policy = Policy.from_checkpoint(path, policy_id="p1")
    raw = np.array([[1.0, 1.0], [-1.0, 1.0], [0.5, 1.0]], np.float32)
    program = torch.export.load(export_policy(path, "torch-export", tmp_path / "p1.pt2", "p1")).module()
    assert program(torch.as_tensor(raw)).tolist() == policy.compute_actions(raw).tolist()

    config = (PPOConfig().environment("pettingzoo/classic/tictactoe-v3")
              .env_runners(num_envs_per_env_runner=4, norm_reward=True)
              .training(train_batch_size=256, minibatch_size=64).multi_agent(policies={"main"}).debugging(seed=0))
    config.validate()
    runner = MultiAgentEnvRunner(config)
    fragment = runner.sample(40)
    part, delta = fragment.policies["main"], fragment.filter_delta
    assert delta["main.reward/count"] == part.valid.sum() > 0
    scale = runner.normalizers["main"].local.reward_scale()
    paid = part.rewards[part.valid] / scale
    assert np.allclose(paid, np.round(paid)) and set(np.round(paid)) <= {-1.0, 0.0, 1.0} and paid.any()
    runner.stop()


RECALL_LSTM = {"use_lstm": True, "lstm_cell_size": 32, "max_seq_len": 8, "fcnet_hiddens": [32]}
SHARED = {"policies": {"shared"}, "policy_mapping_fn": lambda agent, episode, **kw: "shared"}


def test_a_recurrent_policy_is_unrolled_by_the_learner_exactly_as_each_agent_acted():
    """Each agent carries its own LSTM state: the learner's unroll of a shared policy's fragment (two agents per env
    copy, one joining late and leaving early, episodes ending inside fragments, rows carried over fragment ends,
    padded in front as beside a longer fragment) gives every decision the log-probability the runner logged when
    it acted. With the recorded sequence states zeroed it does not (the check can fail)."""
    import dataclasses

    from herdrl import IMPALAConfig
    from herdrl.rollout.batch import recurrent_batch
    from herdrl.rollout.multi_agent import pad_front

    config = (IMPALAConfig().environment("relay", env_config={"recall": True})
              .env_runners(num_envs_per_env_runner=3, rollout_fragment_length=7)
              .training(train_batch_size=21, model={**RECALL_LSTM, "lstm_cell_size": 8, "max_seq_len": 4})
              .multi_agent(**SHARED).debugging(seed=0))
    config.validate()
    runner = MultiAgentEnvRunner(config)
    module = runner.module["shared"]
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():  # sharp enough that a wrong state shows in the log-probabilities
            p.normal_(0.0, 0.5)

    def worst_error(part):
        # (logp=None: the learner's own unroll, not the logged values it would take where a fragment has them)
        batch = recurrent_batch(module, [dataclasses.replace(part, logp=None)], 0.99, 0.95, 4, torch.device("cpu"))
        index, valid, logp = batch["seq_index"].numpy(), batch["valid"].numpy(), batch["old_logp"].numpy()
        logged = part.logp.reshape(-1)
        errors = [abs(logp[n, t] - logged[index[n, t]]) for n, t in zip(*np.nonzero(valid), strict=True)]
        assert len(errors) == part.valid.sum()
        return max(errors)

    from herdrl.rollout.batch import sequence_index

    ends = breaks = first_decisions = carried = 0
    for _ in range(3):
        part = runner.sample().policies["shared"]
        ends += part.terminateds.sum() + part.truncateds.sum()
        breaks += (~part.valid[1:] & part.valid[:-1]).sum()  # an episode break or the padding before a column
        assert worst_error(part) < 1e-5 and worst_error(pad_front(part, len(part.valid) + 3)) < 1e-5
        assert worst_error(dataclasses.replace(part, state_in=np.zeros_like(part.state_in))) > 0.05
        # An agent's first decision of an episode (the only one showing its cue) starts a sequence from zeros.
        starts = sequence_index(part.valid, 4)[:, 0]
        width = part.valid.shape[1]
        for n, flat in enumerate(starts):
            t, b = divmod(int(flat), width)
            if part.valid[t, b] and part.obs[t, b, 0] != 0.0:
                assert not part.state_in[n].any()
                first_decisions += 1
            carried += bool(part.state_in[n].any())
    assert ends > 6 and breaks > 0 and first_decisions > 6 and carried > 6


def test_lstm_policies_remember_what_each_agent_saw_an_mlp_cannot():
    """The relay's recall variant shows each agent its cue at its first step only: a shared LSTM policy learns to
    name it at every step (best 11), a shared MLP cannot (6.5 at most, 5.5 by chance)."""
    best = {}
    for lstm in (True, False):
        algo = (PPOConfig().environment("relay", env_config={"recall": True}).env_runners(num_envs_per_env_runner=8)
                .training(train_batch_size=512, minibatch_size=128, num_epochs=4, lr=3e-3,
                          model=RECALL_LSTM if lstm else {"fcnet_hiddens": [32]})
                .multi_agent(**SHARED).debugging(seed=0)).build()
        best[lstm] = max(algo.train()["episode_return_mean"] for _ in range(25))
        algo.stop()
    assert best[True] > 10.0 and best[False] < 7.0, best


@pytest.mark.parametrize("algo_name", ["APPO", "A2C"])
def test_lstm_policies_train_on_two_ray_runners_checkpoint_and_play_games(algo_name, tmp_path):
    """Recurrent policies on Ray runners (APPO: asynchronous; A2C), a checkpoint that resumes, greedy evaluation and
    a game's score against random moves, each carrying every agent's state."""
    from herdrl.registry import get_config_class

    config = (get_config_class(algo_name)().environment("pettingzoo/classic/tictactoe-v3")
              .env_runners(num_env_runners=2, num_envs_per_env_runner=2, rollout_fragment_length=16)
              .training(train_batch_size=64, model={**RECALL_LSTM, "lstm_cell_size": 8})
              .evaluation(evaluation_interval=1, evaluation_duration=2)
              .multi_agent(policies={"main"}).debugging(seed=0))
    algo = config.build()
    result = algo.train()
    assert result["num_healthy_env_runners"] == 2 and result["num_episodes_lifetime"] > 0
    assert result["evaluation/num_episodes"] == 2
    player = MultiAgentEnvRunner(config)
    player.set_weights(algo.runner_weights())
    assert -1.0 <= player.score_against_random("main", 4, seed=0) <= 1.0
    path = algo.save(tmp_path / "ckpt")
    weights = algo.get_weights()
    algo.stop()
    restored = config.build()
    restored.restore(path)
    assert all(np.array_equal(restored.get_weights()[k], weights[k]) for k in weights)
    assert restored.train()["training_iteration"] == 2
    restored.stop()


def test_lstm_actors_beside_a_centralised_critic_remember_and_act_on_their_own_observations(tmp_path):
    """MAPPO with LSTM actors on the relay's recall variant: the actor reads its agent's observation alone (2 wide)
    through its LSTM, the feed-forward critic that and the global state (2 + 4); the team learns to name each cue
    at every step (best 11; 6.5 at most without memory). The checkpoint's policy carries the actor's state on an
    agent's own observations, step for step as the learner's module does."""
    algo = (PPOConfig().environment("relay", env_config={"recall": True}).env_runners(num_envs_per_env_runner=8)
            .training(train_batch_size=512, minibatch_size=128, num_epochs=4, lr=3e-3, model=RECALL_LSTM)
            .multi_agent(**SHARED, centralized_critic=True).debugging(seed=0)).build()
    module = algo.module["shared"]
    assert (module.pi_encoder.mlp[0].in_features, module.vf_encoder.mlp[0].in_features) == (2, 2 + 4)
    assert module.vf_head.in_features == 32 and module.pi_head.in_features == RECALL_LSTM["lstm_cell_size"]
    best = max(algo.train()["episode_return_mean"] for _ in range(25))
    assert best > 10.0, best
    path = algo.save(tmp_path / "ckpt")
    module = algo.module["shared"]
    algo.stop()
    policy = Policy.from_checkpoint(path, policy_id="shared")
    assert policy.observation_space == gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    obs = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]], np.float32)
    state, own_state = None, module.initial_state(1)
    for row in obs:
        action, state = policy.compute_single_action(row, state=state)
        with torch.no_grad():
            own, own_state = module.greedy_step(torch.as_tensor(row[None]), own_state)
        assert action == int(own[0])
        np.testing.assert_allclose(state, own_state[0].numpy(), atol=1e-6)


def test_lstm_with_previous_actions_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="lstm_use_prev_action/lstm_use_prev_reward are not built for multi"):
        relay_config(**SEPARATE).training(model={**RECALL_LSTM, "lstm_use_prev_action": True}).validate()


@pytest.mark.parametrize("algo_name", ["SAC", "TD3"])
def test_continuous_replay_algorithms_resume_each_policys_weights_and_statistics(algo_name, tmp_path):
    """SAC and TD3 with a policy per agent and normalisation: a checkpoint restores every policy's weights and
    statistics (the same arrays) and the run goes on from its iteration."""
    from herdrl.registry import get_config_class

    config = (get_config_class(algo_name)().environment("relay", env_config={"continuous": True})
              .env_runners(num_envs_per_env_runner=2, observation_filter="MeanStdFilter", norm_reward=True)
              .training(train_batch_size=32, num_steps_sampled_before_learning_starts=32,
                        min_sample_timesteps_per_iteration=64)
              .multi_agent(**SEPARATE).debugging(seed=0))
    algo = config.build()
    result = algo.train()
    assert result["p0/critic_loss"] >= 0  # (p1 has decided at 3 of every 8 steps: not learning yet)
    path = algo.save(tmp_path / "ckpt")
    weights, stats = algo.get_weights(), algo.normalizer.state()
    algo.stop()
    restored = config.build()
    restored.restore(path)
    assert all(np.array_equal(restored.get_weights()[k], weights[k]) for k in weights)
    assert stats["p1.obs/count"] > 0
    assert all(np.array_equal(restored.normalizer.state()[k], value) for k, value in stats.items())
    assert restored.train()["training_iteration"] == 2
    restored.stop()
