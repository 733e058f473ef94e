"""Recurrent (LSTM) policies: runners carry the state, the learner unrolls sequences from it."""

import numpy as np
import pytest
import torch

from herdrl import ConfigError, PPOConfig, SACConfig
from herdrl.policy import Policy
from herdrl.rollout.batch import recurrent_batch
from herdrl.rollout.runner import EnvRunner

LSTM = {"use_lstm": True, "lstm_cell_size": 16, "max_seq_len": 4, "fcnet_hiddens": [16]}


def recall_ppo(lstm=True, **training):
    model = LSTM if lstm else {"fcnet_hiddens": [32]}
    # One-hot cues need no normalisation: raw inputs keep the tests' hand-stepped modules comparable.
    return (PPOConfig().environment("herd/Recall-v0", env_config={"delay": 3})
            .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=10, observation_filter="NoFilter")
            .training(train_batch_size=20, minibatch_size=8, model=model, **training).debugging(seed=0))


def test_the_learner_unrolls_exactly_what_the_runner_computed_across_fragments_and_episodes():
    """Episodes of 5 steps plus a reset-only step, sequences of at most 4, fragments of 11 (the second begins with
    a reset-only step): sequences cover every step once, never cross an episode start, and the batch's
    log-probabilities equal a plain step-by-step LSTM over the whole run, zeroed where episodes begin."""
    runner = EnvRunner(recall_ppo().env_runners(rollout_fragment_length=11).training(train_batch_size=22))
    module = runner.module
    first, second = runner.sample(), runner.sample()
    obs = np.concatenate([first.obs[:-1], second.obs])
    valid = np.concatenate([first.valid, second.valid])
    actions = np.concatenate([first.actions, second.actions])
    expected = np.zeros(valid.shape, np.float32)
    with torch.no_grad():
        for b in range(2):
            state = module.initial_state(1)
            for s in range(len(valid)):
                if s > 0 and not valid[s - 1, b]:  # the step before was reset-only: a new episode
                    state = module.initial_state(1)
                out, state = module.step(torch.as_tensor(obs[s, b][None]), state)
                expected[s, b] = torch.log_softmax(module.pi_head(out), -1)[0, actions[s, b]]
    batch = recurrent_batch(module, [second], 0.99, 0.95, 4, torch.device("cpu"))
    index = batch["seq_index"].numpy()
    assert sorted(index[index >= 0].tolist()) == list(range(22))  # every step of the fragment, once
    checked = 0
    for n in range(len(index)):
        steps = [(i // 2, i % 2) for i in index[n] if i >= 0]
        assert len({b for _, b in steps}) == 1 and [s for s, _ in steps] == list(range(steps[0][0], steps[-1][0] + 1))
        # One episode per sequence: no step in it follows a reset-only step, and one begins where an episode does.
        assert all(second.valid[s - 1, b] for s, b in steps[1:])
        for t, (s, b) in enumerate(steps):
            assert bool(batch["valid"][n, t]) == bool(second.valid[s, b])
            if batch["valid"][n, t]:
                assert float(batch["old_logp"][n, t]) == pytest.approx(float(expected[11 + s, b]), abs=1e-5)
                checked += 1
    assert checked == second.valid.sum() and not first.valid.all()  # episode ends inside the fragments
    assert not second.valid[0].any()  # the second fragment begins with the reset-only step


def test_lstm_ppo_remembers_a_cue_an_mlp_cannot():
    """herd/Recall-v0: a cue at the first step, the answer 4 steps later; without memory the best is 0.5."""
    results = {}
    for lstm in (True, False):
        algo = (recall_ppo(lstm).env_runners(num_envs_per_env_runner=8, rollout_fragment_length="auto")
                .training(train_batch_size=512, minibatch_size=128, num_epochs=4, lr=3e-3, gamma=0.99,
                          model={**LSTM, "lstm_cell_size": 32, "max_seq_len": 8, "fcnet_hiddens": [32]}
                          if lstm else {"fcnet_hiddens": [32]})).build()
        best = max(algo.train()["episode_return_mean"] for _ in range(25))
        results[lstm] = best
        algo.stop()
    assert results[True] >= 0.95 and results[False] < 0.75, results


def test_recurrent_policy_checkpoint_and_evaluation_carry_the_state(tmp_path):
    algo = recall_ppo().evaluation(evaluation_interval=1, evaluation_duration=4).build()
    result = algo.train()
    assert result["evaluation/num_episodes_cut"] == 0 and np.isfinite(result["evaluation/episode_return_mean"])
    path = algo.save(tmp_path / "ckpt")
    policy = Policy.from_checkpoint(path)
    assert policy.recurrent and policy.initial_state().shape == (1, 2, 16)
    obs = np.eye(3, dtype=np.float32)[[0, 2, 2, 1]]
    state, actions = None, []
    for o in obs:  # the policy's state carried by hand equals the module stepped by hand
        action, state = policy.compute_single_action(o, state=state)
        actions.append(action)
    with torch.no_grad():
        manual, expected = algo.module.initial_state(1), []
        for o in obs:
            out, manual = algo.module.step(torch.as_tensor(o[None]), manual)
            expected.append(int(algo.module.pi_head(out).argmax()))
    assert actions == expected
    np.testing.assert_allclose(state, manual[0].numpy(), atol=1e-6)
    batch_actions, batch_state = policy.compute_actions(obs[:2])
    assert batch_actions.shape == (2,) and batch_state.shape == (2, 2, 16)
    algo.stop()


def test_lstm_settings_are_checked():
    with pytest.raises(ConfigError, match="use_lstm is not supported by SAC"):
        SACConfig().environment("Pendulum-v1").training(model={"use_lstm": True}).validate()
    with pytest.raises(ConfigError, match="lstm_use_prev_action/lstm_use_prev_reward need use_lstm=True"):
        PPOConfig().environment("CartPole-v1").training(model={"lstm_use_prev_action": True}).validate()
    with pytest.raises(ConfigError, match="max_seq_len"):
        PPOConfig().environment("CartPole-v1").training(model={"use_lstm": True, "max_seq_len": 0}).validate()


@pytest.mark.usefixtures("ray_session")
def test_lstm_ppo_on_a_ray_runner_and_a2c():
    algo = recall_ppo().env_runners(num_env_runners=1).build()
    results = [algo.train() for _ in range(2)]
    assert results[-1]["num_env_steps_sampled_lifetime"] > 0 and np.isfinite(results[-1]["policy_loss"])
    algo.stop()
    from herdrl import A2CConfig

    a2c = (A2CConfig().environment("herd/Recall-v0").env_runners(num_envs_per_env_runner=4)
           .training(model=LSTM).debugging(seed=0)).build()
    assert np.isfinite(a2c.train()["policy_loss"])
    a2c.stop()
    from herdrl import APPOConfig

    appo = (APPOConfig().environment("herd/Recall-v0").env_runners(num_env_runners=1, num_envs_per_env_runner=4,
                                                                  rollout_fragment_length=16)
            .training(model=LSTM, train_batch_size=64).debugging(seed=0)).build()
    results = [appo.train() for _ in range(3)]  # asynchronous: fragments sampled with older weights
    assert np.isfinite(results[-1]["policy_loss"]) and results[-1]["num_env_steps_trained"] > 0
    appo.stop()


def test_exported_recurrent_policy_takes_and_returns_its_state(tmp_path):
    import onnxruntime as ort

    from herdrl.export import export_policy

    algo = recall_ppo().build()
    algo.train()
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    policy = Policy.from_checkpoint(path)
    obs = np.eye(3, dtype=np.float32)[[0, 2, 2, 1]]
    session = ort.InferenceSession(str(export_policy(path, "onnx", tmp_path / "p.onnx")))
    program = torch.export.load(str(export_policy(path, "torch-export", tmp_path / "p.pt2"))).module()
    assert [i.name for i in session.get_inputs()] == ["obs", "state_in"]
    state = onnx_state = torch_state = policy.initial_state(2)
    for o in obs:  # two envs, the same observations: a batch of 2 stepped 4 times, state carried
        batch = np.stack([o, o])
        actions, state = policy.compute_actions(batch, state=state)
        onnx_actions, onnx_state = session.run(None, {"obs": batch, "state_in": onnx_state})
        torch_actions, torch_state = program(torch.as_tensor(batch), torch.as_tensor(torch_state))
        assert onnx_actions.tolist() == actions.tolist() == torch_actions.tolist()
        np.testing.assert_allclose(onnx_state, state, atol=1e-5)
        torch_state = torch_state.numpy()
    assert np.abs(state).max() > 0


@pytest.mark.usefixtures("ray_session")
def test_two_learners_make_the_single_learners_recurrent_update():
    """Sequences hold different numbers of real steps (reset-only steps, padding): each learner's share of the
    gradient is its share of the real steps, so two learners make the update one makes (to float rounding)."""
    from herdrl.algorithms.ppo import PPOLearner
    from herdrl.learner.group import RayLearnerGroup

    config = recall_ppo().env_runners(num_envs_per_env_runner=3, rollout_fragment_length=11).training(
        train_batch_size=33, minibatch_size=8, num_epochs=2).learners(num_learners=2)
    config.validate()
    runner = EnvRunner(config)
    one = PPOLearner(config, runner.observation_space, runner.action_space)
    group = RayLearnerGroup(config, PPOLearner, runner.observation_space, runner.action_space, init_seed=0)
    group.load_state(one.state())
    fragments = [runner.sample()]
    single, split = one.update(fragments, 7), group.update(fragments, 7)
    assert single["num_gradient_updates"] == split["num_gradient_updates"] >= 4
    weights = one.get_weights()
    assert max(float(np.abs(weights[k] - group.get_weights()[k]).max()) for k in weights) < 1e-5
    group.stop()


def test_lstm_impala_batch_unrolls_the_runners_policy_and_vtrace_without_lag_is_the_n_step_return():
    """With the runner's own weights, the learner's unrolled log-probabilities are the behaviour log-probabilities
    the runner recorded step by step, and V-trace's targets are the discounted returns to the fragment's end
    (GAE with lambda 1), on every real step."""
    from herdrl import IMPALAConfig
    from herdrl.algorithms.impala import recurrent_vtrace_batch
    from herdrl.rollout.advantages import compute_gae
    from herdrl.rollout.batch import from_sequences, sequence_batch

    config = (IMPALAConfig().environment("herd/Recall-v0", env_config={"delay": 3})
              .env_runners(num_envs_per_env_runner=3, rollout_fragment_length=11)
              .training(train_batch_size=33, model=LSTM).debugging(seed=0))
    config.validate()
    runner = EnvRunner(config)
    runner.sample()
    fragment = runner.sample()  # begins mid-episode, with the state carried over
    device = torch.device("cpu")
    batch = recurrent_vtrace_batch(runner.module, [fragment], config, device)
    valid = fragment.valid
    logp = from_sequences(batch, batch["old_logp"].numpy(), 11, 3)
    np.testing.assert_allclose(logp[valid], fragment.logp[valid], atol=1e-5)
    _, _, values = sequence_batch(runner.module, [fragment], 4, device)
    _, returns = compute_gae(fragment.rewards, values, fragment.terminateds, fragment.truncateds, config.gamma, 1.0)
    np.testing.assert_allclose(from_sequences(batch, batch["vs"].numpy(), 11, 3)[valid], returns[valid], atol=1e-4)


def test_lstm_appo_and_impala_remember_a_cue_an_mlp_cannot():
    from herdrl import APPOConfig, IMPALAConfig

    def best(config_class, model):
        algo = (config_class().environment("herd/Recall-v0", env_config={"delay": 3})
                .env_runners(num_envs_per_env_runner=8, rollout_fragment_length=16)
                .training(train_batch_size=256, lr=3e-3, model=model).debugging(seed=0)).build()
        result = max(algo.train()["episode_return_mean"] for _ in range(60))
        algo.stop()
        return result

    lstm = {**LSTM, "lstm_cell_size": 32, "max_seq_len": 8, "fcnet_hiddens": [32]}
    assert best(APPOConfig, lstm) >= 0.95 and best(IMPALAConfig, lstm) >= 0.95
    assert best(APPOConfig, {"fcnet_hiddens": [32]}) < 0.75


def test_observations_carry_the_previous_action_and_reward_zeroed_where_an_episode_begins():
    config = (PPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=4)
              .training(model={**LSTM, "lstm_use_prev_action": True, "lstm_use_prev_reward": True}).debugging(seed=0))
    runner = EnvRunner(config)
    fragment = runner.sample(80)
    obs, done = fragment.obs, fragment.terminateds | fragment.truncateds
    assert done.any()
    for t in range(80):  # step t's action and reward show in the observation it produced (row t + 1)...
        begins = done[t - 1] if t else np.zeros(4, bool)  # ...unless step t only reset the env
        np.testing.assert_array_equal(obs["prev_action"][t + 1], np.where(begins, 0, fragment.actions[t]))
        np.testing.assert_array_equal(obs["prev_reward"][t + 1, :, 0], np.where(begins, 0, fragment.rewards[t]))


def test_lstm_with_the_previous_action_and_reward_finds_the_paying_arm_of_a_bandit():
    """herd/Bandit-v0: the paying arm changes every episode and the observation never tells: only the rewards
    of earlier pulls do (best about 9.5 of 10, blind 5)."""
    def final(prev):
        model = {**LSTM, "lstm_cell_size": 32, "max_seq_len": 10, "fcnet_hiddens": [32],
                 "lstm_use_prev_action": prev, "lstm_use_prev_reward": prev}
        algo = (PPOConfig().environment("herd/Bandit-v0").env_runners(num_envs_per_env_runner=16)
                .training(train_batch_size=640, minibatch_size=160, num_epochs=4, lr=3e-3, gamma=0.9,
                          entropy_coeff=0.01, model=model)
                .evaluation(evaluation_interval=25, evaluation_duration=20).debugging(seed=0)).build()
        result = [algo.train() for _ in range(25)][-1]
        algo.stop()
        return result

    remembers, blind = final(True), final(False)
    assert remembers["episode_return_mean"] > 8.5 and remembers["evaluation/episode_return_mean"] > 8.5
    assert blind["episode_return_mean"] < 6.5


def test_an_lstm_on_a_cnn_encoder_learns_from_frames():
    """MovingDot (10 x 10 uint8 frames: which way did the dot move?) through the small CNN, then the LSTM."""
    from envs import MovingDot

    import herdrl

    herdrl.register_env("moving_dot_lstm", lambda cfg: MovingDot())
    algo = (PPOConfig().environment("moving_dot_lstm").env_runners(num_envs_per_env_runner=8)
            .training(train_batch_size=256, minibatch_size=64, num_epochs=4, lr=1e-3,
                      model={**LSTM, "lstm_cell_size": 32}).debugging(seed=0)).build()
    assert type(algo.module.pi_encoder.leaves[0]).__name__ == "ImageEncoder"
    results = [algo.train() for _ in range(15)]
    assert results[-1]["episode_return_mean"] > results[0]["episode_return_mean"] + 0.2
    algo.stop()


def test_the_loss_ignores_padding_and_reset_only_steps():
    """PPO's loss on a sequence batch is the same when everything at padded and reset-only positions (the
    observations the LSTM reads there included) is replaced by garbage."""
    from herdrl.algorithms.ppo import PPOLearner

    config = recall_ppo().env_runners(rollout_fragment_length=11).training(train_batch_size=22)
    config.validate()
    runner = EnvRunner(config)
    runner.sample()
    fragment = runner.sample()
    learner = PPOLearner(config, runner.observation_space, runner.action_space)
    learner.module.load_state_dict(runner.module.state_dict())
    batch = recurrent_batch(learner.module, [fragment], 0.99, 0.95, 4, torch.device("cpu"))
    invalid = ~batch["valid"]
    assert invalid.any() and (batch["seq_index"] < 0).any()  # padding and reset-only steps are there
    garbage = dict(batch)
    for key in ("obs", "advantages", "returns", "old_logp", "old_values"):
        garbage[key] = batch[key].masked_fill(invalid.reshape(*invalid.shape, *[1] * (batch[key].dim() - 2)), 1e3)
    garbage["actions"] = batch["actions"].masked_fill(invalid, 1)
    loss, _ = learner.loss(batch)
    corrupted, _ = learner.loss(garbage)
    assert torch.equal(loss, corrupted)
    garbage["advantages"] = batch["advantages"] + 1.0 * batch["valid"]  # a real step's change does show
    assert not torch.equal(learner.loss(garbage)[0], loss)


def test_an_lstm_run_takes_its_own_defaults_where_the_user_set_nothing():
    """What the README's LSTM line gets (benchmarks/memory.py --defaults measures it): lr 7e-4 and normalised
    observations, unless the user set them; a run without the LSTM keeps PPO's defaults."""
    from herdrl.cli import parse_overrides

    def resolved(config):
        config.validate()
        return config.lr, config.observation_filter

    lstm = {"model": {"use_lstm": True}}
    env = "herd/StatelessCartPole-v1"
    assert resolved(PPOConfig().environment(env).training(**lstm)) == (7e-4, "MeanStdFilter")
    assert resolved(PPOConfig().environment(env)) == (2e-3, "NoFilter")  # no LSTM: PPO's own defaults
    # A value the user gives wins, however it is given: builder, CLI overrides, a dict (Tune, YAML).
    assert resolved(PPOConfig().environment(env).training(lr=5e-4, **lstm)) == (5e-4, "MeanStdFilter")
    cli = PPOConfig.from_dict(parse_overrides(["model.use_lstm=true", "observation_filter=NoFilter"]))
    assert resolved(cli.environment(env)) == (7e-4, "NoFilter")
    assert resolved(PPOConfig.from_dict({"env": env, "lr": 3e-3, **lstm}))[0] == 3e-3
    config = PPOConfig().environment(env).training(**lstm)
    config.lr = 4e-4  # set as an attribute
    assert resolved(config)[0] == 4e-4
    # A checkpoint's config is the user's: it keeps what it trained with (an LSTM run of herdrl 0.2 had no filter).
    saved = PPOConfig().environment(env).training(**lstm).to_dict()
    saved.update(lr=2e-3, observation_filter="NoFilter")
    assert resolved(PPOConfig.from_dict(saved)) == (2e-3, "NoFilter")
    assert resolved(PPOConfig().environment(env).training(**lstm).copy()) == (7e-4, "MeanStdFilter")
    config = PPOConfig().environment(env).training(**lstm)
    resolved(config)
    assert resolved(config.training(model={"use_lstm": False})) == (2e-3, "NoFilter")  # off again: PPO's own
    # Multi-agent LSTM runs keep the algorithm's defaults (those were measured on single-agent memory tasks).
    assert resolved(PPOConfig().environment("pettingzoo/classic/tictactoe-v3").training(**lstm)) == (2e-3, "NoFilter")
