"""Atari through ale-py, preprocessed the standard way by default.

Every env id ale-py registers (``ALE/Pong-v5``, ``PongNoFrameskip-v4``, the old ``Pong-v0``/``Pong-v4``) gets
the preprocessing of Mnih et al. 2015 as SB3's ``AtariWrapper``, CleanRL's ``ppo_atari.py`` and RLlib's Atari
examples apply it: up to 30 no-op starts, FIRE at reset where the game needs it (and after each lost life: see
:func:`restart_actions`), 4 frames skipped per step
with the max over the last two, 84 x 84 grayscale, a stack of the last 4 frames (zeros before the first),
rewards clipped to their sign for learning while reported returns stay the game's own. Episodic life (a life
lost ends the episode for learning, never for the reported return) is available, off by default. Each part
is turned off or changed through ``env_config`` (:data:`OPTIONS`); ``preprocess=False`` gives the raw env.

Two ways to build the vector env: ale-py's own C++ vector env (threaded, preprocessing and stacking inside:
the default) or Gymnasium's ``AtariPreprocessing`` + ``FrameStackObservation`` on sync/async vector envs
(``gym_env_vectorize_mode="sync"``/``"async"``, needs opencv). Both give the same frames, pixel for pixel.
With ale-py's env and 2 or more envs, the runner overlaps the env and the policy (``overlap``, on by default):
the envs are two halves (:class:`TwoHalves`), and while ale-py's threads step one half, the policy's forward
pass runs on the other's observations; the env step and the CNN cost about the same on a CPU, so this
recovers much of the time either waits for the other.

The ``-ram`` ids that ale-py >= 0.11 removed (``Pong-ram-v0``, ``Pong-ramNoFrameskip-v4``, ...) map to the
current env with ``obs_type="ram"`` and the old id's frame skip and sticky actions.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.errors import EnvError

logger = logging.getLogger("herdrl")

#: env_config keys herdrl reads for Atari ids (not passed to the env), and their defaults.
OPTIONS: dict[str, Any] = {
    "preprocess": True,      # False: the raw env (210 x 160 RGB, the id's frame skip, rewards as they come)
    "frameskip": 4,          # agent steps every 4 frames, max over the last two
    "noop_max": 30,          # up to 30 random no-ops after each reset
    "fire_reset": True,      # press FIRE after reset in games that need it to start (sticky actions: see Restarts)
    "fire_after_life_loss": True,  # FIRE, then action 2, as the agent's next two steps after a lost life
    "screen_size": 84,       # frames resized to 84 x 84
    "grayscale": True,
    "frame_stack": 4,        # observation: the last 4 frames, (4, 84, 84) uint8
    "clip_rewards": True,    # learn on sign(reward); reported returns are unclipped
    "episodic_life": False,  # a lost life ends the episode for learning (reported returns: whole games)
    "num_threads": 0,        # ale-py vector env threads; 0: one per env, at most this machine's cores
    "overlap": True,         # two halves of the envs: one steps while the policy acts for the other
}
_SAID: set[str] = set()
_QUIET = False  # set in Ray runner processes (quiet_in_runners)
_RAM_ID = re.compile(r"^(?P<game>[A-Z][A-Za-z]*)-ram(?P<variant>NoFrameskip|Deterministic)?-(?P<version>v0|v4)$")


def quiet_in_runners() -> None:
    """In a Ray runner process: the driver has said what an old id became, and ALE's version banner ("A.L.E:
    Arcade Learning Environment ...", "[Powered by Stella]") would be echoed once per runner: keep both out."""
    global _QUIET
    _QUIET = True


def _banner_off_in_runners() -> None:
    if _QUIET:
        import ale_py

        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # errors still show


def is_atari(spec: gym.envs.registration.EnvSpec) -> bool:
    """Whether ``spec`` is an ale-py env."""
    return str(spec.entry_point).startswith("ale_py.")


def ram_spec(env_id: str) -> gym.envs.registration.EnvSpec | None:
    """The spec an old ``-ram`` id stands for (the same game, frame skip and sticky actions, RAM observations),
    or None if ``env_id`` is not such an id."""
    match = _RAM_ID.match(env_id)
    if not match:
        return None
    game, variant, version = match["game"], match["variant"] or "", match["version"]
    base = f"{game}{variant}-{version}"
    if base in gym.registry:
        spec = gym.spec(base)
        kwargs = dict(spec.kwargs)
    elif variant == "Deterministic" and f"ALE/{game}-v5" in gym.registry:  # old gym: frameskip 4, v0 sticky
        base = f"ALE/{game}-v5"
        spec = gym.spec(base)
        kwargs = {**spec.kwargs, "frameskip": 4, "repeat_action_probability": 0.25 if version == "v0" else 0.0}
    else:
        return None
    if env_id not in _SAID and not _QUIET:  # once per id and process: the spec is looked up several times
        _SAID.add(env_id)
        logger.warning("herdrl: %s (removed in ale-py 0.11) runs as %s with obs_type='ram' (frame skip %s, sticky "
                       "actions %s)", env_id, base, kwargs.get("frameskip"), kwargs.get("repeat_action_probability"))
    return dataclasses.replace(spec, id=env_id, kwargs={**kwargs, "obs_type": "ram"})


def split_options(spec: gym.envs.registration.EnvSpec, env_config: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """(herdrl's Atari options, the env's own kwargs) from ``env_config``; unknown option values are refused."""
    options = {**OPTIONS, **{k: v for k, v in env_config.items() if k in OPTIONS}}
    env_kwargs = {k: v for k, v in env_config.items() if k not in OPTIONS}
    if spec.kwargs.get("obs_type", "rgb") != "rgb" or env_kwargs.get("obs_type", "rgb") != "rgb":
        options["preprocess"] = False  # RAM (or grayscale-screen) observations: nothing to resize or stack
    if not options["preprocess"]:  # the raw env: its own frame skip, its own rewards unless asked otherwise
        if "frameskip" in env_config:
            env_kwargs["frameskip"] = env_config["frameskip"]
        options["clip_rewards"] = env_config.get("clip_rewards", False)
    for key in ("preprocess", "fire_reset", "fire_after_life_loss", "grayscale", "clip_rewards", "episodic_life",
                "overlap"):
        if not isinstance(options[key], bool):
            raise EnvError(f"env '{spec.id}': env_config {key}={options[key]!r}; expected true or false")
    for key in ("noop_max", "num_threads"):
        if not (isinstance(options[key], int) and not isinstance(options[key], bool) and options[key] >= 0):
            raise EnvError(f"env '{spec.id}': env_config {key}={options[key]!r}; expected an int >= 0")
    for key in ("frameskip", "screen_size", "frame_stack") if options["preprocess"] else ():
        if not (isinstance(options[key], int) and not isinstance(options[key], bool) and options[key] >= 1):
            raise EnvError(f"env '{spec.id}': env_config {key}={options[key]!r}; expected an int >= 1")
    return options, env_kwargs


def make_vector(spec: gym.envs.registration.EnvSpec, env_config: dict, num_envs: int,
                mode: str) -> gym.vector.VectorEnv:
    """``num_envs`` preprocessed copies of an Atari env in NEXT_STEP autoreset mode (see the module doc)."""
    _banner_off_in_runners()
    options, env_kwargs = split_options(spec, env_config)
    stochastic_skip = not isinstance(spec.kwargs.get("frameskip", 1), int)
    if options["preprocess"] and mode in ("auto", "vector_entry_point") and not stochastic_skip:
        if options["overlap"] and num_envs >= 2:
            half = num_envs // 2
            venv = TwoHalves(_ale_vector(spec, options, env_kwargs, half),
                             _ale_vector(spec, options, env_kwargs, num_envs - half))
        else:
            venv = _ale_vector(spec, options, env_kwargs, num_envs)
    else:
        if mode in ("auto", "vector_entry_point"):
            mode = "sync"
        cls = gym.vector.AsyncVectorEnv if mode == "async" else gym.vector.SyncVectorEnv
        venv = cls([lambda: make_single(spec, env_config)] * num_envs,
                   autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    venv.herd_clip_rewards = bool(options["clip_rewards"])  # read by the runner: learning only, never reports
    venv.herd_episodic_life = bool(options["episodic_life"])
    return venv


class TwoHalves(gym.vector.VectorEnv):
    """Two ale-py vector envs as one, for a runner that overlaps them with the policy (``send``/``recv`` per
    half, each half stepped by its own C++ threads while Python goes on); ``step`` steps both (evaluation).

    Seeds, observations and infos are those of one vector env of all the copies: env ``b`` of the second half
    is env ``split + b`` of the whole.
    """

    def __init__(self, first: gym.vector.VectorEnv, second: gym.vector.VectorEnv) -> None:
        self.halves = (first, second)
        self.split = first.num_envs
        self.num_envs = first.num_envs + second.num_envs
        self.single_observation_space = first.single_observation_space
        self.single_action_space = first.single_action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = first.metadata
        self.parts = (slice(0, self.split), slice(self.split, self.num_envs))

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[Any, dict]:
        """Reset every copy; an int ``seed`` seeds them consecutively, as one vector env would."""
        seeds = (None, None)
        if isinstance(seed, (int, np.integer)):
            first = int(seed) % (2**31 - self.num_envs)  # ale-py's C++ side takes 32-bit seeds
            seeds = (first, first + self.split)
        return self._joined([half.reset(seed=s, options=options) for half, s in zip(self.halves, seeds,
                                                                                   strict=True)])

    def send(self, part: int, actions: np.ndarray) -> None:
        """Start stepping half ``part`` (0 or 1) with its actions; returns at once."""
        self.halves[part].send(np.ascontiguousarray(actions))

    def recv(self, part: int) -> tuple[Any, ...]:
        """Wait for half ``part``'s step: (obs, rewards, terminations, truncations, info) of its envs."""
        return self.halves[part].recv()

    def step(self, actions: np.ndarray) -> tuple[Any, ...]:
        """Step every copy (both halves at once)."""
        for part, envs in enumerate(self.parts):
            self.send(part, actions[envs])
        return self._joined([self.recv(part) for part in range(2)])

    def _joined(self, results: list[tuple]) -> tuple:
        *arrays, info = zip(*results, strict=True)
        infos = {key: np.concatenate([i[key] for i in info]) for key in info[0]
                 if all(isinstance(i.get(key), np.ndarray) for i in info)}
        if "env_id" in infos:
            infos["env_id"][self.split:] += self.split
        return (*(np.concatenate(a) for a in arrays), infos)

    def close(self, **kwargs: Any) -> None:
        """Close both halves."""
        for half in self.halves:
            half.close(**kwargs)
        self.closed = True


def _ale_vector(spec: gym.envs.registration.EnvSpec, options: dict, env_kwargs: dict,
                num_envs: int) -> gym.vector.VectorEnv:
    from ale_py.vector_env import AtariVectorEnv

    kwargs = {**spec.kwargs, **env_kwargs}
    unknown = set(kwargs) - {"game", "obs_type", "frameskip", "repeat_action_probability", "full_action_space",
                             "max_num_frames_per_episode", "mode", "difficulty"}
    if unknown:
        raise EnvError(f"env '{spec.id}': env_config key(s) {sorted(unknown)} are not ale-py options; herdrl's "
                       f"Atari options: {sorted(OPTIONS)}")
    class AleVectorEnv(AtariVectorEnv):
        """ale-py's vector env, taking any int seed (its C++ side takes 32-bit seeds only), and playing
        :class:`Restarts` (its C++ side presses FIRE for one frame at reset only)."""

        def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[Any, dict]:
            if isinstance(seed, (int, np.integer)):
                seed = int(seed) % (2**31 - self.num_envs)
            obs, info = super().reset(seed=seed, options=options)
            self.restart.reset(info)
            return obs, info

        def send(self, actions: np.ndarray) -> None:
            super().send(self.restart.actions(actions))

        def recv(self) -> tuple[Any, ...]:
            result = super().recv()
            self.restart.observe(*result[2:])
            return result

        def step(self, actions: np.ndarray) -> tuple[Any, ...]:
            self.send(actions)  # (ale-py's step sends and receives without these two)
            return self.recv()

    threads = options["num_threads"] or min(num_envs, os.cpu_count() or 1)
    venv = AleVectorEnv(
        kwargs["game"], num_envs, num_threads=threads,
        max_num_frames_per_episode=kwargs.get("max_num_frames_per_episode", 108_000),
        repeat_action_probability=kwargs.get("repeat_action_probability", 0.0),
        full_action_space=kwargs.get("full_action_space", False),
        img_height=options["screen_size"], img_width=options["screen_size"], grayscale=options["grayscale"],
        stack_num=options["frame_stack"], frameskip=options["frameskip"], maxpool=True, noop_max=options["noop_max"],
        episodic_life=False, reward_clipping=False, use_fire_reset=options["fire_reset"],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    acting = [action.name for action in venv.ale.get_action_set()]
    minimal = _minimal_action_names(kwargs["game"]) if kwargs.get("full_action_space") else acting
    sticky = kwargs.get("repeat_action_probability", 0.0) > 0
    venv.restart = Restarts(restart_actions(acting, minimal), num_envs, sticky, options["fire_reset"],
                            options["fire_after_life_loss"])
    return venv


def make_single(spec: gym.envs.registration.EnvSpec, env_config: dict, **make_kwargs: Any) -> gym.Env:
    """One Atari env with the same preprocessing through Gymnasium's wrappers (evaluation videos, sync/async
    vector envs); ``render_mode="rgb_array"`` renders the game's own 210 x 160 screen."""
    _banner_off_in_runners()
    options, env_kwargs = split_options(spec, env_config)
    if not options["preprocess"]:
        return gym.make(spec, **env_kwargs, **make_kwargs)
    stochastic_skip = not isinstance(spec.kwargs.get("frameskip", 1), int)
    try:
        import cv2  # noqa: F401  (Gymnasium's AtariPreprocessing resizes with it)
    except ImportError:
        raise EnvError(f"env '{spec.id}': Gymnasium's Atari preprocessing needs opencv: pip install "
                       "opencv-python-headless (or herdrl[video]); ale-py's own vector env, the default for "
                       "training, does not" + (f" but cannot skip a random number of frames as {spec.id} does: "
                                               "use ALE/... -v5 or ...NoFrameskip-v4" if stochastic_skip else "")
                       ) from None
    # The id's own skip when it is random (old -v0/-v4 ids); otherwise the wrapper skips (and max-pools).
    env_skip = spec.kwargs.get("frameskip", 1) if stochastic_skip else 1
    env = gym.make(spec, **{**env_kwargs, "frameskip": env_skip}, **make_kwargs)
    if options["fire_reset"]:  # one raw frame of FIRE, as ale-py's vector env presses it
        env = FireReset(env)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=options["noop_max"],
                                          frame_skip=1 if stochastic_skip else options["frameskip"],
                                          screen_size=options["screen_size"], grayscale_obs=options["grayscale"])
    if _single_restart_actions(env):
        env = RestartWrapper(env, options["fire_reset"], options["fire_after_life_loss"])
    return gym.wrappers.FrameStackObservation(env, options["frame_stack"], padding_type="zero")


class FireReset(gym.Wrapper):
    """Press FIRE for one frame after reset in games that wait for it (Breakout's ball), as ale-py's vector env
    does (applied to the raw env, below the frame skip)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        fire = _single_restart_actions(self.env)[:1]
        if fire:
            obs, _, terminated, truncated, info = self.env.step(fire[0])
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


def restart_actions(acting: list[str], minimal: list[str]) -> tuple[int, ...]:
    """The actions played (as the agent's next steps) after a lost life in a game whose minimal action set's action
    1 is FIRE: FIRE, then that set's action 2, as SB3's and CleanRL's ``FireResetEnv`` press them at each life's
    reset (with their ``EpisodicLifeEnv``), as indices in ``acting``, the set the agent acts in (the full 18 actions
    have FIRE at 1 in every game: the minimal set, ``minimal``, decides). Breakout waits for FIRE to serve the next
    ball, BeamRider for UP (its action 2): a greedy policy that never chooses them would stand still until the
    108,000-frame truncation. Other games: none."""
    if len(minimal) < 3 or minimal[1] != "FIRE":
        return ()
    return acting.index("FIRE"), acting.index(minimal[2])


def _minimal_action_names(game: str) -> list[str]:
    """The minimal action set of ``game`` (ale-py's vector env tells only the set it acts in)."""
    import ale_py
    from ale_py import roms

    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.loadROM(roms.get_rom_path(game))
    return [action.name for action in ale.getMinimalActionSet()]


def _single_restart_actions(env: gym.Env) -> tuple[int, ...]:
    """:func:`restart_actions` of one Gymnasium ALE env."""
    return restart_actions(env.unwrapped.get_action_meanings(),
                           [action.name for action in env.unwrapped.ale.getMinimalActionSet()])


class Restarts:
    """Per env of a vector env: the :func:`restart_actions` still to play in place of the agent's actions, after
    each lost life (``after_life_loss``) and, with sticky actions (``sticky``), after each reset (``after_reset``).

    Sticky actions (0.25 for ``ALE/...-v5`` ids) play the previous frame's action instead of the new one, frame by
    frame, one time in four: the one frame of FIRE pressed at reset is then lost one time in four and the game never
    starts; a 4-frame step of FIRE is lost one time in 256 (each of ~5 per Breakout game). With sticky actions each
    restart action is played for two steps: lost one time in 65,536."""

    def __init__(self, restart: tuple[int, ...], num_envs: int, sticky: bool, after_reset: bool,
                 after_life_loss: bool) -> None:
        restart = restart if after_reset and sticky or after_life_loss else ()
        self.restart = np.repeat(np.asarray(restart, dtype=np.int64), 2 if sticky else 1)
        self.after_reset, self.after_life_loss = after_reset and sticky, after_life_loss
        self.left = np.zeros(num_envs, dtype=np.int64)  # restart actions still to play, per env
        self.lives = np.zeros(num_envs, dtype=np.int64)
        self.resetting = np.zeros(num_envs, dtype=bool)  # the env's next step only resets it (NEXT_STEP autoreset)

    def reset(self, info: dict) -> None:
        """After a reset of every env: the lives the games start with, a restart to play if ``after_reset``."""
        self.left[:] = len(self.restart) if self.after_reset else 0
        self.lives = np.asarray(info["lives"], dtype=np.int64).copy()
        self.resetting[:] = False

    def actions(self, actions: np.ndarray) -> np.ndarray:
        """``actions`` with the pending restart actions in place of the agent's."""
        pending = self.left > 0
        if not pending.any():
            return actions
        actions = np.array(actions, copy=True)
        actions[pending] = self.restart[len(self.restart) - self.left[pending]]
        self.left[pending] -= 1
        return actions

    def observe(self, terminated: np.ndarray, truncated: np.ndarray, info: dict) -> None:
        """After a step: envs that lost a life (:func:`life_losses`), or were reset by it, restart next."""
        if not len(self.restart):
            return
        lives = np.asarray(info["lives"], dtype=np.int64)
        done = np.asarray(terminated) | np.asarray(truncated)
        if self.after_life_loss:
            self.left[life_losses(lives, self.lives, done)] = len(self.restart)
        if self.after_reset:
            self.left[self.resetting] = len(self.restart)
        self.left[done] = 0
        self.resetting = done.copy()
        self.lives = lives.copy()


class RestartWrapper(gym.Wrapper):
    """One env playing its :class:`Restarts` as its next steps (above the frame skip, as ale-py's vector env plays
    them in herdrl: both give the same frames)."""

    def __init__(self, env: gym.Env, after_reset: bool, after_life_loss: bool) -> None:
        super().__init__(env)
        sticky = env.unwrapped.ale.getFloat("repeat_action_probability") > 0
        self.restart = Restarts(_single_restart_actions(env), 1, sticky, after_reset,
                                after_life_loss)

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        self.restart.reset({"lives": [info["lives"]]})
        return obs, info

    def step(self, action: Any) -> tuple[Any, ...]:
        action = int(self.restart.actions(np.array([action], dtype=np.int64))[0])
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.restart.observe(np.array([terminated]), np.array([truncated]), {"lives": [info["lives"]]})
        return obs, reward, terminated, truncated, info


def life_losses(lives: np.ndarray, previous: np.ndarray, done: np.ndarray) -> np.ndarray:
    """Envs that lost a life in this step without their game ending (episodic life ends their episode for
    learning only). A count that drops to 0 is not a loss (some games, Qbert, show 0 lives in between), as in
    SB3's EpisodicLifeEnv."""
    return (lives < previous) & (lives > 0) & ~done
