"""Tiny deterministic envs for tests."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Countdown(gym.Env):
    """obs = [steps taken in this episode]; reward 1 per step; ends after ``length`` steps.

    ``truncate=True`` ends episodes by truncation (a time limit), else by termination.
    """

    def __init__(self, config: dict | None = None) -> None:
        config = config or {}
        self.length = int(config.get("length", 3))
        self.truncate = bool(config.get("truncate", False))
        self.observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        obs = np.array([float(self.t)], np.float32)
        return obs, 1.0, done and not self.truncate, done and self.truncate, {}


class NaNEnv(Countdown):
    """Returns a NaN reward on its second step."""

    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        return obs, float("nan") if self.t == 2 else reward, term, trunc, info


class BadShapeEnv(Countdown):
    """Returns observations of the wrong shape."""

    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        return np.zeros(3, np.float32), reward, term, trunc, info


class RaisingEnv(Countdown):
    """Raises inside step()."""

    def step(self, action):
        raise RuntimeError("simulator crashed")


class TextObsEnv(Countdown):
    """An observation space herdrl does not support."""

    def __init__(self, config=None):
        super().__init__(config)
        self.observation_space = gym.spaces.Dict({"a": gym.spaces.Text(5)})


class DictCue(gym.Env):
    """Dict observation, nested: {"cue": Discrete(2), "signal": (Box sign in {-1, 1}, MultiBinary(3) noise)}.

    Reward 1 when the action equals cue XOR (sign > 0): a policy must read both leaves (each alone says
    nothing). 8 steps per episode: random play earns 4 on average, a perfect policy 8.
    """

    def __init__(self, config=None):
        self.observation_space = gym.spaces.Dict({
            "cue": gym.spaces.Discrete(2),
            "signal": gym.spaces.Tuple((gym.spaces.Box(-1, 1, (1,), np.float32), gym.spaces.MultiBinary(3)))})
        self.action_space = gym.spaces.Discrete(2)

    def _observe(self):
        self.cue, self.sign = int(self.np_random.integers(2)), float(self.np_random.choice([-1.0, 1.0]))
        return {"cue": self.cue, "signal": (np.array([self.sign], np.float32),
                                            self.np_random.integers(0, 2, 3).astype(np.int8))}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == (self.cue ^ int(self.sign > 0)))
        self.t += 1
        return self._observe(), reward, False, self.t >= 8, {}


class MovingDot(gym.Env):
    """A dot moves one pixel left or right between two 10 x 10 uint8 frames (HWC, 2 channels: before, after); the
    action says which way (reward 1 when right). Only a working image encoder can tell: every step shows a new
    dot at a random place. 10 steps per episode: random play earns 5, a perfect policy 10. ``{"chw": True}``:
    frames channels first, (2, 10, 10)."""

    def __init__(self, config=None):
        self.chw = bool((config or {}).get("chw", False))
        self.observation_space = gym.spaces.Box(0, 255, (2, 10, 10) if self.chw else (10, 10, 2), np.uint8)
        self.action_space = gym.spaces.Discrete(2)

    def _observe(self):
        self.direction = int(self.np_random.integers(2))
        row, col = self.np_random.integers(0, 10), self.np_random.integers(1, 9)
        frames = np.zeros((10, 10, 2), np.uint8)
        frames[row, col, 0] = 255
        frames[row, col + (1 if self.direction else -1), 1] = 255
        return np.ascontiguousarray(frames.transpose(2, 0, 1)) if self.chw else frames

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == self.direction)
        self.t += 1
        return self._observe(), reward, False, self.t >= 10, {}


class DictActionEnv(Countdown):
    """An action space herdrl does not support."""

    def __init__(self, config=None):
        super().__init__(config)
        self.action_space = gym.spaces.Dict({"a": gym.spaces.Discrete(2)})


class MatchTheCode(gym.Env):
    """Actions of any space, one step per episode: the observation is a random code (a float vector); reward 1 per
    action part that reproduces it. ``kind``: "multidiscrete" (code digits 0..2 at start 1), "multibinary" (bits),
    or "tuple" (Tuple(Discrete(3), MultiBinary(2), Box(-1, 1, (1,))): the Box part is rewarded by 1 - |a - x|)."""

    def __init__(self, config=None):
        self.kind = (config or {}).get("kind", "multidiscrete")
        self.observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
        self.action_space = {
            "multidiscrete": gym.spaces.MultiDiscrete([3, 3, 3], start=[1, 1, 1]),
            "multibinary": gym.spaces.MultiBinary(4),
            "tuple": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.MultiBinary(2),
                                       gym.spaces.Box(-1, 1, (1,), np.float32))),
        }[self.kind]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.code = self.np_random.integers(0, 3, 3) if self.kind == "multidiscrete" else \
            self.np_random.integers(0, 2, 4) if self.kind == "multibinary" else \
            np.array([self.np_random.integers(0, 3), *self.np_random.integers(0, 2, 2), self.np_random.uniform(-1, 1)])
        obs = np.zeros(4, np.float32)
        obs[: len(self.code)] = self.code if self.kind != "multidiscrete" else self.code - 1.0
        return obs, {}

    def step(self, action):
        if self.kind == "multidiscrete":
            reward = float((np.asarray(action) - 1 == self.code).sum())
        elif self.kind == "multibinary":
            reward = float((np.asarray(action) == self.code).sum())
        else:
            digit, bits, value = action
            reward = float(int(digit) == self.code[0]) + float((np.asarray(bits) == self.code[1:3]).sum()) \
                + 1.0 - abs(float(value[0]) - self.code[3])
        return np.zeros(4, np.float32), reward, True, False, {}


class RandomLength(gym.Env):
    """Episodes of random length (1-5 steps) with random rewards: exercises episode bookkeeping."""

    def __init__(self, config=None):
        self.observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left = int(self.np_random.integers(1, 6))
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.left -= 1
        end = self.left == 0
        truncated = end and bool(self.np_random.integers(2))
        return np.zeros(2, np.float32), float(self.np_random.random()), end and not truncated, truncated, {}


class SameStepVectorEnv(gym.vector.VectorEnv):
    """A third-party style vector env of Countdowns that resets *within* the step that ends an episode (the
    reset observation comes back at once) and, like many, says nothing about its autoreset mode."""

    def __init__(self, num_envs: int = 1, declare: str | None = None, **config) -> None:
        self.envs = [Countdown(config) for _ in range(num_envs)]
        self.num_envs = num_envs
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {} if declare is None else {"autoreset_mode": gym.vector.AutoresetMode[declare]}

    def reset(self, *, seed=None, options=None):
        return np.stack([env.reset()[0] for env in self.envs]), {}

    def step(self, actions):
        out = [env.step(a) for env, a in zip(self.envs, actions, strict=True)]
        obs = [env.reset()[0] if term or trunc else o for env, (o, _, term, trunc, _) in zip(self.envs, out,
                                                                                            strict=True)]
        return (np.stack(obs), np.array([r for _, r, *_ in out]), np.array([t for _, _, t, _, _ in out]),
                np.array([t for _, _, _, t, _ in out]), {})


class RecordingPendulum(gym.Wrapper):
    """Pendulum-v1 that appends every observation it returns (resets included) to a file of its own in
    ``config["log_dir"]``: the pooled observations a run's normalisation statistics must equal."""

    def __init__(self, config=None):
        import os
        import uuid

        super().__init__(gym.make("Pendulum-v1"))
        self.log = open(os.path.join(config["log_dir"], f"{os.getpid()}-{uuid.uuid4().hex}.txt"), "a")

    def _record(self, obs):
        self.log.write(" ".join(repr(float(x)) for x in obs) + "\n")
        self.log.flush()
        return obs

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._record(obs), info

    def step(self, action):
        obs, *rest = self.env.step(action)
        return (self._record(obs), *rest)


def recorded_observations(log_dir):
    """Every observation the RecordingPendulum copies in ``log_dir`` returned, as one array."""
    import glob

    return np.concatenate([np.loadtxt(f, ndmin=2) for f in sorted(glob.glob(f"{log_dir}/*.txt"))])
