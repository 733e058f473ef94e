"""Greedy (or exploring) evaluation episodes, for `herd evaluate` and periodic evaluation in training.

Each of N env copies plays exactly its first episode, all in parallel: no bias towards short episodes
(which a "first N episodes to finish" count would have), and one batched forward pass per step.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.env import make_single_env, make_vector_env
from herdrl.env.previous import inputs_of
from herdrl.errors import EnvError
from herdrl.policy import Policy


def summarize(returns: list[float], lengths: list[int], prefix: str = "") -> dict[str, float]:
    """Mean/std/min/max of returns and lengths under ``prefix`` (e.g. ``evaluation/``)."""
    stats: dict[str, float] = {"num_episodes": len(returns)}
    for name, values in (("episode_return", returns), ("episode_len", lengths)):
        array = np.asarray(values, dtype=np.float64)
        for stat in ("mean", "std", "min", "max"):
            stats[f"{name}_{stat}"] = float(getattr(np, stat)(array)) if len(array) else math.nan
    return {f"{prefix}{k}": v for k, v in stats.items()}


#: Seconds between progress lines while episodes play (a Pong episode with video takes minutes).
PROGRESS_EVERY_S = 10.0


def say_cut(bound: str, finished: int, change: str = "") -> None:
    """The one line a cut evaluation leaves: the bound that cut it (``evaluation_sample_timeout_s=120``), the
    episodes finished by then, and ``change``: how to change the bound."""
    logging.getLogger("herdrl").warning(
        "herdrl: evaluation stopped at %s with %d episode%s finished; episodes still running were cut and left out%s",
        bound, finished, "" if finished == 1 else "s", f" ({change})" if change else "")


class Deadline:
    """A time bound of ``timeout_s`` seconds from now (None: none), named ``option`` for the user (the key or flag
    that sets it)."""

    def __init__(self, timeout_s: float | None, option: str = "evaluation_sample_timeout_s") -> None:
        self.timeout_s, self.option = timeout_s, option
        self.at = None if timeout_s is None else time.monotonic() + timeout_s

    @property
    def bound(self) -> str:
        """The bound as :func:`say_cut` names what cut an evaluation: ``evaluation_sample_timeout_s=120``."""
        return f"{self.option}={self.timeout_s:g}"

    @property
    def change(self) -> str:
        """How to change the bound (said with :func:`say_cut`)."""
        return f"raise {self.option}, or set it to None, to let them finish"

    def say_cut(self, finished: int) -> None:
        """The line an evaluation this bound cut leaves (:func:`say_cut`)."""
        say_cut(self.bound, finished, self.change)

    def passed(self) -> bool:
        """Whether the time is up."""
        return self.at is not None and time.monotonic() >= self.at

    def left(self) -> float | None:
        """Seconds left (None: no bound)."""
        return None if self.at is None else self.at - time.monotonic()


class Ticker:
    """Says whether :data:`PROGRESS_EVERY_S` have passed since it last said so."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_S:
            return False
        self.last = now
        return True


def check_spaces(policy: Policy, env: Any, observation_space: gym.Space, action_space: gym.Space) -> None:
    """Refuse, in one line naming both pairs of spaces, an env whose spaces are not the policy's in kind, shape,
    dtype or size (before a forward pass fails on its shapes deep inside torch). Boxes of other bounds pass, with a
    note: an env whose bounds come from its config (Pendulum's ``max_speed``) still takes the policy."""
    if (observation_space, action_space) == (policy.observation_space, policy.action_space):
        return
    if _same_layout(observation_space, policy.observation_space) and _same_layout(action_space, policy.action_space):
        if str(env) not in _BOUNDS_NOTED:  # (once per env: evaluations repeat every evaluation_interval)
            _BOUNDS_NOTED.add(str(env))
            logging.getLogger("herdrl").warning("herdrl: env '%s' has Box bounds other than the policy's (same "
                                                "shapes): evaluated as they are", env)
        return
    (env_obs, own_obs), (env_act, own_act) = (_brief(observation_space, policy.observation_space),
                                              _brief(action_space, policy.action_space))
    raise EnvError(f"env '{env}' has observation space {env_obs} and action space {env_act}; the policy was trained "
                   f"on {own_obs} and {own_act}: evaluate it on an env with the same spaces")


_BOUNDS_NOTED: set[str] = set()


def _same_layout(space: gym.Space, other: gym.Space) -> bool:
    """Whether two spaces are alike but for Box bounds: the same kinds, keys, shapes, dtypes and sizes."""
    if type(space) is not type(other):
        return False
    if isinstance(space, gym.spaces.Box):
        return space.shape == other.shape and space.dtype == other.dtype
    if isinstance(space, gym.spaces.Dict):
        return list(space.spaces) == list(other.spaces) and all(
            _same_layout(space[key], other[key]) for key in space.spaces)
    if isinstance(space, gym.spaces.Tuple):
        return len(space) == len(other) and all(_same_layout(a, b) for a, b in zip(space, other, strict=True))
    return space == other


def _brief(*spaces: gym.Space) -> list[str]:
    """Spaces on one line each, briefly (:func:`_short`) unless that would hide how they differ."""
    short = [_short(space) for space in spaces]
    return short if len(set(short)) == len(short) or spaces[0] == spaces[1] else \
        [" ".join(str(space).split()) for space in spaces]


def _short(space: gym.Space) -> str:
    """A Box by its shape and dtype and, when the same everywhere, its bounds; another space as it prints."""
    if isinstance(space, gym.spaces.Box):
        low, high = np.unique(space.low), np.unique(space.high)
        bounds = f"{low[0]:g}, {high[0]:g}, " if len(low) == 1 and len(high) == 1 else ""
        return f"Box({bounds}{space.shape}, {space.dtype})"
    return " ".join(str(space).split())


class Evaluator:
    """Runs ``episodes`` evaluation episodes on its own vector env (separate from the training envs)."""

    def __init__(self, env: Any, env_config: dict, episodes: int, mode: str = "auto",
                 previous: tuple[bool, bool] = (False, False)) -> None:
        """``previous``: observations carry the previous action/reward (``herdrl.env.previous.inputs_of`` tells it
        from a policy's observation space)."""
        self.env = make_vector_env(env, env_config, episodes, mode, previous=previous)
        self.env_id = env
        self.episodes = episodes

    def run(self, policy: Policy, seed: int | None = None, explore: bool = False,
            max_steps: int | None = None, progress: Callable[[str], None] | None = None,
            timeout_s: float | None = None, timeout_option: str = "evaluation_sample_timeout_s") -> tuple[list[float],
                                                                                                       list[int]]:
        """Play one episode per env copy, for at most ``max_steps`` steps and ``timeout_s`` seconds; return the
        returns and lengths of the episodes that finished (all of them unless a bound cut some short: a line says
        so, and how to change ``timeout_option``, the bound's name for the user). ``progress``: called with a line
        every :data:`PROGRESS_EVERY_S` seconds while episodes play."""
        check_spaces(policy, self.env_id, self.env.single_observation_space, self.env.single_action_space)
        ticker, deadline, cut, change = Ticker(), Deadline(timeout_s, timeout_option), "", ""
        obs, _ = self.env.reset(seed=seed)
        returns = np.zeros(self.episodes)
        lengths = np.zeros(self.episodes, dtype=np.int64)
        running = np.ones(self.episodes, dtype=bool)
        state = policy.initial_state(self.episodes)  # recurrent policies: one state per episode, carried
        for _ in range(max_steps or 1_000_000):  # 1M: a bound even for an env that never ends
            if policy.recurrent:
                actions, state = policy.compute_actions(obs, explore=explore, state=state)
            else:
                actions = policy.compute_actions(obs, explore=explore)
            obs, reward, terminated, truncated, _ = self.env.step(actions)
            returns += np.where(running, reward, 0.0)
            lengths += running
            running &= ~(np.asarray(terminated) | np.asarray(truncated))
            if not running.any():
                break
            if deadline.passed():  # an env that never ends (a game waiting for FIRE) must not hold the run
                cut, change = deadline.bound, deadline.change
                break
            if progress is not None and ticker.due():
                progress(f"{self.episodes - int(running.sum())}/{self.episodes} episodes done, "
                         f"{int(lengths.max()):,} steps so far")
        else:
            cut, change = (f"evaluation_config max_steps={max_steps}", "raise it to let them finish") if max_steps \
                else ("1,000,000 steps", "")
        finished = ~running
        if running.any():
            say_cut(cut, int(finished.sum()), change)
        return returns[finished].tolist(), lengths[finished].tolist()

    def close(self) -> None:
        """Close the envs."""
        self.env.close()


#: Frames a video may hold (about 9 GB of 600x400 RGB): episodes that never end stop here, not at memory's end.
MAX_VIDEO_FRAMES = 40_000


def record_video(policy: Policy, env: Any, env_config: dict, path: str | Path, episodes: int = 1,
                 seed: int | None = None, explore: bool = False,
                 progress: Callable[[str], None] | None = None, timeout_s: float | None = None,
                 timeout_option: str = "--timeout-s") -> tuple[list[float], list[int]]:
    """Play ``episodes`` episodes on one rendering env and write the frames to ``path`` (.mp4 or .gif).

    ``progress``: called with a line after each episode, every :data:`PROGRESS_EVERY_S` seconds within one, and
    around the (slow, for GIFs) file writing. ``timeout_s``: the episode playing then stops (a line says so, naming
    ``timeout_option``); the frames so far are written, the returns are those of the episodes finished.
    """
    say = progress or (lambda line: None)
    path = Path(path)
    if path.suffix.lower() not in (".mp4", ".gif"):
        raise EnvError(f"--video '{path}': use a .mp4 or .gif file name")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame-based renderers: no screen needed
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if not os.environ.get("DISPLAY"):  # MuJoCo: render off-screen through EGL (GPU or Mesa), no X server needed
        os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        single = make_single_env(env, env_config, inputs_of(policy.observation_space), render_mode="rgb_array")
    except gym.error.DependencyNotInstalled as exc:
        raise EnvError(f"env '{env}' needs extra packages to render: {exc}; pip install 'herdrl[video]'") from None
    except TypeError:
        raise EnvError(f"env '{env}' cannot render: its constructor takes no render_mode") from None
    try:
        check_spaces(policy, env, single.observation_space, single.action_space)
    except EnvError:
        single.close()
        raise
    if "rgb_array" not in (single.metadata or {}).get("render_modes", []):
        single.close()
        raise EnvError(f"env '{env}' cannot render rgb_array frames (its render_modes: "
                       f"{(single.metadata or {}).get('render_modes', [])})")
    frames, returns, lengths = [], [], []
    ticker, deadline = Ticker(), Deadline(timeout_s, timeout_option)
    try:
        for episode in range(episodes):
            obs, _ = single.reset(seed=None if seed is None else seed + episode)
            frames.append(single.render())
            total, length, done = 0.0, 0, False
            state = policy.initial_state()
            while not done:
                if policy.recurrent:
                    action, state = policy.compute_single_action(obs, explore, state)
                else:
                    action = policy.compute_single_action(obs, explore)
                obs, reward, terminated, truncated, _ = single.step(action)
                frames.append(single.render())
                total, length, done = total + float(reward), length + 1, terminated or truncated
                if ticker.due():
                    say(f"episode {episode + 1}/{episodes}: {length:,} steps so far, return {total:.1f}")
                if len(frames) > MAX_VIDEO_FRAMES:  # frames are held in memory until written
                    raise EnvError(f"--video: more than {MAX_VIDEO_FRAMES:,} frames (episode {episode + 1} has "
                                   f"not ended after {length:,} steps); record fewer or shorter episodes")
                if not done and deadline.passed():
                    break
            if not done:
                deadline.say_cut(len(returns))
                break
            returns.append(total)
            lengths.append(length)
            say(f"episode {episode + 1}/{episodes}: return {total:.1f}, {length} steps")
    except gym.error.DependencyNotInstalled as exc:
        raise EnvError(f"env '{env}' needs extra packages to render: {exc}; pip install 'herdrl[video]'") from None
    finally:
        single.close()
    say(f"writing {len(frames)} frames to {path} ...")
    start = time.time()
    _write_frames(frames, path, fps=int((single.metadata or {}).get("render_fps", 30)))
    say(f"wrote {path} in {time.time() - start:.1f} s")
    return returns, lengths


def _write_frames(frames: list[np.ndarray], path: Path, fps: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".gif":
        from PIL import Image  # Pillow comes with matplotlib

        images = [Image.fromarray(np.asarray(f)) for f in frames]
        images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
        return
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise EnvError("writing .mp4 needs imageio and imageio-ffmpeg: pip install 'herdrl[video]' "
                       "(or write a .gif)") from None
    try:
        imageio.mimsave(path, frames, fps=fps, macro_block_size=1)
    except Exception as exc:  # no ffmpeg backend
        raise EnvError(f"could not write {path}: {exc}; pip install 'herdrl[video]' or write a .gif") from None
