"""Atari through ale-py (preprocessing, reward clipping, episodic life, RAM ids), MinAtar, frame stacks."""

import logging

import gymnasium as gym
import numpy as np
import pytest

import herdrl
from herdrl import EnvError, PPOConfig, TRPOConfig
from herdrl.env import make_vector_env
from herdrl.rollout import EnvRunner

pytest.importorskip("ale_py")


def runner(env, env_config=None, envs=2, algo=PPOConfig):
    config = algo().environment(env, env_config=env_config or {}).env_runners(num_envs_per_env_runner=envs) \
        .debugging(seed=0)
    config.validate()
    return EnvRunner(config)


def test_preprocessing_is_on_by_default_and_each_part_can_change():
    venv = make_vector_env("ALE/Pong-v5", {}, 2)
    assert venv.single_observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert venv.herd_clip_rewards and not venv.herd_episodic_life
    venv.close()
    venv = make_vector_env("ALE/Pong-v5", {"frame_stack": 2, "screen_size": 64, "clip_rewards": False}, 2)
    assert venv.single_observation_space.shape == (2, 64, 64) and not venv.herd_clip_rewards
    venv.close()
    raw = make_vector_env("ALE/Pong-v5", {"preprocess": False}, 2)
    assert raw.single_observation_space.shape == (210, 160, 3)
    raw.close()
    with pytest.raises(EnvError, match=r"env_config key\(s\) \['frame_skip'\] are not ale-py options"):
        make_vector_env("ALE/Pong-v5", {"frame_skip": 4}, 2)


def test_overlapped_halves_sample_what_one_vector_env_samples():
    """The runner steps ale-py's envs in two halves overlapped with the policy (the default): the fragment is the
    one a single vector env of all the copies gives, same seeds, frames, actions and rewards."""
    halves, whole = (runner("PongNoFrameskip-v4", {"overlap": overlap}, envs=4) for overlap in (True, False))
    assert type(halves.env).__name__ == "TwoHalves" and type(whole.env).__name__ != "TwoHalves"
    whole.set_weights({k: v.numpy() for k, v in halves.module.state_dict().items()})
    for _ in range(2):  # across a fragment boundary
        a, b = halves.sample(60), whole.sample(60)
        assert np.array_equal(a.obs, b.obs) and np.array_equal(a.actions, b.actions)
        assert np.array_equal(a.rewards, b.rewards) and np.array_equal(a.valid, b.valid)
    assert a.obs[:, :2].std() > 0 and a.obs[:, 2:].std() > 0  # both halves stepped
    halves.stop()
    whole.stop()


def test_gymnasium_wrappers_give_the_same_frames_as_ale_pys_vector_env():
    pytest.importorskip("cv2")
    config = {"noop_max": 0}  # no random no-ops: both envs play the same game (FIRE at reset included)
    ale = make_vector_env("PongNoFrameskip-v4", config, 1)
    wrapped = make_vector_env("PongNoFrameskip-v4", config, 1, mode="sync")
    assert type(ale).__name__ == "AleVectorEnv" and isinstance(wrapped, gym.vector.SyncVectorEnv)
    a, _ = ale.reset(seed=3)
    b, _ = wrapped.reset(seed=3)
    assert np.array_equal(a, b)
    rng = np.random.default_rng(0)
    for _ in range(40):
        action = rng.integers(0, 6, 1)
        a, *_ = ale.step(action)
        b, *_ = wrapped.step(action)
        assert np.array_equal(a, b)
    ale.close()
    wrapped.close()


@pytest.mark.parametrize("game", ["Breakout", "BeamRider"])
def test_a_game_goes_on_after_a_lost_life_for_an_agent_that_never_presses_fire(game):
    """Breakout serves the next ball on FIRE, BeamRider starts the next life on UP: an agent that only plays NOOP
    (a greedy policy that never chose them) saw the game stand still after its first lost life until the
    108,000-frame truncation. Read from ALE's own lives and frame counter: with the default the game runs through
    all its lives to game over; with fire_after_life_loss off it stands still after the first."""
    steps = {"Breakout": 400, "BeamRider": 1500}[game]  # a NOOP game lasts ~130 / ~1000 steps
    for restart in (True, False):
        venv = make_vector_env(f"{game}NoFrameskip-v4", {"fire_after_life_loss": restart, "overlap": False}, 2)
        _, info = venv.reset(seed=0)
        start_lives, over = info["lives"].copy(), np.zeros(2, dtype=bool)
        for _ in range(steps):
            _, _, terminated, truncated, info = venv.step(np.zeros(2, dtype=np.int64))
            assert not truncated.any()
            over |= terminated
            if over.all():
                break
        venv.close()
        if restart:
            assert over.all()  # every life played, the game over long before 108,000 frames
        else:
            assert not over.any() and (info["lives"] == start_lives - 1).all()  # stuck after the first lost life
            assert (info["frame_number"] >= 4 * steps).all()  # the frames ran on all the while


def test_both_atari_paths_restart_after_a_lost_life_alike():
    """ale-py's vector env (herdrl's Restarts in Python around it) and Gymnasium's wrappers (RestartWrapper) give
    the same frames through Breakout's lost lives, for an agent that never presses FIRE."""
    pytest.importorskip("cv2")
    config = {"noop_max": 0, "overlap": False}
    ale = make_vector_env("BreakoutNoFrameskip-v4", config, 1)
    wrapped = make_vector_env("BreakoutNoFrameskip-v4", config, 1, mode="sync")
    a, info = ale.reset(seed=3)
    b, _ = wrapped.reset(seed=3)
    assert np.array_equal(a, b)
    rng, lives = np.random.default_rng(0), {int(info["lives"][0])}
    for _ in range(300):
        action = rng.choice([0, 2, 3], 1)  # NOOP, RIGHT, LEFT: never FIRE
        a, _, done_a, _, info = ale.step(action)
        b, _, done_b, _, _ = wrapped.step(action)
        assert np.array_equal(a, b) and done_a == done_b
        lives.add(int(info["lives"][0]))
        if done_a.any():
            break
    assert len(lives) >= 3  # two lost lives (at least) played through
    ale.close()
    wrapped.close()


@pytest.mark.parametrize("mode", ["auto", "sync"])
def test_with_sticky_actions_every_breakout_game_starts_and_goes_on(mode):
    """ALE/Breakout-v5 repeats the previous frame's action one time in four: the one frame of FIRE at reset was lost
    one time in four (the game never started), a step of FIRE after a lost life one time in 256. An agent that only
    plays NOOP, 4 envs: every game plays through (read from ALE's rewards, lives and game ends: no stretch of 100
    steps without one of them), on ale-py's vector env and on Gymnasium's wrappers."""
    if mode == "sync":
        pytest.importorskip("cv2")
    venv = make_vector_env("ALE/Breakout-v5", {"overlap": False}, 4, mode=mode)
    _, info = venv.reset(seed=0)
    lives, idle, longest, games = info["lives"].copy(), np.zeros(4, int), np.zeros(4, int), np.zeros(4, int)
    for _ in range(600):  # a NOOP game lasts ~150-300 steps
        _, reward, terminated, truncated, info = venv.step(np.zeros(4, dtype=np.int64))
        idle = np.where((reward != 0) | (info["lives"] != lives) | terminated | truncated, 0, idle + 1)
        longest, games, lives = np.maximum(longest, idle), games + terminated, info["lives"].copy()
    venv.close()
    assert longest.max() < 100 and games.min() >= 1


def test_rewards_are_clipped_for_learning_while_reported_returns_are_the_games():
    """SpaceInvaders scores 5 to 30 points per alien: the learner sees rewards in {0, 1}, the episode returns
    sum the points."""
    run = runner("ALE/SpaceInvaders-v5", envs=4)
    returns, clipped, kills = [], [], np.zeros(4)
    while not returns:
        fragment = run.sample(200)
        assert set(np.unique(fragment.rewards)) <= {0.0, 1.0}
        for t in range(200):  # clipped rewards summed per episode, env by env, as a reference
            kills += np.where(fragment.valid[t], fragment.rewards[t], 0.0)
            for b in np.nonzero(fragment.terminateds[t] | fragment.truncateds[t])[0]:
                clipped.append(kills[b])
                kills[b] = 0
        returns += fragment.episode_returns
    assert len(clipped) == len(returns)
    assert sorted(returns) != sorted(clipped) and all(r >= 5 * c for r, c in zip(sorted(returns), sorted(clipped),
                                                                                 strict=True))
    run.stop()


def test_episodic_life_ends_episodes_for_learning_only():
    """Breakout has 5 lives: with episodic_life the learner's episodes end exactly where the env's own
    ``info["lives"]`` drops (read here from the env, independently of the runner), the env plays on (the next
    step is real experience), and the reported episode is the whole game."""
    run = runner("ALE/Breakout-v5", {"episodic_life": True, "max_num_frames_per_episode": 4000}, envs=2)
    seen = ([], [])  # the runner steps the envs in two halves (atari.TwoHalves), one env each here
    for half, record in zip(run.env.halves, seen, strict=True):
        def recording_recv(recv=half.recv, record=record):
            out = recv()
            record.append(np.array(out[4]["lives"]))
            return out

        half.recv = recording_recv
    previous, lengths, losses = np.array(run._lives), [], 0
    while not lengths:
        for record in seen:
            record.clear()
        fragment = run.sample(250)
        lives = np.concatenate([np.stack(record) for record in seen], axis=1)
        env_done = np.concatenate([~fragment.valid[1:], run._reset_next[None]])  # the env's own episode ends
        expected = np.zeros_like(env_done)
        for t in range(len(lives)):
            expected[t] = (lives[t] < previous) & (lives[t] > 0) & ~env_done[t]
            previous = lives[t]
        assert np.array_equal(fragment.terminateds & ~env_done, expected)
        after = np.argwhere(expected[:-1])
        assert fragment.valid[after[:, 0] + 1, after[:, 1]].all()  # the game goes on after a lost life
        losses += int(expected.sum())
        lengths += fragment.episode_lengths
    assert losses >= 1 and max(lengths) > 50
    run.stop()


class StepIndexImage(gym.Env):
    """A 4 x 4 frame whose pixels all hold (episode number * 20 + step index + 1); episodes last 5 steps."""

    def __init__(self, config=None):
        self.observation_space = gym.spaces.Box(0, 255, (4, 4, 1), np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.episode = -1

    def _frame(self):
        return np.full((4, 4, 1), self.episode * 20 + self.t + 1, np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        return self._frame(), 0.0, self.t >= 5, False, {}


def test_no_frame_of_a_finished_episode_leaks_into_the_next_stack():
    """A 4-frame stack over episodes of 5 steps, fragments of 7 steps (ends fall inside fragments and on
    their boundaries): every stack holds only its own episode's frames, consecutive, zeros before the start."""
    herdrl.register_env("step_index", lambda cfg: gym.wrappers.FrameStackObservation(
        StepIndexImage(), 4, padding_type="zero"))
    run = runner("step_index", envs=3)
    for _ in range(6):
        fragment = run.sample(7)
        stacks = fragment.obs[:, :, :, 0, 0, 0].astype(int)  # (T+1, B, 4): one pixel per stacked frame
        for stack in stacks.reshape(-1, 4):
            frames = stack[stack > 0]
            episode, steps = (frames - 1) // 20, (frames - 1) % 20
            assert len(set(episode)) == 1 and np.array_equal(steps, np.arange(steps[0], steps[0] + len(steps)))
            assert len(frames) == 4 or steps[0] == 0  # zeros only before an episode's first frame
    run.stop()


def test_ale_stacks_start_empty_after_an_episode_end_and_time_limits_truncate():
    """ALE's 108k-frame limit (here 400 frames) truncates, so the last step bootstraps; the next episode's
    first stack holds zeros before its first frame."""
    run = runner("PongNoFrameskip-v4", {"max_num_frames_per_episode": 400, "noop_max": 0}, envs=2)
    fragment = run.sample(120)
    ends = np.argwhere(fragment.truncateds)
    assert len(ends) and not fragment.terminateds.any()
    t, b = ends[0]
    first = fragment.obs[t + 2, b]  # after the reset-only step: the new episode's first observation
    assert not fragment.valid[t + 1, b] and first[3].any() and not first[:3].any()
    run.stop()


def test_the_seeds_pong_ram_id_runs_with_trpo(caplog, monkeypatch):
    from herdrl.env import atari

    monkeypatch.setattr(atari, "_SAID", set())  # the note comes once per process: another test may have had it
    with caplog.at_level(logging.WARNING, logger="herdrl"):
        algo = TRPOConfig().environment("Pong-ram-v0").env_runners(num_envs_per_env_runner=4) \
            .training(train_batch_size=400).debugging(seed=0).build()
    assert algo.observation_space == gym.spaces.Box(0, 255, (128,), np.uint8)
    assert "Pong-ram-v0 (removed in ale-py 0.11) runs as Pong-v0 with obs_type='ram'" in caplog.text
    results = [algo.train() for _ in range(2)]
    assert results[-1]["training_iteration"] == 2 and results[-1]["num_env_steps_sampled_lifetime"] >= 800
    algo.stop()


def test_ray_runners_leave_the_ram_note_and_ales_banner_to_the_driver():
    """A runner process (quiet_in_runners) makes the env without repeating the note or ALE's version banner."""
    import subprocess
    import sys

    code = ("from herdrl.env import atari, make_vector_env; atari.quiet_in_runners(); "
            "make_vector_env('Pong-ram-v0', {}, 1).reset(seed=0); make_vector_env('ALE/Pong-v5', {}, 1)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "A.L.E" not in result.stderr + result.stdout and "removed in ale-py" not in result.stderr
    loud = subprocess.run([sys.executable, "-c", code.replace("atari.quiet_in_runners(); ", "")],
                          capture_output=True, text=True, check=True)
    assert "A.L.E" in loud.stderr + loud.stdout and "removed in ale-py" in loud.stderr  # what it hides


def test_minatar_trains_by_id():
    pytest.importorskip("minatar")
    algo = PPOConfig().environment("MinAtar/Breakout-v1").env_runners(num_envs_per_env_runner=4) \
        .training(train_batch_size=256, minibatch_size=128).debugging(seed=0).build()
    assert algo.observation_space.shape == (10, 10, 4) and algo.observation_space.dtype == np.bool_
    assert gym.spec("MinAtar/Breakout-v1").max_episode_steps == 10_000
    results = [algo.train() for _ in range(2)]
    assert results[-1]["num_env_steps_sampled_lifetime"] > 256
    algo.stop()


def test_video_of_an_atari_policy_shows_the_game_screen(tmp_path):
    pytest.importorskip("cv2")
    from PIL import Image

    from herdrl.evaluation import record_video

    algo = PPOConfig().environment("ALE/Pong-v5", env_config={"max_num_frames_per_episode": 800}) \
        .env_runners(num_envs_per_env_runner=2).training(train_batch_size=64, minibatch_size=32).build()
    algo.train()
    returns, lengths = record_video(algo.policy, "ALE/Pong-v5", {"max_num_frames_per_episode": 800},
                                    tmp_path / "pong.gif", seed=0)
    assert lengths[0] <= 200 and Image.open(tmp_path / "pong.gif").size == (160, 210)  # the game's resolution
    algo.stop()


def test_atari_options_are_checked():
    with pytest.raises(EnvError, match="env_config clip_rewards='false'; expected true or false"):
        make_vector_env("ALE/Pong-v5", {"clip_rewards": "false"}, 1)
    raw = make_vector_env("ALE/Pong-v5", {"preprocess": False}, 1)
    assert not raw.herd_clip_rewards  # the raw env's rewards, unless asked
    raw.close()


@pytest.mark.parametrize("game, expected", [("Breakout", ["FIRE", "RIGHT"]), ("MsPacman", [])])
def test_the_restart_is_the_minimal_sets_fire_and_action_2_in_whatever_set_the_agent_acts_in(game, expected):
    """The full 18-action set has FIRE at 1 in every game: whether a game restarts with FIRE, and with which second
    action, comes from its minimal set (Breakout: NOOP, FIRE, RIGHT, LEFT; Ms. Pac-Man has no FIRE), in both env
    paths, as indices of the actions the agent acts with (read from a Gymnasium env of the same settings)."""
    from herdrl.env.atari import RestartWrapper

    for full in (False, True):
        acting = gym.make(f"{game}NoFrameskip-v4", full_action_space=full).unwrapped.get_action_meanings()
        for mode in ("auto", "sync"):
            venv = make_vector_env(f"{game}NoFrameskip-v4", {"full_action_space": full}, 1, mode=mode)
            if mode == "auto":
                restart = list(venv.restart.restart)
            else:
                env, restart = venv.envs[0], []
                while hasattr(env, "env"):
                    restart = list(env.restart.restart) if isinstance(env, RestartWrapper) else restart
                    env = env.env
            assert [acting[i] for i in restart] == expected, (full, mode)
            venv.close()
