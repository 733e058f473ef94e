"""How fragments travel: by reference to learner actors, stacked frames once each, lost ones sampled again."""

import gymnasium as gym
import numpy as np
import pytest
from envs import MovingDot

import herdrl
from herdrl import APPOConfig, PPOConfig
from herdrl.rollout import EnvRunner
from herdrl.rollout.batch import side_by_side
from herdrl.rollout.runner import Fragment
from herdrl.rollout.transport import (
    FragmentInput,
    FragmentLostError,
    FragmentsLost,
    PackedFrames,
    join_side_by_side,
    nbytes,
    pack,
    pack_leaf,
    resolve,
)


def _stacked_dots(config=None):
    return gym.wrappers.FrameStackObservation(MovingDot(config), 4, padding_type="zero")


def test_an_aggregators_share_is_one_fragment_as_wide_as_its_fragments():
    """Three packed fragments joined (an aggregator's share): every field a learner reads is the three recorded
    fragments side by side (APPO's: with the sampling policy's log-probabilities), the stacks rebuilt straight into
    the joined array, which a learner's batch then reads as it is. Fragments that cannot be laid side by side as one
    (recurrent states, different lengths) are each unpacked on their own, contiguous."""
    herdrl.register_env("stacked_dots", _stacked_dots)
    config = APPOConfig().environment("stacked_dots").env_runners(num_envs_per_env_runner=2,
                                                                  rollout_fragment_length=15)
    config.validate()
    runner = EnvRunner(config)
    recorded = [runner.sample() for _ in range(3)]  # the second and third begin mid-episode
    copies = [Fragment(**{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in vars(f).items()})
              for f in recorded]
    (joined,) = join_side_by_side([pack(f) for f in recorded])
    assert joined.obs.dtype == np.uint8 and joined.obs.shape[:2] == (16, 6) and joined.logp is not None
    for name in ("obs", "actions", "rewards", "terminateds", "truncateds", "valid", "logp"):
        assert np.array_equal(getattr(joined, name), np.concatenate([getattr(c, name) for c in copies], axis=1)), name
    assert np.array_equal(joined.begins, np.concatenate([c.begins for c in copies]))
    assert joined.obs.base is not None  # a view of the buffer the stacks were rebuilt into (a copy owns its data)
    assert side_by_side([joined]) is joined.obs
    shorter = runner.sample(num_steps=5)
    recurrent = Fragment(**{**vars(copies[1]), "state_in": np.zeros((2, 2, 8), np.float32)})
    for pair in ([copies[0], shorter], [copies[0], recurrent]):
        expected = [f.obs.copy() for f in pair]
        kept = join_side_by_side([pack(f) for f in pair])
        assert len(kept) == 2 and all(np.array_equal(f.obs, e) and f.obs.flags.c_contiguous
                                      for f, e in zip(kept, expected, strict=True))


def _dict_of_stacks_and_images(config=None):
    """A Dict observation: a 4-frame stack leaf and a channels-first image leaf (never a shift of the last)."""
    env = MovingDot({"chw": True})

    class Both(gym.ObservationWrapper):
        def __init__(self, env):
            super().__init__(gym.wrappers.FrameStackObservation(env, 4, padding_type="zero"))
            self.observation_space = gym.spaces.Dict({"stack": self.env.observation_space,
                                                      "image": env.observation_space})

        def observation(self, obs):
            return {"stack": obs, "image": obs[-1]}

    return Both(env)


def test_packed_fragments_rebuild_exactly_the_stacks_the_env_returned():
    """Episodes of 10 steps in 30-step fragments: stacks shifted step to step, zero-padded ones after each reset.
    Packing keeps about one frame per step, and unpacking gives back the very arrays the runner recorded."""
    herdrl.register_env("stacked_dots", _stacked_dots)
    config = PPOConfig().environment("stacked_dots").env_runners(num_envs_per_env_runner=3,
                                                                 rollout_fragment_length=30)
    config.validate()
    runner = EnvRunner(config)
    for _ in range(2):  # the second fragment begins mid-episode
        fragment = runner.sample()
        recorded = fragment.obs.copy()
        size = nbytes(fragment)
        pack(fragment)
        assert isinstance(fragment.obs, PackedFrames)
        assert nbytes(fragment) < 0.4 * size
        (rebuilt,), lost = resolve([fragment])
        assert lost == [] and rebuilt.obs.dtype == np.uint8 and np.array_equal(rebuilt.obs, recorded)
    runner.stop()

    herdrl.register_env("dots_dict", _dict_of_stacks_and_images)
    config = PPOConfig().environment("dots_dict").env_runners(num_envs_per_env_runner=2, rollout_fragment_length=25)
    config.validate()
    runner = EnvRunner(config)
    fragment = runner.sample()
    recorded = {key: value.copy() for key, value in fragment.obs.items()}
    pack(fragment)
    assert isinstance(fragment.obs["stack"], PackedFrames)
    assert isinstance(fragment.obs["image"], np.ndarray)  # a channels-first image is not a stack: sent as it is
    (rebuilt,), _ = resolve([fragment])
    assert all(np.array_equal(rebuilt.obs[key], recorded[key]) for key in recorded)
    runner.stop()


def test_fragments_laid_side_by_side_rebuild_their_stacks_once_straight_into_the_batch():
    """Three fragments (3, 2 and 3 envs; the last shipped unpacked) resolved together: the batch the learner
    concatenates equals the stacks the envs returned, side by side, and is one array the fragments' leaves are
    views of (no second copy); a Dict observation's unpacked image leaf is concatenated as before."""
    from herdrl.obs import obs_concat

    herdrl.register_env("stacked_dots", _stacked_dots)
    herdrl.register_env("dots_dict", _dict_of_stacks_and_images)
    for env in ("stacked_dots", "dots_dict"):
        fragments, recorded = [], []
        for index, envs in enumerate((3, 2, 3)):
            config = PPOConfig().environment(env).env_runners(num_envs_per_env_runner=envs, rollout_fragment_length=20)
            config.validate()
            runner = EnvRunner(config, worker_index=index + 1)
            fragment = runner.sample()
            runner.stop()
            recorded.append({key: value.copy() for key, value in fragment.obs.items()}
                            if isinstance(fragment.obs, dict) else fragment.obs.copy())
            fragments.append(pack(fragment) if index < 2 else fragment)
        rebuilt, lost = resolve(list(fragments))
        batch = obs_concat([f.obs for f in rebuilt], axis=1)
        expected = obs_concat(recorded, axis=1)
        stacks = batch["stack"] if env == "dots_dict" else batch
        assert lost == [] and np.array_equal(stacks, expected["stack"] if env == "dots_dict" else expected)
        first = rebuilt[0].obs["stack"] if env == "dots_dict" else rebuilt[0].obs
        assert np.shares_memory(stacks, first) and stacks.flags.c_contiguous
        if env == "dots_dict":
            assert np.array_equal(batch["image"], expected["image"])
            assert not np.shares_memory(batch["image"], rebuilt[0].obs["image"])  # concatenated: a copy


def test_only_consecutive_blocks_of_one_array_are_joined_without_a_copy():
    from herdrl.obs import joined_view, obs_concat

    base = np.arange(3 * 10 * 2).reshape(3, 10, 2)
    cases = [(base[:, 0:4], base[:, 4:7], base[:, 7:10]),  # consecutive: joined
             (base[:, 1:4], base[:, 4:7]),  # consecutive, not from the start: joined
             (base[:, 0:4], base[:, 5:7]),  # a gap
             (base[:, 4:7], base[:, 0:4]),  # out of order
             (base[:2, 1:4], base[1:3, 4:7]),  # other rows
             (base[:, 0:4], np.arange(3 * 3 * 2).reshape(3, 3, 2)),  # another buffer
             (base[:, 0:4:2], base[:, 4:6]),  # strided
             (base[:, 0:4], base[:, 4:10].view(np.uint64))]  # another dtype
    for i, arrays in enumerate(cases):
        assert (joined_view(arrays, 1) is not None) == (i < 2), i
        joined = obs_concat(list(arrays), axis=1)
        assert np.array_equal(joined, np.concatenate(arrays, axis=1)), i
        assert np.shares_memory(joined, base) == (i < 2), i
    right = base[:, 4:10]
    right.flags.writeable = False  # a read-only part makes the joined view read-only
    assert not joined_view((base[:, 0:4], right), 1).flags.writeable
    assert joined_view((base[:, 0:4], base[:, 4:10]), 1).flags.writeable


def test_packing_trusts_no_pattern_only_equal_frames():
    """Stacks that shift, restart, or only look like a shift (all but one frame equal) in random order: every one
    comes back byte for byte."""
    rng = np.random.default_rng(0)
    packed_cases = 0
    for case in range(200):
        steps, envs, depth = int(rng.integers(2, 12)), int(rng.integers(1, 4)), int(rng.integers(2, 5))
        leaf = np.empty((steps, envs, depth, 3, 2), np.uint8)
        leaf[0] = rng.integers(0, 3, leaf[0].shape)
        for t in range(1, steps):
            for b in range(envs):
                kind = rng.integers(3)
                if kind == 0:  # a new episode
                    leaf[t, b] = rng.integers(0, 3, leaf[t, b].shape)
                else:  # a shift by one frame, and sometimes an older frame changed (not a shift after all)
                    leaf[t, b, :-1], leaf[t, b, -1] = leaf[t - 1, b, 1:], rng.integers(0, 3, (3, 2))
                    if kind == 2 and depth > 2:
                        leaf[t, b, 0, 0, 0] ^= 1
        packed = pack_leaf(leaf)
        packed_cases += isinstance(packed, PackedFrames)
        rebuilt = packed.unpack() if isinstance(packed, PackedFrames) else packed
        assert rebuilt.shape == leaf.shape and np.array_equal(rebuilt, leaf), case
    assert packed_cases > 80  # most cases share frames and are packed (124 of 200 with this seed)


@pytest.mark.usefixtures("whole_ray_cluster")
def test_fragments_reach_learner_actors_without_entering_the_driver(monkeypatch):
    """With a learner actor, no fragment (nor packed frames) is ever deserialised in this process; with the
    learner here, every one is. Both runs learn."""
    herdrl.register_env("stacked_dots", _stacked_dots)
    opened = []  # pickle calls __setstate__ when a class has one: here, only in this process
    monkeypatch.setattr(Fragment, "__setstate__", lambda self, state: (opened.append(1), self.__dict__.update(state)),
                        raising=False)
    monkeypatch.setattr(PackedFrames, "__setstate__", lambda self, state: (opened.append(2),
                                                                           self.__dict__.update(state)), raising=False)

    def config(learners):
        return (PPOConfig().environment("stacked_dots")
                .env_runners(num_env_runners=2, num_envs_per_env_runner=2, rollout_fragment_length=20)
                .training(train_batch_size=80, minibatch_size=40, num_epochs=1).learners(num_learners=learners)
                .debugging(seed=0))

    algo = config(1).build()
    before = algo.get_weights()
    for _ in range(2):
        result = algo.train()
    moved = max(float(np.abs(algo.get_weights()[k] - before[k]).max()) for k in before)
    algo.stop()
    assert opened == [] and moved > 0 and result["num_env_steps_sampled"] > 60  # 80, less reset-only steps
    # A 4-frame stack is 800 bytes; packed, a step ships ~1 new frame (more after the resets of 10-step episodes)
    assert 0 < result["fragment_bytes_per_env_step"] < 0.55 * 4 * 10 * 10 * 2
    # Asynchronous sampling the same (APPO: calls kept in flight, fragments queued as references)
    appo = (APPOConfig().environment("stacked_dots")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=2, rollout_fragment_length=20)
            .training(train_batch_size=80, minibatch_size=40).learners(num_learners=1).debugging(seed=0).build())
    for _ in range(2):
        result = appo.train()
    appo.stop()
    assert opened == [] and result["num_env_steps_trained_lifetime"] >= 80

    algo = config(0).build()
    algo.train()
    algo.stop()
    assert opened.count(1) == 2 and opened.count(2) == 2  # in the driver: two fragments, each with packed frames
    # The rows report the cluster's object stores: at least an object of 40 MB put here shows.
    import ray

    from herdrl.cluster.connect import object_store_use

    held = ray.put(np.zeros(5_000_000))
    use = object_store_use()
    assert use["object_store_bytes"] >= 40e6 and 0 < use["object_store_fraction"] < 1
    assert 0 <= result["object_store_fraction"] < 1
    del held


@pytest.mark.usefixtures("whole_ray_cluster")
def test_fragments_over_the_inline_limit_are_owned_by_their_runner():
    """A fragment over Ray's 100 KiB inline limit is put in the object store by its runner, which owns it (the
    driver only borrows the reference, so the owner's bookkeeping is not the driver's); a smaller one still comes
    as the call's second return, which the driver owns. The learner actor learns from both, and the infos kept
    for reporting hold no reference (that would pin the fragment)."""
    import ray
    from ray.core.generated.common_pb2 import Address

    def owner(ref):
        address = Address()
        address.ParseFromString(ref.owner_address())
        return address.worker_id.hex()

    herdrl.register_env("dots_chw", lambda config=None: MovingDot({"chw": True}))  # 200 bytes per observation
    driver = ray.get_runtime_context().get_worker_id()
    for length, owned_by_runner in ((300, True), (20, False)):  # 2 envs x 300 steps: ~130 KB; x 20: ~9 KB
        algo = (PPOConfig().environment("dots_chw")
                .env_runners(num_env_runners=2, num_envs_per_env_runner=2, rollout_fragment_length=length)
                .training(train_batch_size=4 * length, minibatch_size=2 * length, num_epochs=1)
                .learners(num_learners=1).debugging(seed=0).build())
        runners = {ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_worker_id()))
                   for actor in algo.runners.actors}
        seen = []

        def recorded(*args, sample=algo.runners.sample, seen=seen):
            seen.extend(sample(*args))
            return seen[-2:]

        algo.runners.sample = recorded
        before = algo.get_weights()
        algo.train()
        moved = max(float(np.abs(algo.get_weights()[k] - before[k]).max()) for k in before)
        algo.stop()
        assert len(seen) == 2 and moved > 0, length
        assert all((item.info.nbytes > 100 * 1024) == owned_by_runner for item in seen), length
        assert {owner(item.data) for item in seen} == (runners if owned_by_runner else {driver}), length
        assert all(item.info.fragment_ref is None for item in seen)


@pytest.mark.usefixtures("whole_ray_cluster")
def test_a_fragment_whose_runner_died_before_the_learner_read_it_is_sampled_again(caplog):
    """A fragment its runner put (over 100 KiB) dies with that runner, though the node lives: the driver's learner
    finds it lost (Ray's OwnerDiedError), drops it, samples again (from the runner's replacement) and learns."""
    import os
    import signal
    import time

    import ray

    herdrl.register_env("dots_chw", lambda config=None: MovingDot({"chw": True}))
    algo = (PPOConfig().environment("dots_chw")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=2, rollout_fragment_length=300)
            .training(train_batch_size=1200, minibatch_size=600, num_epochs=1).debugging(seed=0).build())
    sample, rounds = algo.runners.sample, []

    def sample_then_kill(*args):
        sampled = sample(*args)
        rounds.append(sampled)
        if len(rounds) == 1:  # the first round's fragments are in the store, owned by their runners: kill one
            pid = ray.get(algo.runners.actors[0].pid.remote())
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
                time.sleep(0.1)
            time.sleep(2.0)  # (for Ray to hear of the owner's death)
        return sampled

    algo.runners.sample = sample_then_kill
    before = algo.get_weights()
    with caplog.at_level("WARNING", logger="herdrl"):
        result = algo.train()
    # One fragment sampled again (a round may find the dead runner first, and come back empty while it restarts)
    assert result["num_fragments_lost"] == 1 and len(rounds[0]) == 2 and sum(len(r) for r in rounds[1:]) == 1
    assert any("1 fragment lost with its node or runner" in r.getMessage() for r in caplog.records)
    assert result["num_env_steps_sampled"] == sum(item.info.env_steps for r in rounds for item in r)  # lost too
    assert max(float(np.abs(algo.get_weights()[k] - before[k]).max()) for k in before) > 0
    algo.stop()


@pytest.mark.usefixtures("whole_ray_cluster")
def test_a_fragment_lost_before_the_learner_reads_it_is_sampled_again(caplog, monkeypatch):
    """A fragment whose object is gone when the learner in the driver fetches it (Ray raises ObjectLostError, as
    when its node died: tests/test_multinode.py kills a real node under two learner actors) is dropped, replaced
    by a new one, and training goes on."""
    import ray

    algo = (PPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=2, rollout_fragment_length=25)
            .training(train_batch_size=100, minibatch_size=50, num_epochs=1).debugging(seed=0).build())
    sample, calls, gone = algo.runners.sample, [], []
    real_get = ray.get

    def get(refs, *args, **kwargs):
        if any(ref in gone for ref in (refs if isinstance(refs, list) else [refs])):
            raise ray.exceptions.ObjectLostError(gone[0].hex(), "", "")
        return real_get(refs, *args, **kwargs)

    def losing_sample(*args):
        sampled = sample(*args)
        calls.append(sampled)
        if len(calls) == 1 or len(calls) > 3:  # the first fragment; later (a node dying every time) all of them
            gone.extend(item.data for item in sampled[:None if len(calls) > 3 else 1])
        return sampled

    update, inputs = algo.learners.update, []
    algo.learners.update = lambda fragments, *args: (inputs.append(list(fragments)), update(fragments, *args))[1]
    monkeypatch.setattr(ray, "get", get)
    algo.runners.sample = losing_sample
    before = algo.get_weights()
    with caplog.at_level("WARNING", logger="herdrl"):
        result = algo.train()
    assert result["num_fragments_lost"] == 1 and [len(c) for c in calls] == [2, 1]  # one runner samples again
    # The update that happened: the surviving fragment and the new one, not the lost one
    assert inputs == [[s.data for s in calls[0]], [calls[0][1].data, calls[1][0].data]]
    assert result["num_env_steps_sampled"] == sum(s.info.env_steps for c in calls for s in c)  # lost ones too
    assert any("1 fragment lost" in r.getMessage() for r in caplog.records)
    assert max(float(np.abs(algo.get_weights()[k] - before[k]).max()) for k in before) > 0
    assert algo.train()["num_fragments_lost"] == 0  # (the third sampling call)
    with pytest.raises(FragmentLostError, match="4 rounds of sampling in a row"):
        algo.train()  # every fragment lost, round after round: one line, not an endless loop
    algo.stop()


@pytest.mark.usefixtures("whole_ray_cluster")
def test_learning_with_aggregator_actors_equals_learning_without():
    """Same seed, same fragments (3 runners' stacked frames, 2 iterations): the learner ends with exactly the
    weights of a learner that fetched the fragments itself, whether one aggregator on the learner's node joins all
    of them (the learner reads its share where it lies) or two join 2 + 1."""
    import ray

    herdrl.register_env("stacked_dots", _stacked_dots)

    def run(aggregators):
        algo = (PPOConfig().environment("stacked_dots")
                .env_runners(num_env_runners=3, num_envs_per_env_runner=2, rollout_fragment_length=20)
                .training(train_batch_size=120, minibatch_size=40, num_epochs=2)
                .learners(num_learners=1, num_aggregator_actors_per_learner=aggregators).debugging(seed=0).build())
        for _ in range(2):
            algo.train()
        ask = lambda f: [ray.get(a.__ray_call__.remote(f)) for a in algo.learners.aggregators[0]]  # noqa: E731
        nodes = ask(lambda self: ray.get_runtime_context().get_node_id()) if aggregators else []
        gathered = ask(lambda self: self.gathered) if aggregators else []
        weights = algo.get_weights()
        algo.stop()
        return weights, nodes, gathered

    direct, _, _ = run(0)
    for aggregators, shares in ((1, [6]), (2, [4, 2])):  # fragments each fetched over the 2 iterations
        aggregated, nodes, gathered = run(aggregators)
        assert len(nodes) == aggregators and set(nodes) == {ray.get_runtime_context().get_node_id()}
        assert gathered == shares
        assert all(np.array_equal(direct[k], aggregated[k]) for k in direct)


@pytest.mark.usefixtures("whole_ray_cluster")
def test_a_killed_aggregator_restarts_the_learner_group_from_the_state_kept():
    """An aggregator's process dies between iterations: the next update fails to gather its fragments, the group
    (learner and aggregators) is restarted from the learner state kept after the last update (interval 1: nothing
    lost), and the iteration completes with new aggregators."""
    import os
    import signal

    import ray

    algo = (PPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=1, rollout_fragment_length=50)
            .training(train_batch_size=100, minibatch_size=50, num_epochs=1)
            .learners(num_learners=1, num_aggregator_actors_per_learner=2)
            .fault_tolerance(learner_state_interval=1).debugging(seed=0).build())

    def aggregator_pids():
        return [ray.get(a.__ray_call__.remote(lambda self: os.getpid())) for a in algo.learners.aggregators[0]]

    algo.train()
    kept = algo.get_weights()  # what the learner had after its one update: the state kept
    restart, restored = algo.learners._restart, []

    def restart_and_read(*args):
        restart(*args)
        restored.append(ray.get(algo.learners.actors[0].call.remote("get_weights")))

    algo.learners._restart = restart_and_read
    before = aggregator_pids()
    os.kill(before[1], signal.SIGKILL)
    row = algo.train()
    assert row["num_learner_restarts"] == 1 and row["num_learner_updates_lost"] == 0 and len(restored) == 1
    assert all(np.array_equal(restored[0][k], kept[k]) for k in kept)
    assert max(float(np.abs(algo.get_weights()[k] - kept[k]).max()) for k in kept) > 0  # the update was made
    after = aggregator_pids()
    assert len(after) == 2 and not set(after) & set(before)
    algo.stop()


def test_aggregator_actors_need_learner_actors():
    with pytest.raises(herdrl.ConfigError, match="needs learner actors"):
        PPOConfig().environment("CartPole-v1").learners(num_aggregator_actors_per_learner=1).validate()


@pytest.mark.usefixtures("whole_ray_cluster")
def test_learner_ranks_skip_an_update_together_when_only_one_lost_a_fragment():
    """Rank 1 alone fails to fetch fragment 0 (as if its fetch had met a dead node): both ranks skip the update, so
    neither waits in an all-reduce the other never joins, and their weights stay equal and unchanged."""
    import ray

    from herdrl.algorithms.ppo import PPOLearner
    from herdrl.learner.group import RayLearnerGroup

    config = (PPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2, rollout_fragment_length=25)
              .training(train_batch_size=100, minibatch_size=50, num_epochs=1).learners(num_learners=2,
                                                                                        learner_timeout_s=60)
              .debugging(seed=0))
    config.validate()
    runner = EnvRunner(config)
    group = RayLearnerGroup(config, PPOLearner, runner.observation_space, runner.action_space, init_seed=0)

    def lose_fragment_0_here(actor):  # (in the actor's process: what a FragmentInput reads its fragments with)
        import herdrl.rollout.transport as transport

        real = transport.resolve
        transport.resolve = lambda items: (real(items)[0][1:], [0])

    ray.get(group.actors[1].__ray_call__.remote(lose_fragment_0_here))
    before = group.call("get_weights")
    result = group.update(FragmentInput(ray.put(runner.sample()) for _ in range(2)), 0)
    after = group.call("get_weights")
    group.stop()
    runner.stop()
    assert isinstance(result, FragmentsLost) and result.indices == [0]
    assert all(np.array_equal(before[rank][k], after[rank][k]) for rank in (0, 1) for k in before[0])


@pytest.mark.usefixtures("whole_ray_cluster")
@pytest.mark.parametrize("algorithm", ["APPO", "DQN"])
def test_asynchronous_and_replay_algorithms_go_on_past_a_lost_fragment(algorithm, monkeypatch):
    """APPO puts the batch's surviving fragments back in its queue; DQN (replay in the driver) loses that data.
    Both count it and keep training."""
    import ray

    gone, real_get = [], ray.get

    def get(refs, *args, **kwargs):
        if any(ref in gone for ref in (refs if isinstance(refs, list) else [refs])):
            raise ray.exceptions.ObjectLostError(gone[0].hex(), "", "")
        return real_get(refs, *args, **kwargs)

    config = (herdrl.registry.get_config_class(algorithm)().environment("CartPole-v1")
              .env_runners(num_env_runners=2, num_envs_per_env_runner=1, rollout_fragment_length=20)
              .debugging(seed=0))
    if algorithm == "APPO":
        config.training(train_batch_size=40, minibatch_size=40, num_updates_per_iteration=3)
        fetch = config.build()
        algo, take = fetch, fetch.sampler.fetch
        fetch.sampler.fetch = lambda room: (lambda got: (gone.append(got[0].data) if got and not gone else None,
                                                         got)[1])(take(room))
    else:
        config.training(num_steps_sampled_before_learning_starts=40, min_sample_timesteps_per_iteration=80)
        algo = config.build()
        sample = algo.runners.sample
        algo.runners.sample = lambda *a: (lambda got: (gone.append(got[0].data) if not gone else None, got)[1])(
            sample(*a))
    monkeypatch.setattr(ray, "get", get)
    result = algo.train()
    algo.stop()
    assert result["num_fragments_lost"] == 1 and result["num_gradient_updates"] >= 1


def test_herd_bench_ingest_measures_every_path_and_writes_table_csv_and_plot(tmp_path, capsys, whole_ray_cluster):
    from herdrl.cli import main

    code = main(["bench", "ingest", "--shape", "atari-packed", "--envs", "2", "--steps", "16", "--producers", "2",
                 "--batch", "2", "--seconds", "1", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "producers import torch: no" in out
    rows = (tmp_path / "ingest.csv").read_text().splitlines()
    assert rows[0].startswith("mode,") and [row.split(",")[0] for row in rows[1:]] == [
        "driver", "via-driver", "reference", "aggregators"]
    assert all(float(dict(zip(rows[0].split(","), row.split(","), strict=True))["fragments_per_s"]) > 0
               for row in rows[1:])
    assert (tmp_path / "ingest.png").stat().st_size > 1000
