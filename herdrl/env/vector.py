"""Build Gymnasium vector envs the way runners need them.

Runners always see NEXT_STEP autoreset (Gymnasium 1.x's default): the step
that ends an episode returns that episode's final observation, and the next
step only resets (its action is ignored, its reward is 0). The runner masks
that reset-only step out of the batch and bootstraps truncated episodes from
the final observation. We ask for this mode explicitly and refuse any other,
so the data a learner gets never depends on an env's default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from herdrl.env import atari, imports
from herdrl.env.imports import TEAM_PREFIX
from herdrl.env.multi_agent import is_pettingzoo_id
from herdrl.errors import EnvError, did_you_mean
from herdrl.registry import ENV_CREATORS, EnvContext

EnvRef = str | Callable[[dict], gym.Env]


def _plain_gymnasium_warnings() -> None:
    """Gymnasium colours its warnings with ANSI codes; in a log file (no terminal) they are noise."""
    import sys

    from gymnasium import logger as gym_logger

    stderr = sys.stderr
    terminal = stderr is not None and hasattr(stderr, "isatty") and stderr.isatty()
    if not terminal and hasattr(gym_logger, "colorize"):
        gym_logger.colorize = lambda text, *args, **kwargs: text


_plain_gymnasium_warnings()


def _creator(env: EnvRef, env_config: dict, worker_index: int = 0) -> Callable[[int], gym.Env] | None:
    """A factory of copy ``vector_index`` for a registered name or callable env, or for ``team:<PettingZoo env>``
    (its agents as one team: ``herdrl.env.team``); None for a Gymnasium id."""
    if isinstance(env, str) and env.startswith(TEAM_PREFIX):
        from herdrl.env.multi_agent import make_agent_env
        from herdrl.env.team import TeamEnv

        inner = env[len(TEAM_PREFIX):]
        return lambda vector_index=0: TeamEnv(make_agent_env(inner, env_config, worker_index, vector_index))
    creator = env if callable(env) else ENV_CREATORS.get(env)
    if creator is None:
        return None
    return lambda vector_index=0: creator(EnvContext(env_config, worker_index, vector_index))


def _gym_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    if ":" in env_id:  # "module:Env-v0", as gymnasium.make takes it: import the module, which registers the env
        name = imports.import_for_env_id(env_id)
        if name not in gym.registry:
            raise EnvError(f"cannot make env '{env_id}': importing '{env_id.partition(':')[0]}' registered no env "
                           f"'{name}'")
        env_id = name
    if env_id not in gym.registry:
        imports.import_known_package(env_id)  # ALE/... -> ale_py
        ram = atari.ram_spec(env_id)
        if ram is not None:
            return ram
    if env_id in gym.registry:
        try:
            return gym.spec(env_id)
        except gym.error.Error as exc:
            raise EnvError(f"cannot make env '{env_id}': {exc}") from None
    hint = did_you_mean(env_id, list(gym.registry) + list(ENV_CREATORS))
    raise EnvError(f"unknown env '{env_id}'{hint}: use a Gymnasium id, MODULE:ID (imports MODULE), --import MODULE "
                   f"for a module that registers it, or herdrl.register_env('{env_id}', creator)")


def make_single_env(env: EnvRef, env_config: dict | None = None, previous: tuple[bool, bool] = (False, False),
                    **make_kwargs: Any) -> gym.Env:
    """One (non-vector) env, e.g. for evaluation or rendering (``previous``: see :func:`make_vector_env`)."""
    if any(previous):
        from herdrl.env.previous import PreviousInputsSingle

        return PreviousInputsSingle(make_single_env(env, env_config, **make_kwargs), previous)
    env_config = dict(env_config or {})
    factory = _creator(env, env_config)
    if factory is not None:
        return _checked(factory(), env)
    spec = _gym_spec(env)
    if atari.is_atari(spec):
        return atari.make_single(spec, env_config, **make_kwargs)
    return gym.make(spec, **env_config, **make_kwargs)


def _checked(instance: Any, env: EnvRef) -> gym.Env:
    if not isinstance(instance, gym.Env):
        raise EnvError(f"the creator of env '{env}' returned {type(instance).__name__}, not a gymnasium.Env")
    return instance


class LeanSyncVectorEnv(gym.vector.SyncVectorEnv):
    """Gymnasium's ``SyncVectorEnv`` in NEXT_STEP autoreset mode, with a step that costs less per env step: for a
    Box observation and Discrete or Box actions, actions are indexed and observations stacked directly (no generic
    per-space dispatch), infos merged only when an env gives some, and the batched observation returned as the
    array the next step overwrites (its user copies it at once: herdrl's runners write each step into their
    fragment). Everything else (reset, spaces, infos' layout) is ``SyncVectorEnv``'s.

    A sleeping env's step wakes a cold CPU: the runner's own per-step work, measured at 26 us warm, is most of what
    a runner of a slow simulator spends (benchmarks/results/scaling.md, issue 30); the generic step was a third of
    it."""

    @staticmethod
    def fits(venv: gym.vector.VectorEnv) -> bool:
        """Whether ``venv`` is a plain NEXT_STEP ``SyncVectorEnv`` of the spaces this step takes."""
        return (type(venv) is gym.vector.SyncVectorEnv and venv.autoreset_mode == AutoresetMode.NEXT_STEP
                and isinstance(venv.single_observation_space, gym.spaces.Box)
                and isinstance(venv.single_action_space, (gym.spaces.Discrete, gym.spaces.Box))
                and all(hasattr(venv, name) for name in ("_env_obs", "_observations", "_autoreset_envs")))

    @classmethod
    def adopt(cls, venv: gym.vector.SyncVectorEnv) -> LeanSyncVectorEnv:
        """``venv`` (see :meth:`fits`) itself, stepping this way from now on: same envs, buffers and state (its
        ``copy`` setting no longer applies to steps: they return the buffer)."""
        venv.__class__ = cls
        return venv  # type: ignore[return-value]

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env (an env whose episode ended last step is reset instead: reward 0, no end)."""
        if len(actions) != self.num_envs:
            raise ValueError(f"{len(actions)} actions for {self.num_envs} envs")
        infos: dict[str, Any] = {}
        for i, env in enumerate(self.envs):
            if self._autoreset_envs[i]:
                self._env_obs[i], info = env.reset()
                self._rewards[i], self._terminations[i], self._truncations[i] = 0.0, False, False
            else:
                (self._env_obs[i], self._rewards[i], self._terminations[i], self._truncations[i],
                 info) = env.step(actions[i])
            if info:
                infos = self._add_info(infos, info, i)
        for row, obs in zip(self._observations, self._env_obs, strict=True):  # (cheaper than np.stack's dispatch)
            if np.shape(obs) != row.shape:
                raise ValueError(f"an env's observation has shape {np.shape(obs)}, its space {row.shape}")
            np.copyto(row, obs, casting="same_kind")
        np.logical_or(self._terminations, self._truncations, out=self._autoreset_envs)
        return self._observations, self._rewards.copy(), self._terminations.copy(), self._truncations.copy(), infos


def make_vector_env(env: EnvRef, env_config: dict | None = None, num_envs: int = 1,
                    mode: str = "auto", worker_index: int = 0,
                    previous: tuple[bool, bool] = (False, False)) -> gym.vector.VectorEnv:
    """A vector env of ``num_envs`` copies in NEXT_STEP autoreset mode.

    ``mode``: ``auto`` (the env's own numpy-vectorised implementation where it has one,
    else ``sync``), ``vector_entry_point``, ``sync`` or ``async`` (one sub-process per copy). ``previous``: add the
    previous action and/or reward to the observations (``herdrl.env.previous``).
    """
    env_config = dict(env_config or {})
    vector_kwargs = {"autoreset_mode": AutoresetMode.NEXT_STEP}
    factory = _creator(env, env_config, worker_index)
    if factory is not None:
        if mode == "vector_entry_point":
            raise EnvError(f"env '{env}' is a registered creator: it has no vector entry point; "
                           "use gym_env_vectorize_mode='sync' or 'async'")
        fns = [lambda i=i: _checked(factory(i), env) for i in range(num_envs)]
        cls = gym.vector.AsyncVectorEnv if mode == "async" else gym.vector.SyncVectorEnv
        venv = cls(fns, **vector_kwargs)
    elif atari.is_atari(spec := _gym_spec(env)):
        venv = atari.make_vector(spec, env_config, num_envs, mode)
    else:
        if mode == "auto":
            mode = "vector_entry_point" if spec.vector_entry_point else "sync"
        if mode == "vector_entry_point":
            if not spec.vector_entry_point:
                raise EnvError(f"env '{env}' has no vector entry point; use gym_env_vectorize_mode='sync'")
            vector_kwargs = {}
        try:
            venv = gym.make_vec(spec, num_envs=num_envs, vectorization_mode=mode,
                                vector_kwargs=vector_kwargs, **env_config)
        except TypeError as exc:  # an env_config key the env does not take
            raise EnvError(f"cannot make env '{env}' with env_config {env_config}: {exc}") from None
    # Never assume the mode: an env that resets within the step would lose each episode's first step and
    # bootstrap from a reset observation, silently.
    autoreset = venv.metadata.get("autoreset_mode")
    try:
        known = AutoresetMode(autoreset) if autoreset is not None else None
    except ValueError:
        known = None
    if known != AutoresetMode.NEXT_STEP:
        venv.close()
        declared = "does not declare its autoreset mode" if autoreset is None else f"has autoreset mode {autoreset}"
        raise EnvError(f"env '{env}': its vector env {declared}; herdrl needs NEXT_STEP (the step after an episode "
                       "end only resets): set metadata['autoreset_mode'] = AutoresetMode.NEXT_STEP in a vector env "
                       "that does so, or use gym_env_vectorize_mode='sync'")
    check_spaces(venv.single_observation_space, venv.single_action_space, env)
    if LeanSyncVectorEnv.fits(venv):
        venv = LeanSyncVectorEnv.adopt(venv)
    if any(previous):
        from herdrl.env.previous import PreviousInputs

        venv = PreviousInputs(venv, previous)
    return venv


def env_reward_threshold(env: EnvRef) -> float | None:
    """The env spec's ``reward_threshold`` ("solved"), or None if it has none (PettingZoo envs have none)."""
    if callable(env) or env in ENV_CREATORS or is_pettingzoo_id(env) or env.startswith(TEAM_PREFIX):
        return None
    return _gym_spec(env).reward_threshold


def check_spaces(obs_space: gym.Space, action_space: gym.Space, env: EnvRef = "env") -> None:
    """Raise EnvError unless the spaces are ones herdrl's models handle (the algorithm checks its own actions)."""
    from herdrl.obs import leaf_spaces

    try:
        leaf_spaces(obs_space)
    except TypeError as exc:
        raise EnvError(f"env '{env}' has observation space {obs_space}, whose {exc} herdrl cannot encode; herdrl "
                       "takes Box, Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of them") from None
    from herdrl.models.action_layout import ActionLayout

    try:
        ActionLayout(action_space)
    except TypeError as exc:
        raise EnvError(f"env '{env}' has action space {action_space}, whose {exc} herdrl cannot act in; herdrl "
                       "takes Discrete, Box (float), MultiDiscrete, MultiBinary and Tuple of them") from None
