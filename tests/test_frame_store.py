"""Replay buffers store each distinct frame once: what they give back equals what went in, whatever the frames."""

import io

import gymnasium as gym
import numpy as np
import pytest

from herdrl import frame_store
from herdrl.buffers import PrioritizedReplayBuffer, ReplayBuffer
from herdrl.obs import ObsSpec

STACK, SIDE = 4, 12
STACKED = gym.spaces.Box(0, 255, (STACK, SIDE, SIDE), np.uint8)  # ale-py's / FrameStackObservation's layout


def stacked_stream(rng, steps, envs, start=None, reset_rate=0.05):
    """(steps + 1, envs, 4, 12, 12) frame stacks: each step shifts in a new random frame; an episode starts with
    its first frame repeated. ``start``: the stacks the stream continues from (a fragment's first row)."""
    stacks = np.empty((steps + 1, envs, STACK, SIDE, SIDE), np.uint8)
    current = rng.integers(0, 256, (envs, STACK, SIDE, SIDE), dtype=np.uint8) if start is None else start
    for t in range(steps + 1):
        stacks[t] = current
        new = rng.integers(0, 256, (envs, SIDE, SIDE), dtype=np.uint8)
        current = np.concatenate([current[:, 1:], new[:, None]], axis=1)
        reset = rng.random(envs) < reset_rate
        current[reset] = new[reset][:, None]
    return stacks


def fill(buffer, rng, batches, steps=16, envs=3, stream=stacked_stream):
    """Add ``batches`` fragments' transitions; return every transition added, as plain arrays, by action id."""
    added, last = [], None
    for b in range(batches):
        stacks = stream(rng, steps, envs, last)
        last = stacks[-1]
        obs, next_obs = stacks[:-1].reshape(-1, *stacks.shape[2:]), stacks[1:].reshape(-1, *stacks.shape[2:])
        n = len(obs)
        batch = {"obs": obs, "next_obs": next_obs, "actions": np.arange(n) + 10_000 * b,
                 "rewards": rng.random(n).astype(np.float32), "discounts": np.ones(n, np.float32)}
        buffer.add(batch)
        added.append(batch)
    return {key: np.concatenate([batch[key] for batch in added]) for key in added[0]}


def assert_replays_exactly(buffer, added, draws=400):
    """Sampled transitions equal the ones added with the same action id (ids are unique)."""
    row = {action: i for i, action in enumerate(added["actions"])}
    data, _, _ = buffer.sample(draws)
    rows = np.array([row[a] for a in data["actions"]])
    assert np.array_equal(data["obs"], added["obs"][rows]) and np.array_equal(data["next_obs"], added["next_obs"][rows])
    assert np.array_equal(data["rewards"], added["rewards"][rows])


@pytest.mark.parametrize("buffer_class", [ReplayBuffer, PrioritizedReplayBuffer])
def test_frame_stacks_come_back_exactly_while_each_frame_is_stored_once(buffer_class):
    rng = np.random.default_rng(0)
    buffer = buffer_class(1000, ObsSpec(STACKED), np.random.default_rng(1))
    added = fill(buffer, rng, batches=60)  # 2,880 transitions through 1,000 slots: the rings wrap
    assert len(buffer) == 1000 and buffer.obs is None
    assert_replays_exactly(buffer, added)
    store = buffer.frames[""]
    assert store.units.shape[1:] == (SIDE, SIDE) and store.units.dtype == np.uint8  # one frame of a stack
    whole = 2 * buffer.capacity * STACK * SIDE * SIDE  # bytes of every obs and next_obs stack kept whole
    assert store.units.nbytes + store.obs_ids.nbytes + store.next_ids.nbytes < 0.25 * whole


def fresh(rng, steps, envs, start=None):
    """Frames that share nothing: every observation new."""
    return rng.integers(0, 256, (steps + 1, envs, STACK, SIDE, SIDE), dtype=np.uint8)


@pytest.mark.parametrize("buffer_class", [ReplayBuffer, PrioritizedReplayBuffer])
@pytest.mark.parametrize("steps", [16, 120])  # fragments smaller than the ring, and one larger (960 transitions)
def test_frames_that_share_nothing_still_come_back_exactly_and_the_oldest_go_first(buffer_class, steps):
    """The ring fills before the slots do: the buffer holds fewer transitions, the newest, each exact (prioritized
    replay never draws one whose frames are gone)."""
    buffer = buffer_class(300, ObsSpec(STACKED), np.random.default_rng(1))
    added = fill(buffer, np.random.default_rng(0), batches=20 if steps == 16 else 1, steps=steps, envs=8, stream=fresh)
    assert 0 < len(buffer) < 300
    assert set(buffer.state()["actions"]) == set(added["actions"][-len(buffer):].tolist())
    assert_replays_exactly(buffer, added)


def test_observations_are_stored_in_the_leafs_dtype_and_damaged_indices_are_refused():
    buffer = ReplayBuffer(50, ObsSpec(STACKED), np.random.default_rng(1))
    obs = np.full((2, STACK, SIDE, SIDE), 3, np.int64)  # another integer dtype: cast, as the runner's are
    buffer.add({"obs": obs, "next_obs": obs + 1, "actions": np.arange(2), "rewards": np.zeros(2, np.float32),
                "discounts": np.ones(2, np.float32)})
    data, _, _ = buffer.sample(4)
    assert data["obs"].dtype == np.uint8 and (data["obs"] == 3).all() and (data["next_obs"] == 4).all()
    state = buffer.state()
    for damage in ({"obs_frames": state["obs_frames"].astype(np.float64)},
                   {"next_obs_frames": -state["obs_frames"] - 1}, {"rewards": np.float32(0)}):
        with pytest.raises(ValueError, match="replay field"):
            ReplayBuffer(50, ObsSpec(STACKED), np.random.default_rng(1)).load_state({**state, **damage})


def test_a_hash_collision_never_merges_different_frames(monkeypatch):
    monkeypatch.setattr(frame_store, "_hashes", lambda rows, multipliers: np.zeros(len(rows), np.uint64))
    buffer = PrioritizedReplayBuffer(200, ObsSpec(STACKED), np.random.default_rng(1))
    added = fill(buffer, np.random.default_rng(0), batches=6)
    assert_replays_exactly(buffer, added)


def test_images_without_stacks_and_other_leaves_of_a_dict_observation():
    """HWC images are stored whole (shared between an obs and the next step's), vectors as arrays."""
    space = gym.spaces.Dict({"screen": gym.spaces.Box(0, 1, (10, 10, 4), bool),
                             "speed": gym.spaces.Box(-1, 1, (2,), np.float32)})

    def dict_stream(rng, steps, envs, start=None):
        screens = rng.random((steps + 1, envs, 10, 10, 4)) < 0.5
        if start is not None:
            screens[0] = start["screen"]
        return {"screen": screens, "speed": rng.random((steps + 1, envs, 2)).astype(np.float32)}

    buffer = ReplayBuffer(100, ObsSpec(space), np.random.default_rng(1))
    rng, added, last = np.random.default_rng(0), [], None
    for b in range(8):
        stream = dict_stream(rng, 10, 2, last)
        last = {key: value[-1] for key, value in stream.items()}
        obs = {key: value[:-1].reshape(-1, *value.shape[2:]) for key, value in stream.items()}
        nxt = {key: value[1:].reshape(-1, *value.shape[2:]) for key, value in stream.items()}
        n = len(obs["speed"])
        buffer.add({"obs": obs, "next_obs": nxt, "actions": np.arange(n) + 1000 * b, "rewards": np.zeros(n, np.float32),
                    "discounts": np.ones(n, np.float32)})
        added.append((obs, nxt, np.arange(n) + 1000 * b))
    assert set(buffer.frames) == {"screen"} and set(buffer.obs) == {"speed"}
    store = buffer.frames["screen"]
    assert store.written <= 1.1 * 8 * 20  # one screen per step (+1 per fragment), not two per transition
    row = {a: (i, j) for i, (_, _, actions) in enumerate(added) for j, a in enumerate(actions)}
    data, _, _ = buffer.sample(200)
    for k, action in enumerate(data["actions"]):
        i, j = row[action]
        for key in ("screen", "speed"):
            assert np.array_equal(data["obs"][key][k], added[i][0][key][j])
            assert np.array_equal(data["next_obs"][key][k], added[i][1][key][j])


@pytest.mark.parametrize("buffer_class", [ReplayBuffer, PrioritizedReplayBuffer])
def test_a_saved_frame_buffer_loads_back_without_pickle_and_so_does_one_saved_whole(buffer_class):
    buffer = buffer_class(300, ObsSpec(STACKED), np.random.default_rng(1))
    added = fill(buffer, np.random.default_rng(0), batches=10)
    saved = io.BytesIO()
    np.savez(saved, **buffer.state())
    saved.seek(0)
    state = dict(np.load(saved, allow_pickle=False))
    assert state["frames"].shape[0] < 2 * 300  # the frames once, not 8 per transition
    for capacity in (300, 120):  # the same size, and smaller: the newest transitions
        copy = buffer_class(capacity, ObsSpec(STACKED), np.random.default_rng(1))
        copy.load_state(state)
        assert np.array_equal(copy.state()["actions"], state["actions"][-capacity:])
        assert_replays_exactly(copy, added)
    whole = {key: state[key] for key in ("actions", "rewards", "discounts")}  # the format before frames
    whole["obs"] = state["frames"][state["obs_frames"]].reshape(-1, STACK, SIDE, SIDE)
    whole["next_obs"] = state["frames"][state["next_obs_frames"]].reshape(-1, STACK, SIDE, SIDE)
    copy = buffer_class(300, ObsSpec(STACKED), np.random.default_rng(1))
    copy.load_state(whole)
    assert len(copy) == 300 and copy.frames[""].written < 2 * 300
    assert_replays_exactly(copy, added)
    whole["obs"] = whole["obs"][:, :2]
    with pytest.raises(ValueError, match="replay field 'obs' has shape"):
        copy.load_state(whole)


@pytest.mark.parametrize("buffer_class", [ReplayBuffer, PrioritizedReplayBuffer])
def test_a_batch_larger_than_the_buffer_keeps_its_newest_transitions_whole(buffer_class):
    """400 transitions of 1-step episodes that all start from one observation, into 100 slots: the newest 100
    stay, although their shared frame first appeared in the oldest."""
    rng = np.random.default_rng(0)
    start = rng.integers(0, 256, (STACK, SIDE, SIDE), dtype=np.uint8)
    n = 400
    obs = np.broadcast_to(start, (n, STACK, SIDE, SIDE))
    new = rng.integers(0, 256, (n, 1, SIDE, SIDE), dtype=np.uint8)  # each episode's one new frame
    next_obs = np.concatenate([np.broadcast_to(start[1:], (n, STACK - 1, SIDE, SIDE)), new], axis=1)
    added = {"obs": np.ascontiguousarray(obs), "next_obs": next_obs, "actions": np.arange(n),
             "rewards": np.zeros(n, np.float32), "discounts": np.zeros(n, np.float32)}
    buffer = buffer_class(100, ObsSpec(STACKED), np.random.default_rng(1))
    buffer.add(added)
    assert len(buffer) == 100 and buffer.state()["actions"].tolist() == list(range(300, 400))
    assert_replays_exactly(buffer, added)


def test_saved_priorities_must_be_finite_non_negative_numbers_and_an_empty_buffer_is_not_sampled():
    buffer = PrioritizedReplayBuffer(50, ObsSpec(STACKED), np.random.default_rng(1))
    with pytest.raises(ValueError, match="empty"):
        buffer.sample(4)
    fill(buffer, np.random.default_rng(0), batches=1)
    state = buffer.state()
    for damage in ({"priorities": -state["priorities"]}, {"priorities": np.full_like(state["priorities"], np.nan)},
                   {"max_priority": np.array([1.0, 2.0])}, {"actions": state["actions"].astype(np.float32)}):
        copy = PrioritizedReplayBuffer(50, ObsSpec(STACKED), np.random.default_rng(1))
        fill(copy, np.random.default_rng(5), batches=1)
        before = copy.state()
        with pytest.raises(ValueError, match="replay field"):
            copy.load_state({**state, **damage})
        assert np.array_equal(copy.state()["priorities"], before["priorities"])  # refused before any change


@pytest.mark.parametrize("buffer_class", [ReplayBuffer, PrioritizedReplayBuffer])
def test_a_batch_without_transitions_changes_nothing(buffer_class):
    """A fragment holding only a reset step (rollout_fragment_length=1 after an episode's end) has no transition."""
    rng = np.random.default_rng(0)
    buffer = buffer_class(100, ObsSpec(STACKED), np.random.default_rng(1))
    added = fill(buffer, rng, batches=2)
    before = buffer.state()
    empty = {"obs": added["obs"][:0], "next_obs": added["next_obs"][:0], "actions": added["actions"][:0],
             "rewards": added["rewards"][:0], "discounts": added["discounts"][:0]}
    assert len(buffer.add(empty)) == 0 and len(buffer) == len(added["actions"])
    after = buffer.state()
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    assert_replays_exactly(buffer, added)


def test_dqn_learns_from_images_with_one_step_fragments():
    pytest.importorskip("minatar")
    from herdrl import DQNConfig

    algo = DQNConfig().environment("MinAtar/Breakout-v1").env_runners(
        rollout_fragment_length=1, num_envs_per_env_runner=1).training(
        num_steps_sampled_before_learning_starts=32, min_sample_timesteps_per_iteration=300).debugging(seed=0).build()
    result = algo.train()  # Breakout episodes end within 300 steps: fragments with only a reset step come
    algo.stop()
    assert result["num_episodes"] > 0 and result["replay_buffer_size"] == result["num_env_steps_sampled"] == 300
