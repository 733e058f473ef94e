"""IMPALA and APPO: V-trace, asynchronous sampling (requests in flight, backpressure, lag), fault tolerance."""

import os
import signal

import numpy as np
import pytest
import torch

import herdrl
from herdrl import APPOConfig, IMPALAConfig
from herdrl.algorithms.appo import APPOLearner
from herdrl.algorithms.impala import IMPALALearner
from herdrl.env.testing import LatencyEnv
from herdrl.learner.group import RayLearnerGroup
from herdrl.rollout import EnvRunner
from herdrl.rollout.advantages import compute_gae
from herdrl.rollout.transport import resolve
from herdrl.rollout.vtrace import vtrace


def _reference_vtrace(mu, pi, rewards, values, terminated, truncated, gamma, rho_bar, pg_rho_bar, c_bar=1.0):
    """The paper's sum form, one env at a time in plain Python: v_s = V(x_s) + sum_t gamma^(t-s) (prod_{i<t} c_i)
    delta_t, the sum running to the episode's or the fragment's end; advantages from v_{s+1}."""
    steps = len(rewards)
    ratio = [float(np.exp(p - m)) for p, m in zip(pi, mu, strict=True)]
    rho = [min(rho_bar, r) for r in ratio]
    c = [min(c_bar, r) for r in ratio]
    next_value = [0.0 if terminated[t] else values[t + 1] for t in range(steps)]
    delta = [rho[t] * (rewards[t] + gamma * next_value[t] - values[t]) for t in range(steps)]
    vs = []
    for s in range(steps):
        total, weight, t = 0.0, 1.0, s
        while True:
            total += gamma ** (t - s) * weight * delta[t]
            if terminated[t] or truncated[t] or t == steps - 1:
                break
            weight *= c[t]
            t += 1
        vs.append(values[s] + total)
    advantages = []
    for s in range(steps):
        ended = terminated[s] or truncated[s]
        following = next_value[s] if ended else (vs[s + 1] if s + 1 < steps else values[steps])
        advantages.append(min(pg_rho_bar, ratio[s]) * (rewards[s] + gamma * following - values[s]))
    return np.array(vs), np.array(advantages)


def test_vtrace_matches_the_papers_sums_with_clipping_and_episode_ends():
    rng = np.random.default_rng(0)
    steps, envs = 7, 3
    mu = rng.normal(-1, 0.5, (steps, envs))
    pi = mu + rng.normal(0, 0.8, (steps, envs))  # ratios on both sides of the clip thresholds
    rewards = rng.normal(0, 1, (steps, envs))
    values = rng.normal(0, 1, (steps + 1, envs))
    terminated = np.zeros((steps, envs), bool)
    truncated = np.zeros((steps, envs), bool)
    terminated[2, 0], truncated[4, 1], terminated[6, 2], truncated[1, 2] = True, True, True, True
    as_t = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    vs, adv = vtrace(as_t(mu), as_t(pi), as_t(rewards), as_t(values), torch.tensor(terminated),
                     torch.tensor(truncated), 0.9, clip_rho=1.2, clip_pg_rho=0.8)
    for b in range(envs):
        ref_vs, ref_adv = _reference_vtrace(mu[:, b], pi[:, b], rewards[:, b], values[:, b], terminated[:, b],
                                            truncated[:, b], 0.9, 1.2, 0.8)
        assert np.allclose(vs[:, b].numpy(), ref_vs, atol=1e-5) and np.allclose(adv[:, b].numpy(), ref_adv, atol=1e-5)


def test_on_policy_vtrace_targets_are_the_n_step_returns():
    """No lag (pi = mu): every ratio is 1, clipping is inactive, and v_s is the n-step return to the fragment's end
    or the episode's (bootstrapped from V), as the paper states; compared with GAE at lambda 1."""
    rng = np.random.default_rng(1)
    steps, envs = 9, 4
    logp = rng.normal(-1, 0.3, (steps, envs)).astype(np.float32)
    rewards = rng.normal(0, 1, (steps, envs)).astype(np.float32)
    values = rng.normal(0, 1, (steps + 1, envs)).astype(np.float32)
    terminated, truncated = rng.random((steps, envs)) < 0.15, rng.random((steps, envs)) < 0.1
    vs, adv = vtrace(torch.from_numpy(logp), torch.from_numpy(logp), torch.from_numpy(rewards),
                     torch.from_numpy(values), torch.from_numpy(terminated), torch.from_numpy(truncated), 0.95)
    gae_adv, returns = compute_gae(rewards, values, terminated, truncated, 0.95, 1.0)
    assert np.allclose(vs.numpy(), returns, atol=1e-5)
    assert np.allclose(adv.numpy(), gae_adv, atol=1e-5)  # r + gamma v_{s+1} - V(x_s) = the lambda-1 advantage


def test_appo_and_impala_learn_cartpole_in_process():
    """In-process the same algorithm samples and learns in turn: no lag, every fragment on the newest weights.
    (APPO's target is 400: on seed 0 it reached 450 on some machines and hovered at 438 by 400k steps on others,
    where float rounding differs; it passes 400 at 160k here.)"""
    for config_class, target in ((APPOConfig, 400), (IMPALAConfig, 150)):
        algo = config_class().environment("CartPole-v1").debugging(seed=0).build()
        result = algo.train()
        while result["episode_return_mean"] < target and result["num_env_steps_sampled_lifetime"] < 400_000:
            result = algo.train()
            assert result["policy_lag_max"] == 0 and result["num_requests_in_flight"] == 0
        assert result["episode_return_mean"] >= target, (config_class.algo_name, result["episode_return_mean"])
        assert result["num_env_steps_trained"] >= 4 * 800 * 0.9  # 4 updates of ~800 real steps
        algo.stop()


class _Slow(LatencyEnv):
    """Runner 1's envs step 20x slower than the others' (10x was too close to the 3x asserted on a loaded host)."""

    def __init__(self, config):
        super().__init__(step_latency_s=0.04 if config.worker_index == 1 else 0.002, episode_len=50)


@pytest.mark.usefixtures("ray_session")
def test_async_sampling_keeps_requests_in_flight_bounds_the_queue_and_reports_lag():
    """3 runners, runner 1 twenty times slower: the learner never waits for it (the fast runners deliver several
    fragments for each of its), the queue plus the calls in flight never exceed the buffer, and the lag the result
    reports is the one computed here from the fragments' stamped versions."""
    herdrl.register_env("slow_runner_1", _Slow)
    algo = (APPOConfig().environment("slow_runner_1")
            .env_runners(num_env_runners=3, num_envs_per_env_runner=2, rollout_fragment_length=10)
            .training(train_batch_size=40, circular_buffer_num_batches=2, broadcast_interval=3,
                      circular_buffer_iterations_per_batch=1, num_updates_per_iteration=9)
            .debugging(seed=0).build())
    seen, record = [], algo.record
    algo.record = lambda sampled: (seen.extend((s.info.worker_index, s.info.weights_version, algo.num_updates)
                                               for s in sampled), record(sampled))[-1]
    lags, update = [], algo.learners.update  # the lag of every fragment learned on, computed here

    def recording_update(batch, *args):
        fragments, _ = resolve(batch)  # the fragments themselves (a copy): the versions they were sampled with
        lags.extend(algo.num_updates - f.weights_version for f in fragments)
        return update(batch, *args)

    algo.learners.update = recording_update
    capacity = 2 * 2  # circular_buffer_num_batches x fragments per batch
    fetch = algo.sampler.fetch
    depths = []

    def checked_fetch(room):
        depths.append(len(algo.queue) + algo.sampler.num_in_flight)
        assert room == capacity - depths[-1] >= 0
        out = fetch(room)
        depths.append(len(algo.queue) + algo.sampler.num_in_flight + len(out))
        return out

    algo.sampler.fetch = checked_fetch
    for _ in range(3):
        lags.clear()
        result = algo.train()
        assert result["policy_lag_mean"] == pytest.approx(np.mean(lags)) and result["policy_lag_max"] == max(lags)
    counts = np.bincount([index for index, _, _ in seen], minlength=4)
    assert counts[2] >= 3 * counts[1] and counts[3] >= 3 * counts[1], counts  # the fast runners are not held back
    assert max(depths) <= capacity
    assert all(0 <= version <= now for _, version, now in seen) and max(lags) >= 1
    assert {version % 3 for _, version, _ in seen} == {0}  # weights went out every 3 updates, and only then
    assert result["num_weight_broadcasts"] == 3  # 9 updates
    algo.stop()


@pytest.mark.usefixtures("ray_session")
def test_appo_on_two_ray_runners_solves_cartpole_and_survives_a_killed_runner():
    algo = APPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2).debugging(seed=0).build()
    result = algo.train()
    os.kill(algo.runners.call("pid")[0], signal.SIGKILL)
    restarts = 0
    while result["episode_return_mean"] < 450 and result["num_env_steps_sampled_lifetime"] < 1_000_000:
        result = algo.train()
        restarts = max(restarts, result["num_env_runner_restarts"])
    assert result["episode_return_mean"] >= 450
    assert restarts == 1 and result["num_healthy_env_runners"] == 2
    algo.stop()


@pytest.mark.parametrize("env, model", [("CartPole-v1", {}), ("Pendulum-v1", {}),
                                        ("Pendulum-v1", {"free_log_std": False}), ("moving_dot", {})])
def test_runners_record_the_log_probabilities_the_learner_computes(env, model):
    """The behaviour log-probabilities runners store (numpy twin: categorical, Gaussian with free or
    state-dependent log std; torch for a CNN) equal the learner's for the same weights: on-policy, rho = 1."""
    from envs import MovingDot

    from herdrl.models.encoders import to_torch
    from herdrl.rollout import EnvRunner

    herdrl.register_env("moving_dot", MovingDot)
    config = IMPALAConfig().environment(env).training(model=model).env_runners(num_envs_per_env_runner=3) \
        .debugging(seed=0)
    config.validate()
    runner = EnvRunner(config)
    fragment = runner.sample(20)
    obs = to_torch(fragment.obs[:20].reshape(60, *fragment.obs.shape[2:]))
    actions = torch.from_numpy(fragment.actions.reshape(60, *fragment.actions.shape[2:]))
    with torch.no_grad():
        logp, _ = runner.module.log_prob_entropy(runner.module.dist_inputs(obs), actions)
    assert np.allclose(fragment.logp.reshape(-1), logp.numpy(), atol=1e-4)


def test_impala_resumes_its_update_count_and_learns_on(tmp_path):
    from herdrl import Algorithm

    algo = IMPALAConfig().environment("CartPole-v1").debugging(seed=0).build()
    algo.train()
    path = algo.save(tmp_path / "ckpt")
    updates, trained = algo.num_updates, algo.num_env_steps_trained_lifetime
    algo.stop()
    resumed = Algorithm.from_checkpoint(path)
    assert (resumed.num_updates, resumed.num_env_steps_trained_lifetime) == (updates, trained) == (4, trained)
    result = resumed.train()
    assert resumed.num_updates == 8 and result["policy_lag_max"] == 0
    resumed.stop()


class _HangsOnce(LatencyEnv):
    """Runner 2's first actor hangs on its 30th step (marker file); its replacement runs normally."""

    def __init__(self, config):
        super().__init__(step_latency_s=0.001, episode_len=50)
        self.hang = config.worker_index == 2 and not os.path.exists(config["marker"])
        self.marker, self.steps = config["marker"], 0

    def step(self, action):
        self.steps += 1
        if self.hang and self.steps == 30:
            open(self.marker, "w").close()
            import time

            time.sleep(3600)
        return super().step(action)


@pytest.mark.usefixtures("ray_session")
def test_a_hung_runner_is_replaced_while_the_others_go_on(tmp_path):
    herdrl.register_env("hangs_once", _HangsOnce)
    algo = (IMPALAConfig().environment("hangs_once", env_config={"marker": str(tmp_path / "hung")})
            .env_runners(num_env_runners=2, num_envs_per_env_runner=1, rollout_fragment_length=10,
                         sample_timeout_s=3.0)
            .training(train_batch_size=20, num_updates_per_iteration=20).debugging(seed=0).build())
    import time

    start, iterations, result = time.monotonic(), 0, {"num_env_runner_restarts": 0}
    while result["num_env_runner_restarts"] == 0 and time.monotonic() - start < 30:
        result = algo.train()  # runner 1 keeps the learner fed while runner 2 hangs
        iterations += 1
    assert (tmp_path / "hung").exists() and result["num_env_runner_restarts"] == 1 and iterations >= 2
    algo.runners.settle(60)  # the replacement joins once its process has started
    result = algo.train()
    assert result["num_healthy_env_runners"] == 2 and result["num_fragments_dropped"] == 0
    algo.stop()


def test_appo_minibatches_feed_every_row_of_a_pass_to_the_loss_once():
    """With ``minibatch_size`` each pass over a batch is a shuffled partition of its rows: the loss sees every row
    exactly once per pass, in minibatches of about ``minibatch_size``, and Adam steps once per minibatch."""
    from herdrl.algorithms.appo import APPOLearner
    from herdrl.rollout import EnvRunner

    config = APPOConfig().environment("CartPole-v1").training(minibatch_size=100).debugging(seed=0)
    config.validate()
    runner = EnvRunner(config)
    learner = APPOLearner(config, runner.observation_space, runner.action_space)
    fragments = [runner.sample() for _ in range(2)]  # 2 x 8 envs x 50 steps, reset-only steps dropped
    seen: list[np.ndarray] = []
    loss = learner.loss
    learner.loss = lambda batch: (seen.append(batch["behaviour_logp"].numpy().copy()), loss(batch))[1]
    metrics = learner.update(fragments, 3, seed=5)
    rows = int(sum(f.valid.sum() for f in fragments))
    per_pass = round(rows / 100)
    assert len(seen) == 3 * per_pass == metrics["num_gradient_steps"] == learner.optimizer.steps
    everything = np.sort(np.concatenate([f.logp[f.valid] for f in fragments]))
    for first in range(0, len(seen), per_pass):
        one_pass = seen[first:first + per_pass]
        assert all(abs(len(m) - rows / per_pass) <= 1 for m in one_pass)
        assert np.array_equal(np.sort(np.concatenate(one_pass)), everything)


def test_impala_computes_vtrace_under_the_policy_of_each_minibatch():
    """IMPALA's policy gradient is unclipped, so V-trace's importance weights must be those of the policy being
    stepped: at every minibatch the target log-probabilities the loss gets equal the module's own at that moment
    (recomputed here from the module), not those of the policy at the start of the pass."""
    config = IMPALAConfig().environment("CartPole-v1").training(minibatch_size=100, lr=1e-2).debugging(seed=0)
    config.validate()
    runner = EnvRunner(config)
    learner = IMPALALearner(config, runner.observation_space, runner.action_space)
    gaps: list[float] = []
    loss = learner.loss

    def checked(batch):
        with torch.no_grad():
            current, _ = learner.module.log_prob_entropy(learner.module.dist_inputs(batch["obs"]), batch["actions"])
        gaps.append(float((current - batch["old_logp"]).abs().max()))
        return loss(batch)

    learner.loss = checked
    learner.update([runner.sample()], 2, seed=1)
    assert len(gaps) >= 6 and max(gaps) < 1e-5


@pytest.mark.usefixtures("ray_session")
def test_impala_on_two_learner_actors():
    """Two learners split every minibatch (3 per batch here) and stay identical."""
    algo = (IMPALAConfig().environment("CartPole-v1").training(minibatch_size=300).learners(num_learners=2)
            .debugging(seed=0).build())
    results = [algo.train() for _ in range(3)]
    assert results[-1]["num_gradient_updates"] == 4 * 3 and np.isfinite(results[-1]["vf_loss"])
    ranks = algo.learners.call("get_weights")
    assert all(np.array_equal(ranks[0][k], ranks[1][k]) for k in ranks[0])
    algo.stop()


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize(("config_class", "learner_class"), [(IMPALAConfig, IMPALALearner), (APPOConfig, APPOLearner)])
def test_two_learners_with_minibatches_update_like_one_learner(config_class, learner_class):
    """Two gloo learners, each on its half of every minibatch, make the update one learner makes on the whole
    batch: 2 passes of 4 shuffled minibatches, IMPALA recomputing V-trace before each, APPO clipping against its
    old policy. A rank that drew another minibatch order, or prepared V-trace at another time, would not."""
    config = (config_class().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=5, rollout_fragment_length=40)
              .training(train_batch_size=200, minibatch_size=50, circular_buffer_iterations_per_batch=2)
              .learners(num_learners=2).debugging(seed=0))
    config.validate()
    runner = EnvRunner(config)
    one = learner_class(config, runner.observation_space, runner.action_space)
    group = RayLearnerGroup(config, learner_class, runner.observation_space, runner.action_space, init_seed=0)
    for update in range(3):
        group.load_state(one.state())  # start each comparison level: float rounding must not compound
        fragments = [runner.sample()]
        single, split = one.update(fragments, 2, 100 + update), group.update(fragments, 2, 100 + update)
        assert split["num_gradient_steps"] == single["num_gradient_steps"] == 8
        assert _max_diff(one.get_weights(), group.get_weights()) < 1e-5
        ranks = group.call("get_weights")
        assert _max_diff(ranks[0], ranks[1]) == 0.0
        runner.set_weights(one.get_weights())
    group.stop()


def _max_diff(a, b):
    return max(float(np.abs(np.asarray(a[k]) - np.asarray(b[k])).max()) for k in a)


class _Submissions:
    """A runner's actor handle that notes when each sample call is submitted (``sample_with.options().remote``)."""

    def __init__(self, actor, times):
        self.actor, self.times, self.sample_with = actor, times, self

    def options(self, **options):
        self.method = self.actor.sample_with.options(**options)
        return self

    def remote(self, *args):
        import time

        self.times.append(time.monotonic())
        return self.method.remote(*args)


def _timed_runner(seconds, sample_timeout_s):
    """A Ray actor whose sample call takes ``seconds`` and notes when it finished, in a runner group of its own
    that notes the failures it is told of (and keeps the runner); returns (actor, group, submit times, failures)."""
    import time
    from types import SimpleNamespace

    import ray

    from herdrl.rollout.transport import FragmentInfo

    @ray.remote(num_cpus=0)
    class TimedRunner:
        def __init__(self):
            self.ends = []

        def sample_with(self, weights, exploration, version, broadcast):
            time.sleep(seconds)
            self.ends.append(time.monotonic())
            return FragmentInfo(env_steps=1, weights_version=version), None

        def finished(self):
            return self.ends

    actor, submitted, failures = TimedRunner.remote(), [], []
    ray.get(actor.finished.remote())  # started
    group = SimpleNamespace(actors=[_Submissions(actor, submitted)],
                            config=SimpleNamespace(sample_timeout_s=sample_timeout_s), num_healthy=1, waiting={},
                            admit=lambda: [], follow_cluster=lambda: [], wait_for_runner=lambda: None,
                            _handle_failure=lambda index, exc: failures.append(exc))
    return actor, group, submitted, failures


def test_calls_dropped_by_a_restore_still_count_in_flight_on_their_runner(ray_session):
    """A restore drops the calls in flight, but their runner still runs them (an actor's calls run in order): new
    calls must not queue behind them past max_requests_in_flight, and the runner, delivering a fragment every
    sample call (0.4 s), must not be taken for silent with a sample_timeout_s (0.7 s) under two calls. Calls per
    runner counted from when the driver submitted them and when the runner finished them."""
    import time

    from herdrl.rollout.async_sampling import AsyncSampler

    actor, group, submitted, failures = _timed_runner(0.4, sample_timeout_s=0.7)
    sampler = AsyncSampler(group, max_in_flight=3)
    sampler.set_weights({}, 0)
    versions = []
    while len(versions) < 2:
        versions += [s.info.weights_version for s in sampler.fetch(10)]
    sampler.forget_in_flight()  # a restore: 2 calls on the old weights dropped, still running
    sampler.set_weights({}, 1)
    after, deadline = [], time.monotonic() + 20
    while len(after) < 3 and not failures and time.monotonic() < deadline:
        after += [s.info.weights_version for s in sampler.fetch(10)]
    ends = ray_session.get(actor.finished.remote())
    queued = [sum(t <= at for t in submitted) - sum(t < at for t in ends) for at in submitted]
    assert max(queued) == 3, queued  # on the runner at once, the dropped calls included
    assert not failures and after == [1, 1, 1]  # nothing of the old timeline
    assert sampler.num_dropped == 2  # those the restore dropped
    ray_session.kill(actor)


def test_a_silent_runner_drops_the_calls_it_had_in_flight(ray_session):
    """A runner past sample_timeout_s fails, and the fragments dropped are its calls in flight, not one more."""
    from herdrl.rollout.async_sampling import AsyncSampler

    actor, group, submitted, failures = _timed_runner(5.0, sample_timeout_s=0.2)
    sampler = AsyncSampler(group, max_in_flight=2)
    sampler.set_weights({}, 0)
    fetched = sampler.fetch(2)
    while not failures and not fetched:  # (Ray's wait may return a hair before the deadline)
        fetched = sampler.fetch(0)
    assert fetched == [] and len(failures) == 1 and "sample_timeout_s=0.2" in str(failures[0])
    assert len(submitted) == 2 and sampler.num_dropped == 2 and sampler.num_in_flight == 0
    ray_session.kill(actor)
