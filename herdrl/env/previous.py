"""The previous action and reward as observation leaves (``model={"lstm_use_prev_action": True,
"lstm_use_prev_reward": True}``, RLlib's keys).

An env wrapped here observes ``{"obs": <the env's observation>, "prev_action": ..., "prev_reward": ...}`` (a Dict
observation keeps its own keys, and gains these): the action taken before this observation and the reward it
earned, zeros at an episode's first step. Since they arrive as observation leaves, every part of herdrl takes
them as it takes any observation: the encoder (one-hot for Discrete actions, as they are for Box actions), the
runners' storage, the learner's sequences, ``Policy``, evaluation and exported programs (one input each).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.errors import EnvError

PREV_ACTION, PREV_REWARD, OBS = "prev_action", "prev_reward", "obs"


def previous_inputs(model: dict) -> tuple[bool, bool]:
    """(previous action, previous reward) as a model config asks for them."""
    return bool(model.get("lstm_use_prev_action")), bool(model.get("lstm_use_prev_reward"))


def inputs_of(space: gym.Space) -> tuple[bool, bool]:
    """(previous action, previous reward) as a policy trained on ``space`` reads them."""
    keys = space.spaces if isinstance(space, gym.spaces.Dict) else {}
    return PREV_ACTION in keys, PREV_REWARD in keys


def _space(observation_space: gym.Space, action_space: gym.Space, inputs: tuple[bool, bool]) -> gym.spaces.Dict:
    own = dict(observation_space.spaces) if isinstance(observation_space, gym.spaces.Dict) else \
        {OBS: observation_space}
    clash = {PREV_ACTION, PREV_REWARD} & set(own)
    if clash:
        raise EnvError(f"the env's observation already has a '{sorted(clash)[0]}' key: lstm_use_prev_action/"
                       "lstm_use_prev_reward would hide it")
    if inputs[0]:
        own[PREV_ACTION] = action_space
    if inputs[1]:
        own[PREV_REWARD] = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    return gym.spaces.Dict(own)


def _with_previous(inputs: tuple[bool, bool], obs: Any, action: Any, reward: np.ndarray) -> dict[str, Any]:
    """The env's observation (a batch, or one) with the previous action and reward (float32, last axis of 1)."""
    out = dict(obs) if isinstance(obs, dict) else {OBS: obs}
    if inputs[0]:
        out[PREV_ACTION] = action
    if inputs[1]:
        out[PREV_REWARD] = np.asarray(reward, np.float32).reshape(*np.shape(reward), 1)
    return out


def _zero_actions(space: gym.Space, batch: int) -> Any:
    """No action yet: zeros (a Discrete space's first action)."""
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_zero_actions(part, batch) for part in space.spaces)
    start = space.start if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) else 0
    return np.full((batch, *space.shape), start, space.dtype)


def _where(done: np.ndarray, zero: Any, value: Any) -> Any:
    if isinstance(zero, tuple):
        return tuple(_where(done, z, v) for z, v in zip(zero, value, strict=True))
    value = np.asarray(value, zero.dtype)
    return np.where(done.reshape(-1, *[1] * (value.ndim - 1)), zero, value)


class PreviousInputs(gym.vector.VectorWrapper):
    """A vector env (NEXT_STEP autoreset) whose observations carry the previous action and reward. After an
    episode end, the reset-only step's observation begins an episode: zeros."""

    def __init__(self, env: gym.vector.VectorEnv, inputs: tuple[bool, bool]) -> None:
        super().__init__(env)
        self.inputs = inputs
        self.single_observation_space = _space(env.single_observation_space, env.single_action_space, inputs)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, env.num_envs)
        self._zeros = _zero_actions(env.single_action_space, env.num_envs)
        self._ended = np.zeros(env.num_envs, bool)

    def __getattr__(self, name: str) -> Any:
        """herdrl's flags on the env inside (``herd_clip_rewards``, ...) read through the wrapper."""
        if name.startswith("herd_"):
            return getattr(self.env, name)
        raise AttributeError(name)

    def reset(self, **kwargs: Any) -> tuple[dict[str, Any], dict]:
        """The first observations, with zeros for the previous action and reward."""
        obs, info = self.env.reset(**kwargs)
        self._ended[:] = False
        return _with_previous(self.inputs, obs, self._zeros, np.zeros(self.num_envs)), info

    def step(self, actions: Any) -> tuple[dict[str, Any], Any, Any, Any, dict]:
        """Step, then show each env the action it took and the reward it got (zeros where this step reset it)."""
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        reset = self._ended
        shown = _with_previous(self.inputs, obs, _where(reset, self._zeros, actions), np.where(reset, 0.0, rewards))
        self._ended = np.asarray(terminated) | np.asarray(truncated)
        return shown, rewards, terminated, truncated, info


class PreviousInputsSingle(gym.Wrapper):
    """One env (videos) with the previous action and reward in its observations."""

    def __init__(self, env: gym.Env, inputs: tuple[bool, bool]) -> None:
        super().__init__(env)
        self.inputs = inputs
        self.observation_space = _space(env.observation_space, env.action_space, inputs)

    def reset(self, **kwargs: Any) -> tuple[dict[str, Any], dict]:
        """The first observation, with zeros for the previous action and reward."""
        obs, info = self.env.reset(**kwargs)
        zero = _zero_actions(self.env.action_space, 1)
        zero = tuple(z[0] for z in zero) if isinstance(zero, tuple) else zero[0]
        return _with_previous(self.inputs, obs, zero, np.float32(0.0)), info

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict]:
        """Step, then show the action taken and the reward it got."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        return _with_previous(self.inputs, obs, action, np.float32(reward)), reward, terminated, truncated, info
