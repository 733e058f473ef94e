"""Recurrent QMIX/VDN agents: episode windows cut across fragments, the window loss, learning to remember."""

import numpy as np
import pytest
import torch

import herdrl
from herdrl import ConfigError, QMIXConfig
from herdrl.algorithms.qmix import QMIXLearner, TeamEpsilonGreedy
from herdrl.env.multi_agent import make_agent_env
from herdrl.env.team import TeamEnv
from herdrl.env.testing import CueRelay
from herdrl.models.encoders import to_torch
from herdrl.rollout.runner import Fragment
from herdrl.sequence_replay import EpisodeSequencer, SequenceReplayBuffer

herdrl.register_env("recall_team", lambda cfg: CueRelay({"recall": True, "together": True}))


def stream_fragments(lengths, steps):
    """One env's episodes of ``lengths`` steps played NEXT_STEP-style (a reset-only step after each end), cut into
    fragments of ``steps``; observation i is the number i (episode e's observations run on from e's first), action
    and reward name their step. Returns (fragments, episodes), each episode a dict of its observations (n+1),
    actions, rewards, terminated flags (n). Each fragment says whether its first step begins an episode (the
    first fragment's, or after a reset-only step), as a runner's do."""
    rows, episodes, counter = [], [], 0  # rows: (obs before, action, reward, terminated, truncated, valid)
    for e, n in enumerate(lengths):
        ep = {"obs": [], "actions": [], "rewards": [], "terminated": []}
        for t in range(n):
            ep["obs"].append(counter)
            terminated = t == n - 1 and e % 2 == 0  # even episodes terminate, odd ones are cut off (truncated)
            rows.append((counter, 100 + counter, float(counter), terminated, t == n - 1 and not terminated, True))
            ep["actions"].append(100 + counter)
            ep["rewards"].append(float(counter))
            ep["terminated"].append(terminated)
            counter += 1
        ep["obs"].append(counter)  # the observation after its last step (the final one)
        rows.append((counter, 0, 0.0, False, False, False))  # the reset-only step: it shows the next first obs
        counter += 1
        episodes.append(ep)
    fragments = []
    for k in range(0, len(rows) - steps, steps):
        part = rows[k:k + steps]
        obs = np.array([r[0] for r in part] + [rows[k + steps][0]], np.float32)[:, None, None]
        fragments.append(Fragment(obs, np.array([r[1] for r in part])[:, None], np.array([r[2] for r in part],
                                  np.float32)[:, None], np.array([r[3] for r in part])[:, None],
                                  np.array([r[4] for r in part])[:, None], np.array([r[5] for r in part])[:, None],
                                  worker_index=3, begins=np.array([k == 0 or not rows[k - 1][5]])))
    return fragments, episodes


def hand_windows(episode, seq_len, burn_in, gamma):
    """An episode's windows by slicing: segment k is steps [k L, (k+1) L), after up to burn_in steps before it."""
    out, n = [], len(episode["actions"])
    for begin in range(0, n, seq_len):
        first, end = max(0, begin - burn_in), min(begin + seq_len, n)
        out.append({"obs": episode["obs"][first:end + 1], "actions": episode["actions"][first:end],
                    "prev_actions": episode["actions"][first - 1] if first else -1,
                    "rewards": episode["rewards"][first:end],
                    "discounts": [0.0 if term else gamma for term in episode["terminated"][first:end]],
                    "train": [False] * (begin - first) + [True] * (end - begin)})
    return out


@pytest.mark.parametrize("seq_len,burn_in", [(4, 0), (3, 2), (5, 7)])
def test_windows_cut_across_fragments_equal_the_episodes_sliced_by_hand(seq_len, burn_in):
    """Episodes of 1 to 13 steps, fragments of 5 steps (episodes cross them, reset-only steps between): every
    window the sequencer emits equals the episode's own slice, with the action taken just before it (-1 where it
    begins its episode); padding is zeros and outside train/valid."""
    lengths = [7, 1, 13, 4, 5, 9, 2, 11]
    fragments, episodes = stream_fragments(lengths, 5)
    sequencer = EpisodeSequencer(seq_len, burn_in, 0.9)
    got = [w for f in fragments for w in sequencer.add(f)]
    ended = [ep for ep in episodes if ep["obs"][-1] < fragments[-1].obs[-1, 0, 0]]  # ended inside the fragments
    want = [w for ep in ended for w in hand_windows(ep, seq_len, burn_in, 0.9)]
    assert len(got) >= len(want) > len(ended)
    assert any(w["prev_actions"] >= 0 for w in want)  # windows that start inside their episode
    for g, w in zip(got, want, strict=False):
        steps = len(w["actions"])
        np.testing.assert_array_equal(g["obs"][:steps + 1, 0], w["obs"])
        np.testing.assert_array_equal(g["actions"][:steps], w["actions"])
        assert g["prev_actions"] == w["prev_actions"]
        np.testing.assert_array_equal(g["rewards"][:steps], w["rewards"])
        np.testing.assert_allclose(g["discounts"][:steps], w["discounts"])
        np.testing.assert_array_equal(g["train"][:steps], w["train"])
        assert g["valid"][:steps].all() and not g["valid"][steps:].any() and not g["train"][steps:].any()
        assert not g["obs"][steps + 1:].any() and g["obs"].shape[0] == seq_len + burn_in + 1


def test_a_restarted_runner_drops_the_episode_it_was_playing():
    """A fragment whose first step begins an episode (the runner restarted its envs) while one was open: the open
    episode's steps never reach a window; the new episodes are cut from their own first step."""
    fragments, episodes = stream_fragments([6, 3, 3], 4)
    sequencer = EpisodeSequencer(8, 0, 1.0)
    assert sequencer.add(fragments[0]) == []  # the first episode is under way (steps 0-3)
    restarted = Fragment(np.array([50, 51, 52, 53, 54], np.float32)[:, None, None], np.arange(4)[:, None],
                         np.ones((4, 1), np.float32), np.array([[False], [True], [False], [False]]),
                         np.zeros((4, 1), bool), np.array([[True], [True], [False], [True]]), worker_index=3,
                         begins=np.array([True]))
    windows = sequencer.add(restarted)
    assert len(windows) == 1
    np.testing.assert_array_equal(windows[0]["obs"][:3, 0], [50, 51, 52])  # nothing of steps 0-3 before
    assert windows[0]["valid"].sum() == 2


@pytest.mark.parametrize("lost_index", [2, 3])
def test_an_episode_whose_next_fragment_was_lost_is_dropped_from_there_on(lost_index):
    """A fragment lost (2: one an episode begins with; 3: the middle of a 13-step episode, whose open part then
    does not meet the next fragment): the episodes every step of which arrived are cut as by hand; the episode the
    lost fragment touched gives no window after the loss, and none of the lost steps appear."""
    lengths = [7, 1, 13, 4, 5, 9, 2, 11]
    fragments, episodes = stream_fragments(lengths, 5)
    lost = fragments[lost_index]
    sequencer = EpisodeSequencer(4, 2, 0.9)
    got = [w for f in fragments[:lost_index] + fragments[lost_index + 1:] for w in sequencer.add(f)]
    gone = set(lost.obs[:, 0, 0].tolist())
    last = fragments[-1].obs[-1, 0, 0]
    ended = [ep for ep in episodes if ep["obs"][-1] < last]
    touched = [ep for ep in ended if gone & set(ep["obs"])]
    # What arrived whole: every window of an untouched episode, and a touched one's windows before the loss.
    want = [w["obs"][0] for ep in ended for w in hand_windows(ep, 4, 2, 0.9)
            if not (ep in touched and w["obs"][-1] >= min(gone))]
    after = [w["obs"][0] for ep in touched for w in hand_windows(ep, 4, 2, 0.9) if w["obs"][-1] >= min(gone)]
    starts = [float(g["obs"][0, 0]) for g in got]
    assert touched and after and starts[:len(want)] == want and not set(starts) & set(after)
    seen = {float(x) for g in got for x in g["obs"][g["valid"].nonzero()[0], 0]}
    assert not seen & gone


def test_a_full_buffer_of_short_windows_learns_whatever_learning_starts_says():
    """Episodes of 10 steps in segments of 8 (+2): a full buffer holds far fewer trained steps than its capacity;
    learning starts once it holds ``num_steps_sampled_before_learning_starts`` of them, or once it is full."""
    from herdrl.algorithms.off_policy import _Replay
    from herdrl.obs import ObsSpec

    config = QMIXConfig().environment("recall_team").training(num_steps_sampled_before_learning_starts=1000)
    buffer = SequenceReplayBuffer(20, ObsSpec(TeamEnv(make_agent_env("recall_team", {})).observation_space), 8,
                                  (2,), np.int64, np.random.default_rng(0))
    fragments, _ = stream_fragments([10] * 40, 11)
    sequencer = EpisodeSequencer(8, 0, 0.9)
    windows = [w for f in fragments for w in sequencer.add(f)]
    team_obs = {"obs": np.zeros((9, 2, 2), np.float32), "state": np.zeros((9, 4), np.float32),
                "action_mask": np.ones((9, 2, 2), np.int8)}
    replay = _Replay(config, buffer)
    for i, window in enumerate(windows[:20]):
        assert not replay.learning
        buffer.add([{**window, "obs": team_obs, "actions": np.zeros((8, 2), np.int64)}])
        assert buffer.transitions == sum(int(w["train"].sum()) for w in windows[:i + 1])
    assert buffer.transitions < 1000 and replay.learning


def test_learners_weigh_their_shares_of_windows_by_the_steps_the_loss_learns_on():
    """Two windows, one all segment (4 trained steps of 4), one mostly burn-in (1 of 4): with N learners each
    share's gradient is weighted by its trained steps, 4/5 and 1/5, not by its valid steps (1/2 each)."""
    learner = tiny_learner("vdn")
    batch = {"valid": torch.ones(2, 4, dtype=torch.bool),
             "train": torch.tensor([[True] * 4, [False, False, False, True]]), "actions": torch.zeros(2, 4, 2)}
    index = np.arange(2)
    assert learner._share(batch, np.array([0]), index) == pytest.approx(0.8)
    assert learner._share(batch, np.array([1]), index) == pytest.approx(0.2)


def tiny_learner(mixer, last_action=False):
    torch.manual_seed(3)  # (the networks' initial weights too: whatever ran before)
    config = (QMIXConfig().environment("recall_team")
              .training(mixer=mixer, agent_rnn=True, rnn_hidden_dim=8, model={"max_seq_len": 4}, replay_burn_in=2,
                        double_q=True, agent_last_action=last_action))
    config.validate()
    env = TeamEnv(make_agent_env("recall_team", {}))
    learner = QMIXLearner(config, env.observation_space, env.action_space)
    with torch.no_grad():  # a target unlike the online network: opposite Q values, another mixer
        learner.target.fc_out.weight.copy_(-learner.module.fc_out.weight)
        learner.target.fc_out.bias.copy_(-learner.module.fc_out.bias)
        if learner.target.mixer is not None:
            for p in learner.target.mixer.parameters():
                p.add_(0.5 * torch.randn_like(p))
    return learner


@pytest.mark.parametrize("mixer,last_action", [("qmix", False), ("vdn", False), ("qmix", True)])
def test_the_window_loss_is_the_td_loss_of_each_trained_step_stepped_by_hand(mixer, last_action):
    """Windows of 6 steps (burn-in 2, segment 4; one window padded after 3 steps): the loss equals the mean Huber
    TD error over the segment steps only, each step's Q_tot and double-Q target computed by stepping both networks
    one step at a time from a zero state, with each agent's best next action among those its mask allows (agents
    reading their last action read, at a window's first step, the action taken before it, if any)."""
    learner = tiny_learner(mixer, last_action)
    n, width = 3, 6
    g = torch.Generator().manual_seed(0)
    obs = {"obs": torch.rand(n, width + 1, 2, 2, generator=g), "state": torch.rand(n, width + 1, 4, generator=g),
           "action_mask": torch.ones(n, width + 1, 2, 2, dtype=torch.int8)}
    obs["action_mask"][0, 3:, 1, 1] = 0  # agent 1 may take action 0 only in window 0's last steps
    obs["action_mask"][2, 4:, 0, 0] = 0  # agent 0 action 1 only in window 2's
    valid = torch.ones(n, width, dtype=torch.bool)
    valid[1, 3:] = False
    train = valid.clone()
    train[0, :2] = False  # burn-in
    train[2, :2] = False
    batch = {"obs": obs, "actions": torch.randint(0, 2, (n, width, 2), generator=g),
             "rewards": torch.randn(n, width, generator=g), "discounts": torch.full((n, width), 0.9),
             "train": train, "valid": valid, "weights": torch.tensor([1.0, 0.5, 2.0]),
             "prev_actions": torch.tensor([[1, 0], [-1, -1], [0, 1]])}  # (window 1 begins its episode)
    batch["discounts"][2, 3] = 0.0
    loss, stats = learner.loss(batch)
    module, target = learner.module, learner.target
    errors, weights, differs = [], [], 0
    with torch.no_grad():
        for i in range(n):
            h_online, h_target = module.initial_state(1), target.initial_state(1)
            if last_action and i != 1:
                before = torch.nn.functional.one_hot(batch["prev_actions"][i:i + 1], 2).float()
                h_online, h_target = (torch.cat([h[..., :8], before], -1) for h in (h_online, h_target))
            qs, tqs = [], []
            for t in range(width + 1):
                step_obs = {k: v[i:i + 1, t] for k, v in obs.items()}
                q, h_online = module.step(step_obs, h_online)
                tq, h_target = target.step(step_obs, h_target)
                if last_action and t < width:  # each agent reads the action it took (the window's), one-hot, next
                    took = torch.nn.functional.one_hot(batch["actions"][i:i + 1, t], 2).float()
                    h_online, h_target = (torch.cat([h[..., :8], took], -1) for h in (h_online, h_target))
                qs.append(q[0])
                tqs.append(tq[0])
            for t in range(width):
                if not train[i, t]:
                    continue
                now = {k: v[i:i + 1, t] for k, v in obs.items()}
                nxt = {k: v[i:i + 1, t + 1] for k, v in obs.items()}
                chosen = torch.stack([qs[t][a, int(batch["actions"][i, t, a])] for a in range(2)])
                q_tot = float(module.mix(chosen[None], now)[0])
                ys = []
                for chooser in (qs, tqs):  # double Q picks with the online network (the other: to tell them apart)
                    best = []
                    for a in range(2):
                        allowed = [b for b in range(2) if obs["action_mask"][i, t + 1, a, b]]
                        pick = max(allowed, key=lambda b, a=a, chooser=chooser: float(chooser[t + 1][a, b]))
                        best.append(tqs[t + 1][a, pick])
                    ys.append(float(batch["rewards"][i, t]) + float(batch["discounts"][i, t]) * float(
                        target.mix(torch.stack(best)[None], nxt)[0]))
                y = ys[0]
                differs += abs(ys[0] - ys[1]) > 1e-4
                errors.append(float(torch.nn.functional.smooth_l1_loss(torch.tensor(q_tot), torch.tensor(y))))
                weights.append(float(batch["weights"][i]))
    assert float(loss.detach()) == pytest.approx(np.dot(errors, weights) / len(errors), rel=1e-5)
    assert differs >= 2  # the online and target networks pick differently somewhere: the check can tell
    assert stats["td_error"].shape == (n,)


def test_the_burn_in_only_rebuilds_the_state_no_gradient_reaches_its_steps():
    """R2D2's burn-in: the loss's gradient reaches every observation a window's trained steps read, through the
    agents' recurrent state, but none of its burn-in steps' (window 0: 2 burn-in steps; window 1: none)."""
    learner = tiny_learner("qmix")
    n, width = 2, 6
    g = torch.Generator().manual_seed(1)
    obs = {"obs": torch.rand(n, width + 1, 2, 2, generator=g).requires_grad_(),
           "state": torch.rand(n, width + 1, 4, generator=g), "action_mask": torch.ones(n, width + 1, 2, 2)}
    train = torch.ones(n, width, dtype=torch.bool)
    train[0, :2] = False
    batch = {"obs": obs, "actions": torch.randint(0, 2, (n, width, 2), generator=g),
             "rewards": torch.randn(n, width, generator=g), "discounts": torch.full((n, width), 0.9),
             "train": train, "valid": torch.ones(n, width, dtype=torch.bool), "weights": torch.ones(n),
             "prev_actions": torch.full((n, 2), -1)}
    loss, _ = learner.loss(batch)
    loss.backward()
    reached = obs["obs"].grad.abs().sum((2, 3))  # (windows, steps): gradient per step's observations
    assert (reached[0, :2] == 0).all()  # the burn-in
    assert (reached[0, 2:width] > 0).all() and (reached[1, :width] > 0).all()
    assert (reached[:, width] == 0).all()  # the last observation: only the (gradient-free) target reads it


@pytest.mark.parametrize("last_action", [False, True])
def test_recurrent_vdn_learns_to_remember_and_checkpoints_evaluates_and_exports(tmp_path, last_action):
    """Each agent sees its cue once and must name it for 8 steps: without memory the team's best is 4.5 (right at
    first sight, chance after), with GRU agents 8. Recurrent VDN gets there in seconds (with or without each agent
    reading its last action); its replay of windows is saved and loaded with the checkpoint; the Policy carries
    the team's state; the exported team and one agent alone act as the Policy does, step by step."""
    config = (QMIXConfig().environment("recall_team")
              .env_runners(num_envs_per_env_runner=8, rollout_fragment_length=8)
              .training(mixer="vdn", agent_rnn=True, rnn_hidden_dim=32, lr=1e-3, train_batch_size=32,
                        training_intensity=64.0, epsilon=[[0, 1.0], [3000, 0.05]],
                        model={"max_seq_len": 8, "fcnet_hiddens": [64]}, num_steps_sampled_before_learning_starts=256,
                        min_sample_timesteps_per_iteration=512, target_network_update_freq=500,
                        store_buffer_in_checkpoints=True, agent_last_action=last_action)
              .evaluation(evaluation_interval=1, evaluation_duration=16).debugging(seed=0))
    algo = config.build()
    returns = [algo.train()["evaluation/episode_return_mean"] for _ in range(6)]
    assert max(returns[-3:]) >= 7.5, returns
    path = algo.save(tmp_path / "ckpt")
    held = algo.buffer.state()
    algo.stop()
    from herdrl.algorithms.base import Algorithm
    from herdrl.export import export_policy
    from herdrl.policy import Policy

    restored = Algorithm.from_checkpoint(path)
    again = restored.buffer.state()
    assert held.keys() == again.keys() and all(np.array_equal(held[k], again[k]) for k in held)
    restored.stop()
    policy = Policy.from_checkpoint(path)
    team = torch.export.load(export_policy(path, "torch-export", tmp_path / "team.pt2")).module()
    alone = torch.export.load(export_policy(path, "torch-export", tmp_path / "a0.pt2", agent=0)).module()
    env = TeamEnv(make_agent_env("recall_team", {}))
    obs, _ = env.reset(seed=5)
    state, team_state, total = None, policy.initial_state(1), 0.0
    agent_state = torch.zeros(1, 32 + (env.action_space.nvec[0] if last_action else 0))
    for _ in range(8):
        action, state = policy.compute_single_action(obs, state=state)
        leaves = [torch.as_tensor(obs[k])[None] for k in sorted(obs)]
        team_action, team_state = team(*leaves, torch.as_tensor(team_state))
        mine, agent_state = alone(torch.as_tensor(obs["action_mask"][:1]), torch.as_tensor(obs["obs"][:1]),
                                  agent_state)
        np.testing.assert_array_equal(team_action.numpy()[0], action)
        assert int(mine[0]) == int(action[0])
        torch.testing.assert_close(agent_state, torch.as_tensor(team_state)[:, 0])  # the agent alone carries its
        np.testing.assert_allclose(state, np.asarray(team_state)[0], atol=1e-6)   # part of the team's state
        obs, reward, terminated, truncated, _ = env.step(action)
        total += reward
    assert total == 8.0 and truncated


def test_recurrent_agents_refuse_what_they_do_not_do():
    base = QMIXConfig().environment("recall_team").training(agent_rnn=True)
    with pytest.raises(ConfigError, match="uniformly"):
        base.copy().training(replay_buffer_config={"type": "prioritized"}).validate()
    with pytest.raises(ConfigError, match="n_step=1"):
        base.copy().training(n_step=3).validate()
    with pytest.raises(ConfigError, match="observation_filter"):
        base.copy().env_runners(observation_filter="MeanStdFilter").validate()
    with pytest.raises(ConfigError, match="agent_rnn=True"):
        base.copy().training(agent_rnn=False, agent_last_action=True).validate()


def test_a_saved_window_buffer_with_wrong_shapes_is_refused_before_anything_changes():
    from herdrl.obs import ObsSpec

    spec = ObsSpec(TeamEnv(make_agent_env("recall_team", {})).observation_space)
    buffer = SequenceReplayBuffer(4, spec, 3, (2,), np.int64, np.random.default_rng(0))
    state = buffer.state()
    state["rewards"] = np.zeros((0, 5), np.float32)
    with pytest.raises(ValueError, match="replay field 'rewards'"):
        buffer.load_state(state)


def test_a_window_buffer_saved_before_windows_held_their_previous_action_loads_with_none():
    """A checkpoint's replay without ``prev_actions`` (saved by the release before): its windows load as they were
    saved, each with no previous action (-1: the zero last action they were learned with)."""
    from herdrl.obs import ObsSpec

    spec = ObsSpec(TeamEnv(make_agent_env("recall_team", {})).observation_space)
    fragments, _ = stream_fragments([10] * 6, 11)
    sequencer = EpisodeSequencer(4, 2, 0.9)
    cut = [w for f in fragments for w in sequencer.add(f)]
    windows = [{**w, "obs": {"obs": np.full((7, 2, 2), i, np.float32), "state": np.zeros((7, 4), np.float32),
                             "action_mask": np.ones((7, 2, 2), np.int8)}, "actions": np.full((6, 2), i % 2),
                "prev_actions": np.full(2, i % 2)} for i, w in enumerate(cut)]
    saved = SequenceReplayBuffer(8, spec, 6, (2,), np.int64, np.random.default_rng(0))
    saved.add(windows)
    old = {k: v for k, v in saved.state().items() if k != "prev_actions"}
    buffer = SequenceReplayBuffer(8, spec, 6, (2,), np.int64, np.random.default_rng(0))
    buffer.load_state(old)
    again = buffer.state()
    assert all(np.array_equal(again[k], v) for k, v in old.items()) and len(buffer) == 8
    assert (again["prev_actions"] == -1).all() and (saved.state()["prev_actions"] >= 0).all()


def test_a_runners_fragments_cut_into_whole_recall_episodes():
    """A runner's own fragments (3 envs, 5 steps each: the recall game's 8-step episodes cross them, reset-only
    steps between): each window is one whole episode, its first observation the one that shows each agent's cue
    and the rest without it, as the game plays."""
    from herdrl.rollout.runner import EnvRunner

    config = (QMIXConfig().environment("recall_team").env_runners(num_envs_per_env_runner=3,
                                                                  rollout_fragment_length=5)
              .training(agent_rnn=True, model={"max_seq_len": 8}).debugging(seed=0))
    config.validate()
    runner = EnvRunner(config)
    runner.set_exploration({"epsilon": 1.0})
    sequencer = EpisodeSequencer(8, 0, 0.9)
    fragments = [runner.sample() for _ in range(12)]
    assert fragments[0].begins.all() and not fragments[1].begins.any()
    assert fragments[0].state_in is None and fragments[0].state_last is None  # (windows start from zeros)
    windows = [w for f in fragments for w in sequencer.add(f)]
    assert len(windows) >= 3 * 6
    for w in windows:
        cues = w["obs"]["obs"][:, :, 0]  # (9, agents): each agent's cue column
        assert w["valid"].all() and w["train"].all()
        assert (np.abs(cues[0]) == 1).all() and (cues[1:] == 0).all()
        np.testing.assert_allclose(w["discounts"], 0.9)  # truncated at 8 steps: bootstrapped, never terminated


def test_agents_reading_their_last_action_read_the_one_they_took_exploring():
    """Exploring, an agent's next input is the action it took (random or greedy), one-hot, not its greedy one; an
    episode's first step reads zeros."""
    learner = tiny_learner("vdn", last_action=True)
    module = learner.module
    env = TeamEnv(make_agent_env("recall_team", {}))
    obs, _ = env.reset(seed=1)
    batch = {k: np.stack([v, v]) for k, v in obs.items()}
    runner = TeamEpsilonGreedy(module, np.random.default_rng(0), num_envs=2)
    runner.epsilon = 1.0
    taken = [runner.act(batch) for _ in range(6)]
    np.testing.assert_array_equal(runner.state[..., 8:].numpy(), np.eye(2)[taken[-1]])
    with torch.no_grad():  # the same six steps by hand, each step reading the action taken before it
        state = torch.zeros(2, 2, 8 + 2)
        for actions in taken:
            _, state = module.step(to_torch(batch, "cpu"), state)
            state[..., 8:] = torch.nn.functional.one_hot(torch.as_tensor(actions), 2).float()
    torch.testing.assert_close(runner.state, state)


def test_recurrent_team_parameters_keep_the_previous_releases_order():
    """herdrl's optimizers restore their moments by parameter position: a recurrent team's parameters stay in the
    order its checkpoints were written in (mixer, then fc_in, rnn, fc_out), so a saved run resumes."""
    learner = tiny_learner("qmix", last_action=True)
    names = [name for name, _ in learner.module.named_parameters()]
    mixer = [name for name in names if name.startswith("mixer.")]
    assert len(mixer) == 14 and names[:14] == mixer
    assert names[14:] == ["fc_in.weight", "fc_in.bias", "rnn.weight_ih", "rnn.weight_hh", "rnn.bias_ih",
                          "rnn.bias_hh", "fc_out.weight", "fc_out.bias"]
