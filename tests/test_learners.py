"""Learners: in the driver, or N data-parallel Ray actors (gloo) that must learn exactly what one learner does."""

import os
import signal

import numpy as np
import pytest
import ray
import torch

from herdrl import A2CConfig, Algorithm, APPOConfig, ConfigError, DQNConfig, PPOConfig, SACConfig, TRPOConfig
from herdrl.algorithms import impala as impala_module
from herdrl.algorithms import ppo as ppo_module
from herdrl.algorithms.a2c import A2CLearner
from herdrl.algorithms.appo import APPOLearner
from herdrl.algorithms.dqn import DQNLearner
from herdrl.algorithms.impala import IMPALAConfig, IMPALALearner
from herdrl.algorithms.ppo import PPOLearner
from herdrl.learner.group import LearnerFailure, RayLearnerGroup
from herdrl.rollout import EnvRunner

pytestmark = pytest.mark.usefixtures("ray_session")


def _max_diff(a, b):
    return max(float(np.abs(np.asarray(a[k]) - np.asarray(b[k])).max()) for k in a)


def test_two_learners_update_like_one_learner_on_the_whole_batch():
    """PPO (7 envs x 48 steps, reset-only steps dropped: odd row counts, minibatches of ~55 split ~28/27, 3 epochs)
    and DQN (a replayed batch of 65): two gloo learners make the update one learner makes on the whole batch (to
    float rounding), and hold exactly the same weights as each other over 20 updates."""
    config = (PPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=7)
              .training(train_batch_size=333, minibatch_size=50, num_epochs=3).learners(num_learners=2)
              .debugging(seed=0))
    config.validate()
    runner = EnvRunner(config)
    one = PPOLearner(config, runner.observation_space, runner.action_space)
    group = RayLearnerGroup(config, PPOLearner, runner.observation_space, runner.action_space, init_seed=0)
    assert _max_diff(*group.call("get_weights")) == 0.0  # the same initial weights everywhere
    group.load_state(one.state())
    for update in range(20):
        fragments = [runner.sample(48)]
        single, split = one.update(fragments, update), group.update(fragments, update)
        assert split["num_gradient_updates"] == single["num_gradient_updates"] >= 18
        if update == 0:
            assert _max_diff(one.get_weights(), group.get_weights()) < 1e-5
        runner.set_weights(one.get_weights())
    # Later updates are not compared with the single learner: float rounding (sums in another order) flips PPO's
    # clipping for a sample now and then, and Adam amplifies it; the ranks, which sum in the same order, agree.
    ranks = group.call("get_weights")
    assert _max_diff(ranks[0], ranks[1]) == 0.0  # identical, not merely close
    group.stop()

    config = DQNConfig().environment("CartPole-v1").learners(num_learners=2).debugging(seed=0)
    config.validate()
    one = DQNLearner(config, runner.observation_space, runner.action_space)
    group = RayLearnerGroup(config, DQNLearner, runner.observation_space, runner.action_space, init_seed=0)
    group.load_state(one.state())
    rng = np.random.default_rng(0)
    for _ in range(5):
        batch = {"obs": rng.normal(size=(65, 4)).astype(np.float32), "next_obs": rng.normal(size=(65, 4)).astype(
            np.float32), "actions": rng.integers(0, 2, 65), "rewards": np.ones(65, np.float32),
            "discounts": np.full(65, 0.99, np.float32)}
        weights = rng.uniform(0.5, 1, 65).astype(np.float32)
        (_, td_one), (_, td_split) = one.update(batch, weights, 300), group.update(batch, weights, 300)
        assert td_split.shape == (65,) and np.allclose(td_one, td_split, atol=1e-5)  # rows back in order
    assert _max_diff(one.get_weights(), group.get_weights()) < 1e-5
    assert _max_diff(one.state()["target"], group.state()["target"]) < 1e-5  # target updates on the same clock
    group.stop()


def test_ppo_on_two_learners_solves_cartpole_and_resumes_on_one(tmp_path):
    algo = (PPOConfig().environment("CartPole-v1").learners(num_learners=2).debugging(seed=0).build())
    assert algo.learner is None and len(set(algo.learners.call("pid"))) == 2
    result = algo.train()
    while result["episode_return_mean"] < 475 and result["num_env_steps_sampled_lifetime"] < 150_000:
        result = algo.train()
    assert result["episode_return_mean"] >= 475
    path = algo.save(tmp_path / "two")
    weights = algo.get_weights()
    algo.stop()
    resumed = Algorithm.from_checkpoint(path, num_learners=0)  # 2 learners -> 1, in the driver
    assert _max_diff(resumed.get_weights(), weights) == 0.0
    assert resumed.train()["episode_return_mean"] >= 400
    resumed.stop()


def test_a_killed_learner_restarts_from_a_newer_checkpoint_and_past_the_budget_is_one_line(tmp_path):
    """With learner_state_interval=0 only the state at start is kept: a checkpoint written since is newer, and the
    group restarts from it (compared with the weights read at save time), saying how many updates that loses. An
    error of the learner's own code is one line, no restart; past max_num_learner_restarts the run ends with one
    line naming the checkpoint, and resumes from it."""
    algo = (PPOConfig().environment("CartPole-v1").training(train_batch_size=512).learners(num_learners=2)
            .fault_tolerance(max_num_learner_restarts=1, learner_state_interval=0).debugging(seed=0).build())
    algo.train()
    path = algo.save(tmp_path / "before")
    saved = algo.get_weights()
    algo.train()
    restart, restored = algo.learners._restart, []

    def restart_and_read(*args):
        restart(*args)
        restored.append(ray.get(algo.learners.actors[1].call.remote("get_weights")))

    algo.learners._restart = restart_and_read
    os.kill(algo.learners.call("pid")[1], signal.SIGKILL)
    row = algo.train()
    assert row["num_learner_restarts"] == 1 and row["num_learner_updates_lost"] == 1
    assert _max_diff(restored[0], saved) == 0.0 and _max_diff(algo.get_weights(), saved) > 0  # and it learned on
    os.kill(algo.learners.call("pid")[0], signal.SIGKILL)  # (rank 1's collective may fail first: either is named)
    with pytest.raises(LearnerFailure, match=r"learner [01] failed \(.*\) during its update, and the restart budget is "
                                             r"spent \(max_num_learner_restarts=1\): resume from the last checkpoint "
                                             r".*\(last checkpoint: .*before\)"):
        algo.train()
    algo.stop()
    resumed = Algorithm.from_checkpoint(path, num_learners=2)
    assert resumed.train()["training_iteration"] == 2
    with pytest.raises(LearnerFailure, match=r"learner [01] failed during its no_such_method \(AttributeError: "):
        resumed.learners.call("no_such_method")  # the learner's own error: no restart would cure it
    assert resumed.learners.num_restarts == 0
    resumed.stop()


def test_an_error_in_one_rank_alone_is_one_line_not_a_restart():
    """Rank 0's update raises while rank 1 waits for it in an all-reduce: rank 1 still answers that it is alive, so
    the group stops with rank 0's error at once (no restart could cure it) instead of taking it for a lost learner."""
    algo = (PPOConfig().environment("CartPole-v1").training(train_batch_size=256, minibatch_size=128)
            .learners(num_learners=2).debugging(seed=0).build())
    algo.train()

    def break_update(actor):
        import types

        def update(self, *args, **kwargs):
            raise ValueError("out of memory on this rank's GPU")

        actor.learner.update = types.MethodType(update, actor.learner)

    ray.get(algo.learners.actors[0].__ray_call__.remote(break_update))
    with pytest.raises(LearnerFailure, match=r"learner 0 failed during its update \(.*out of memory on this rank"):
        algo.train()
    assert algo.learners.num_restarts == 0
    algo.stop()


def test_a2c_and_sac_split_their_updates_between_two_learners():
    """A2C: the 2-learner step equals the 1-learner step; SAC (three losses, noise drawn per rank, normalised
    batches): ranks stay identical and the run learns on."""
    config = A2CConfig().environment("CartPole-v1").learners(num_learners=2).debugging(seed=0)
    config.validate()
    runner = EnvRunner(config)
    one = A2CLearner(config, runner.observation_space, runner.action_space)
    group = RayLearnerGroup(config, A2CLearner, runner.observation_space, runner.action_space, init_seed=0)
    group.load_state(one.state())
    fragments = [runner.sample()]
    one.update(fragments), group.update(fragments)
    assert _max_diff(one.get_weights(), group.get_weights()) < 1e-6
    group.stop()
    algo = (SACConfig().environment("Pendulum-v1").learners(num_learners=2)
            .env_runners(observation_filter="MeanStdFilter", norm_reward=True)  # normalised replayed batches
            .training(min_sample_timesteps_per_iteration=132, num_steps_sampled_before_learning_starts=100,
                      train_batch_size=64, model={"fcnet_hiddens": [32, 32]}).debugging(seed=0).build())
    result = algo.train()
    assert result["num_gradient_updates"] >= 16 and np.isfinite(result["critic_loss"])
    # Every sampled observation and the first reset (Pendulum: no episode ends in the first 200 steps).
    assert algo.normalizer.stats["obs"].count == result["num_env_steps_sampled"] + 1
    ranks = algo.learners.call("state")
    assert _max_diff(ranks[0]["module"], ranks[1]["module"]) == 0.0 and ranks[0]["log_alpha"] == ranks[1]["log_alpha"]
    algo.stop()


def _sharded_and_single_update(config, learner_class, update_args: tuple, monkeypatch, places=None, updates=1):
    """``updates`` updates on 3 fragments (3 envs x 32 steps) by 2 learner actors with shard_fragments (learner 0
    fetches 2, learner 1 one) and by one learner from the same weights: (sharded weights, single weights, the single
    update's metrics, each rank's state, the single learner's state). ``places``: the minibatches of 2 passes given
    to the single learner in its own rows (see below), for each update."""
    from herdrl.rollout.transport import FragmentInput

    config = (config.environment("CartPole-v1").env_runners(num_env_runners=2, num_envs_per_env_runner=3)
              .learners(num_learners=2, shard_fragments=True).debugging(seed=0))
    config.validate()
    runner = EnvRunner(config)
    fragments = [runner.sample(32) for _ in range(3)]
    one = learner_class(config, runner.observation_space, runner.action_space)
    group = RayLearnerGroup(config, learner_class, runner.observation_space, runner.action_space, init_seed=0)
    group.load_state(one.state())
    refs = FragmentInput([ray.put(f) for f in fragments])
    for _ in range(updates):
        split = group.update(refs, *update_args)
    sharded, ranks = group.get_weights(), group.call("state")
    group.stop()
    with monkeypatch.context() as patch:
        if places is not None:  # the whole batch's minibatches, drawn over the shares end to end, in its own rows
            rng, rows = np.random.default_rng(7), places(fragments)
            count = round(len(rows) / 40)
            epochs = [[rows[part] for part in np.array_split(rng.permutation(len(rows)), count)]
                      for _ in range(2)] * updates  # (each update's seed is the same: the same minibatches)
            for module in (ppo_module, impala_module):
                patch.setattr(module, "minibatches", lambda *args: epochs.pop(0))
        for _ in range(updates):
            single = one.update(fragments, *update_args)
    for key in [key for key in ("num_gradient_updates", "num_gradient_steps") if key in single]:  # (A2C: one)
        assert split[key] == single[key]
    return sharded, one.get_weights(), single, ranks, one.state()


def _assert_value_statistics(ranks: list[dict], state: dict) -> None:
    """Every rank holds the single learner's value-normalisation statistics (which saw targets: not the initial)."""
    names = [key for key in state["module"] if key.startswith("value_normalizer.")]
    assert len(names) == 3 and float(state["module"]["value_normalizer.count"]) > 0
    for rank in ranks:
        for key in names:
            assert torch.allclose(rank["module"][key], state["module"][key], rtol=1e-6), key  # (weights: 1e-5)


def test_learners_sharing_out_the_fragments_step_on_the_union_of_their_minibatches(monkeypatch):
    """shard_fragments: of 3 fragments learner 0 fetches 2 and learner 1 one, each learning on its own rows only.
    PPO: each gradient step must be one learner's step on the whole batch's minibatch (drawn over the shares laid end
    to end), advantages normalised over both shares (and with value_normalization, the value statistics merged from
    both). A recurrent batch's sequences are the shares' end to end already: one learner's own update must match. An
    MLP batch's rows are time-major with the fragments' envs side by side: one learner is given the same minibatches
    in its own rows. A2C: one step on the whole batch, whatever its
    rows' order: one learner's own update must match. IMPALA and APPO likewise (APPO's old policy refreshed on the
    env steps of every share)."""
    def places(fragments):  # where each share's rows (real steps, time-major, envs side by side) are in the whole
        layout = lambda parts: [(i, env, t) for t in range(32) for i in parts for env in range(3)  # noqa: E731
                                if fragments[i].valid[t, env]]
        whole = {row: n for n, row in enumerate(layout([0, 1, 2]))}
        return np.array([whole[row] for row in layout([0, 1]) + layout([2])])

    for model, where, value_norm in (({"fcnet_hiddens": [64, 64]}, places, False),
                                     ({"use_lstm": True, "lstm_cell_size": 16, "max_seq_len": 8}, None, False),
                                     ({"fcnet_hiddens": [64, 64]}, places, True)):
        config = PPOConfig().training(train_batch_size=288, minibatch_size=40, num_epochs=2, model=model,
                                      value_normalization=value_norm)
        # (value normalisation: 2 updates, the second merging into statistics the first began)
        sharded, single, metrics, ranks, state = _sharded_and_single_update(config, PPOLearner, (7,), monkeypatch,
                                                                            where, updates=1 + value_norm)
        assert metrics["num_gradient_updates"] >= 2 * 6 and _max_diff(sharded, single) < 1e-5
        if value_norm:  # every rank's value statistics are the whole batch's, as one learner's
            _assert_value_statistics(ranks, state)
    for value_norm in (False, True):
        config = A2CConfig().training(normalize_advantages=True, train_batch_size=288, value_normalization=value_norm)
        sharded, single, _, ranks, state = _sharded_and_single_update(config, A2CLearner, (), monkeypatch,
                                                                      updates=1 + value_norm)
        # (1e-5 as for PPO and IMPALA: a 2-rank gradient sums its rows in another order than one learner's, and the
        # last bits vary run to run; 1e-6 failed once at 1.4e-6 under two pytest workers)
        assert _max_diff(sharded, single) < 1e-5
        if value_norm:
            _assert_value_statistics(ranks, state)
    # IMPALA (V-trace along each env's own steps, afresh for each minibatch): 2 passes of minibatches of ~40; an
    # LSTM's sequences (max_seq_len 8) are the shares' end to end already.
    for model, where in (({"fcnet_hiddens": [64, 64]}, places),
                         ({"use_lstm": True, "lstm_cell_size": 16, "max_seq_len": 8}, None)):
        config = IMPALAConfig().training(train_batch_size=288, minibatch_size=40, model=model)
        sharded, single, metrics, _, _ = _sharded_and_single_update(config, IMPALALearner, (2, 7), monkeypatch, where)
        assert metrics["num_gradient_steps"] >= 2 * 6 and _max_diff(sharded, single) < 1e-5
    # APPO, 2 updates of 2 whole-batch passes: the old policy is refreshed after the first (500 env steps of the
    # 576 trained), when the env steps of both shares are counted (either share's alone are fewer than 500); both
    # ranks keep the single learner's old policy and count.
    config = APPOConfig().training(train_batch_size=288, target_network_update_freq=500,
                                   model={"fcnet_hiddens": [64, 64]})
    sharded, single, metrics, ranks, state = _sharded_and_single_update(config, APPOLearner, (2, 7), monkeypatch,
                                                                        updates=2)
    assert metrics["num_gradient_steps"] == 2 and _max_diff(sharded, single) < 1e-5
    for rank in ranks:
        assert rank["trained_since_refresh"] == state["trained_since_refresh"] > 0
        assert _max_diff(rank["old"], state["old"]) < 1e-5


def test_learner_settings_are_checked():
    with pytest.raises(ConfigError, match="TRPO learns on one learner"):
        TRPOConfig().environment("CartPole-v1").learners(num_learners=2).validate()
    with pytest.raises(ConfigError, match="num_learners=9 is more than train_batch_size=8"):
        DQNConfig().environment("CartPole-v1").training(train_batch_size=8).learners(num_learners=9).validate()
    with pytest.raises(ConfigError, match="minibatch_size=3 is too small to split between 2 learners"):
        PPOConfig().environment("CartPole-v1").training(minibatch_size=3).learners(num_learners=2).validate()
    with pytest.raises(ConfigError, match="shard_fragments=True: DQN learns from replayed batches, not fragments"):
        (DQNConfig().environment("CartPole-v1").env_runners(num_env_runners=2)
         .learners(num_learners=2, shard_fragments=True).validate())
    with pytest.raises(ConfigError, match=r"shard_fragments=True: IMPALA learns on 2 fragment\(s\) per update "
                                          r"\(train_batch_size 800 over 400 env steps per fragment\), fewer than "
                                          r"num_learners=4: raise train_batch_size"):
        (IMPALAConfig().environment("CartPole-v1").env_runners(num_env_runners=1)
         .learners(num_learners=4, shard_fragments=True).validate())
    with pytest.raises(ConfigError, match="shard_fragments=True: APPO shards the fragments of Ray runners: set "
                                          "num_env_runners >= 1"):
        APPOConfig().environment("CartPole-v1").learners(num_learners=2, shard_fragments=True).validate()
    with pytest.raises(ConfigError, match="shard_fragments=True: TRPO learns on its fragments as one batch"):
        TRPOConfig().environment("CartPole-v1").learners(num_learners=1, shard_fragments=True).validate()
    with pytest.raises(ConfigError, match="shard_fragments=True: PPO shards the fragments of Ray runners"):
        PPOConfig().environment("CartPole-v1").learners(num_learners=2, shard_fragments=True).validate()
    with pytest.raises(ConfigError, match="shard_fragments=True: PPO needs learner actors"):
        PPOConfig().environment("CartPole-v1").learners(num_learners=1, shard_fragments=True).validate()
    with pytest.raises(ConfigError, match="num_gpus=1 is the GPU of the learner in the driver.*num_gpus_per_learner"):
        PPOConfig().environment("CartPole-v1").resources(num_gpus=1).learners(num_learners=2).validate()
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="num_gpus_per_learner=1 but torch sees no GPU"):
            PPOConfig().environment("CartPole-v1").learners(num_gpus_per_learner=1).build()


def test_bf16_autocast_computes_the_loss_in_bfloat16_and_keeps_float32_weights():
    """The same update with mixed_precision="bf16" (CPU autocast here; the GPU learner's path too): weights and
    optimizer state stay float32, and the step is the float32 step to bfloat16's precision, not the same."""
    base = (PPOConfig().environment("CartPole-v1").training(train_batch_size=256, minibatch_size=256, num_epochs=1)
            .debugging(seed=0))
    base.validate()
    runner = EnvRunner(base)
    fragments = [runner.sample()]
    learners = []
    for precision in (None, "bf16"):
        config = base.copy().learners(mixed_precision=precision)
        config.validate()
        torch.manual_seed(0)
        learner = PPOLearner(config, runner.observation_space, runner.action_space)
        before = learner.get_weights()
        seen = []
        loss = learner.loss
        learner.loss = lambda batch, loss=loss, seen=seen: seen.append(torch.get_autocast_dtype("cpu")
                                                                       if torch.is_autocast_enabled("cpu")
                                                                       else None) or loss(batch)
        learner.update(fragments, 0)
        assert seen == [None if precision is None else torch.bfloat16]
        learners.append((learner, before))
    (fp32, start), (bf16, same_start) = learners
    assert _max_diff(start, same_start) == 0.0
    assert all(p.dtype == torch.float32 for p in bf16.module.parameters())
    assert all(t.dtype == torch.float32 for t in bf16.optimizer.state_dict()["exp_avg"])
    step32 = {k: fp32.get_weights()[k] - start[k] for k in start}
    step16 = {k: bf16.get_weights()[k] - start[k] for k in start}
    assert 0 < _max_diff(step32, step16) < 0.5 * max(float(np.abs(v).max()) for v in step32.values())
    with pytest.raises(ConfigError, match=r"mixed_precision' got 'fp16'; expected one of \['bf16'\]"):
        base.copy().learners(mixed_precision="fp16").validate()


class _FakeRank:
    """A learner actor that only counts the updates its state holds; its calls run at once (a ref is the result)."""

    def __init__(self, applied: int = 0) -> None:
        self.applied = applied
        self.call = self  # actor.call.remote(method, *args), as on a LearnerActor

    def remote(self, method, *args):
        if method == "update_at":
            self.applied += 1
            return {"loss": 0.0}
        assert method == "state", method
        return {"applied": self.applied}


def test_restart_counters_stay_monotone_when_a_fallback_passes_the_checkpoint(monkeypatch):
    """A restart that cannot read the newest kept state nor the checkpoint falls back to an older kept state; the
    checkpoint then holds updates of the abandoned timeline, so the next restart must not go forward to it: the
    updates lost only grow and always equal the updates made minus those the restored state holds (counted by a
    fake learner here), and the group's update count is the state's. (Bookkeeping only: fake actors, no Ray.)"""
    import herdrl.survival
    from herdrl.learner.group import _LearnerDied

    monkeypatch.setattr(herdrl.survival, "node_changes", lambda: ([], []))
    config = PPOConfig().fault_tolerance(learner_state_interval=1)
    group = object.__new__(RayLearnerGroup)  # the bookkeeping of a started group, with one fake rank
    group.config, group.actors, group.aggregators, group._stream = config, [_FakeRank()], [], None
    group.num_restarts = group.num_updates_lost = group._updates = 0
    group._checkpoint_updates, group._kept, group._warned_unsharded = None, [], False
    group._keep()
    lost_states, fail, checkpoint = [], [], {"state": None, "readable": True}
    group.checkpoint_state = lambda: checkpoint["state"] if checkpoint["readable"] else None
    group._checkpoint_ref = group.checkpoint_state  # (no object store: the state itself)
    group._kill_actors = lambda: None

    def start_with(state, source, timeout, failures):  # a state lost with its node cannot be loaded
        if any(state is lost for lost in lost_states):
            failures.append(f"{source}: lost")
            return False
        group.actors = [_FakeRank(state["applied"])]
        return True

    def get(refs, what, timeout_s=None):
        if fail:
            fail.pop()
            raise _LearnerDied(0, "was killed")
        return refs

    group._start_with, group._get = start_with, get
    made, history = 0, []

    def update(count, iteration_end=True):
        nonlocal made
        for _ in range(count):
            group.update()
            made += 1
        if iteration_end:
            group.end_iteration(1)  # keeps a state (learner_state_interval=1)
        applied = group.actors[0].applied
        assert group._updates == applied and group.num_updates_lost == made - applied
        history.append(group.num_updates_lost)

    update(4)  # kept: after 4
    update(2, iteration_end=False)
    checkpoint["state"] = group.state()  # a checkpoint after 6 updates
    group.checkpoint_written()
    update(2)  # kept: after 8 and 4
    lost_states.append(group._kept[0][0])  # the state after 8 goes with its node, and the checkpoint is unreadable
    checkpoint["readable"], fail[:] = False, [True]
    update(1, iteration_end=False)  # the 9th update fails: restarted from the state after 4, and made again
    assert group.num_restarts == 1 and group.num_updates_lost == 4 and group.actors[0].applied == 5
    checkpoint["readable"], fail[:] = True, [True]
    update(1)  # fails again: back to the state after 4, not forward to the checkpoint's (another timeline)
    assert group.num_restarts == 2 and group.num_updates_lost == 5 and group.actors[0].applied == 5
    assert group._checkpoint_updates is None
    update(1, iteration_end=False)
    checkpoint["state"] = group.state()  # a checkpoint of this timeline: a restart's candidate again
    group.checkpoint_written()
    fail[:] = [True]
    update(1)
    assert group.num_restarts == 3 and group.num_updates_lost == 5 and group.actors[0].applied == 7  # (from it)
    assert history == sorted(history)  # never decreasing
