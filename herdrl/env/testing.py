"""Envs for benchmarks and tests, registered with Gymnasium on ``import herdrl.env``.

* ``herd/Latency-v0`` (:class:`LatencyEnv`): each step *sleeps* ``step_latency_s``, like a simulator
  waiting on I/O or another process. Sampling it is latency-bound, so runners scale on a small machine.
* ``herd/Faulty-v0`` (:class:`FaultyEnv`): raises on its Nth step, to exercise runner fault tolerance.
* ``herd/StatelessCartPole-v1`` (:func:`stateless_cartpole`): CartPole-v1 that shows positions only (cart
  position, pole angle), no velocities — RLlib's StatelessCartPole: a policy needs memory to balance it.
* ``herd/Recall-v0`` (:class:`RecallEnv`): remember a cue shown at the first step and name it at the last.
* ``herd/Bandit-v0`` (:class:`BanditEnv`): a two-armed bandit whose paying arm changes every episode; only the
  previous action and reward tell which it is (``lstm_use_prev_action``/``lstm_use_prev_reward``).
* :class:`CueRelay` (multi-agent, PettingZoo's Parallel API, no PettingZoo needed): two agents read cues, one of
  them joins late and leaves early.
* :class:`TwoStepGame` (multi-agent, Parallel API): the QMIX paper's two-step cooperative matrix game.
"""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
import numpy as np


class LatencyEnv(gym.Env):
    """A CartPole-sized env whose step costs ``step_latency_s`` of wall-clock time, not CPU.

    ``env_config``: ``step_latency_s`` (default 0.002), ``episode_len`` (default 200), ``obs_size`` (default 4:
    larger observations make larger fragments, for transport tests and benchmarks), ``pixels`` (default False;
    True: Pong-shaped observations, uint8 84x84x4 frames, so a CNN policy and image-sized fragments are what a
    runner carries). Reward 1 per step for action 1, 0 for action 0, so a policy can learn something.
    """

    metadata: dict = {"render_modes": []}

    def __init__(self, step_latency_s: float = 0.002, episode_len: int = 200, obs_size: int = 4,
                 pixels: bool = False) -> None:
        if step_latency_s < 0 or episode_len < 1 or obs_size < 1 or not isinstance(pixels, bool):
            raise ValueError("LatencyEnv needs step_latency_s >= 0, episode_len >= 1, obs_size >= 1 and pixels "
                             "true or false")
        self.step_latency_s = float(step_latency_s)
        self.episode_len = int(episode_len)
        self.obs_size = int(obs_size)
        self.pixels = pixels
        self.observation_space = (gym.spaces.Box(0, 255, (84, 84, 4), np.uint8) if pixels
                                  else gym.spaces.Box(-1.0, 1.0, (self.obs_size,), np.float32))
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def _observation(self) -> np.ndarray:
        if self.pixels:
            return self.np_random.integers(0, 256, (84, 84, 4), dtype=np.uint8)
        return self.np_random.uniform(-1, 1, self.obs_size).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start an episode with a random observation."""
        super().reset(seed=seed)
        self._t = 0
        return self._observation(), {}

    def step(self, action):
        """Sleep for the step latency, then return a random observation and reward ``action``."""
        if self.step_latency_s:
            time.sleep(self.step_latency_s)
        self._t += 1
        return self._observation(), float(action), False, self._t >= self.episode_len, {}


class FaultyEnv(LatencyEnv):
    """Raises ``RuntimeError`` on step ``fail_at_step`` (counted over the env's lifetime).

    With ``fail_once_file``, only the first env to get there fails (it creates the file); the rest and
    any restarted runners run normally — so a test sees exactly one failure.
    """

    def __init__(self, fail_at_step: int = 100, fail_once_file: str | None = None,
                 hang_on_reset_file: str | None = None, **kwargs) -> None:
        kwargs.setdefault("step_latency_s", 0.0)
        super().__init__(**kwargs)
        self.fail_at_step = int(fail_at_step)
        self.fail_once_file = fail_once_file
        self.hang_on_reset_file = hang_on_reset_file
        self._lifetime_steps = 0

    def reset(self, *, seed=None, options=None):
        """Reset as LatencyEnv; with ``hang_on_reset_file``, once that file exists, the first env to reset hangs
        for an hour (it claims ``<file>.claimed``): an env stuck where the runner cannot answer."""
        if self.hang_on_reset_file and os.path.exists(self.hang_on_reset_file):
            try:
                os.close(os.open(f"{self.hang_on_reset_file}.claimed", os.O_CREAT | os.O_EXCL))
                time.sleep(3600)
            except FileExistsError:
                pass
        return super().reset(seed=seed, options=options)

    def step(self, action):
        """Fail on the configured step, else step as LatencyEnv."""
        self._lifetime_steps += 1
        if self._lifetime_steps == self.fail_at_step and self._claim_failure():
            raise RuntimeError(f"FaultyEnv: injected failure at step {self.fail_at_step} (pid {os.getpid()})")
        return super().step(action)

    def _claim_failure(self) -> bool:
        if self.fail_once_file is None:
            return True
        try:
            os.close(os.open(self.fail_once_file, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False


class StatelessObservation(gym.ObservationWrapper):
    """Keep CartPole's positions (cart position, pole angle); drop the velocities."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        low, high = env.observation_space.low[[0, 2]], env.observation_space.high[[0, 2]]
        self.observation_space = gym.spaces.Box(low, high, (2,), np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """Positions only."""
        return observation[[0, 2]]


def stateless_cartpole(**kwargs) -> gym.Env:
    """CartPole-v1 (500 steps) observed without velocities."""
    return StatelessObservation(gym.make("CartPole-v1", **kwargs))


class RecallEnv(gym.Env):
    """A cue (one of ``num_cues``, one-hot) is shown at the first step, then ``delay`` blank steps; at the last
    step the action must name the cue: reward 1 if it does, else 0. Without memory the best is 1 / num_cues."""

    metadata: dict = {"render_modes": []}

    def __init__(self, num_cues: int = 2, delay: int = 5) -> None:
        if num_cues < 2 or delay < 0:
            raise ValueError("RecallEnv needs num_cues >= 2 and delay >= 0")
        self.num_cues, self.delay = int(num_cues), int(delay)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (num_cues + 1,), np.float32)  # cue one-hot, "answer now"
        self.action_space = gym.spaces.Discrete(num_cues)

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.num_cues + 1, np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
        if self._t == self.delay + 1:
            obs[-1] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """A new cue."""
        super().reset(seed=seed)
        self._t, self._cue = 0, int(self.np_random.integers(self.num_cues))
        return self._obs(), {}

    def step(self, action):
        """Blank steps score nothing; the answer step scores 1 for the cue."""
        answering = self._t == self.delay + 1
        reward = float(int(action) == self._cue) if answering else 0.0
        self._t += 1
        return self._obs(), reward, answering, False, {}


class BanditEnv(gym.Env):
    """``steps`` pulls of two arms, one of which (drawn per episode) pays 1; the observation is always the same.
    A policy that remembers what its pulls earned finds the arm and keeps pulling it (return about ``steps -
    0.5``); one that cannot averages ``steps / 2``."""

    metadata: dict = {"render_modes": []}

    def __init__(self, steps: int = 10) -> None:
        self.steps = int(steps)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """A new paying arm."""
        super().reset(seed=seed)
        self._t, self._arm = 0, int(self.np_random.integers(2))
        return np.ones(1, np.float32), {}

    def step(self, action):
        """1 for the paying arm."""
        self._t += 1
        return np.ones(1, np.float32), float(int(action) == self._arm), False, self._t >= self.steps, {}


class CueRelay:
    """Two agents, PettingZoo's Parallel API. Each step each live agent sees a cue in {-1, 1} and its own id bit,
    and earns 1 for naming the cue's side — ``a0`` the side it shows, ``a1`` the other one.

    ``a0`` plays steps 0-7 (then truncated); ``a1`` joins at step 2 and leaves after step 4 (terminated). Best
    return 11 (8 + 3), random 5.5. One policy shared by both must read the id bit; separate policies need not.

    ``env_config={"continuous": True}``: the action is a number in [-1, 1] (Box(1)), paid ``1 - |action -
    side| / 2`` with ``side`` +1 or -1 (the side to name): best 11 again, uniform random actions 5.5.

    ``env_config={"recall": True}``: each agent's cue is drawn once, at its first step, and shown only then (0
    after): a policy must remember it (an LSTM: best 11; without memory, right at first sight and at chance after:
    6.5).

    ``env_config={"together": True}``: both agents play steps 0-7 (a team: value decomposition); with ``recall``,
    each agent's team reward (the mean) is best 8 with memory, 4.5 without.
    """

    metadata: dict = {"name": "cue_relay", "render_modes": []}
    possible_agents = ["a0", "a1"]
    EPISODE_LEN, JOIN, LEAVE = 8, 2, 4

    def __init__(self, env_config: dict | None = None) -> None:
        self._obs_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.continuous = bool((env_config or {}).get("continuous", False))
        self.recall = bool((env_config or {}).get("recall", False))
        self.together = bool((env_config or {}).get("together", False))
        self._act_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if self.continuous else gym.spaces.Discrete(2)
        self.agents: list[str] = []
        self._rng = np.random.default_rng()

    def observation_space(self, agent: str) -> gym.Space:
        """Box(2): (cue, id bit)."""
        return self._obs_space

    def action_space(self, agent: str) -> gym.Space:
        """Discrete(2): 1 names a positive cue (for a0; a negative one for a1); Box(1) when continuous."""
        return self._act_space

    def _observe(self) -> dict[str, np.ndarray]:
        if not self.recall:
            self._cues = {agent: float(self._rng.choice([-1.0, 1.0])) for agent in self.agents}
            return {agent: np.array([self._cues[agent], float(agent == "a1")], np.float32) for agent in self.agents}
        new = [agent for agent in self.agents if agent not in self._cues]  # shown once, kept for the episode
        self._cues.update({agent: float(self._rng.choice([-1.0, 1.0])) for agent in new})
        return {agent: np.array([self._cues[agent] if agent in new else 0.0, float(agent == "a1")], np.float32)
                for agent in self.agents}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Start with ``a0`` alone (both, ``together``)."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.t, self.agents, self._cues = 0, ["a0", "a1"] if self.together else ["a0"], {}
        return self._observe(), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Pay each agent, then let ``a1`` join or leave and ``a0`` run out of time."""
        rewards = {agent: self._paid(agent, actions[agent]) for agent in self.agents}
        terminated = {agent: False for agent in self.agents}
        truncated = {agent: False for agent in self.agents}
        self.t += 1
        if "a1" in self.agents and self.t > self.LEAVE and not self.together:
            terminated["a1"] = True
        if self.t >= self.EPISODE_LEN:
            truncated.update(dict.fromkeys(self.agents, True))
        ended = [agent for agent in self.agents if terminated[agent] or truncated[agent]]
        joins = self.t == self.JOIN and not self.together
        self.agents = [agent for agent in self.agents if agent not in ended] + (["a1"] if joins else [])
        obs = self._observe()
        for agent in ended:  # a final observation: no cue left to read
            obs[agent] = np.array([0.0, float(agent == "a1")], np.float32)
        return obs, rewards, terminated, truncated, {agent: {} for agent in obs}

    def _paid(self, agent: str, action: Any) -> float:
        positive = (self._cues[agent] > 0) == (agent == "a0")  # whether the side to name is +1
        if self.continuous:
            return float(1.0 - abs(float(np.asarray(action).reshape(-1)[0]) - (1.0 if positive else -1.0)) / 2)
        return float((int(action) == 1) == positive)

    def close(self) -> None:
        """Nothing to release."""


class TwoStepGame:
    """The two-step cooperative matrix game of the QMIX paper (Rashid et al. 2018, section 6.1), PettingZoo's
    Parallel API. Two agents; at the first step ``a0``'s action picks the second step's game (0: 2A, 1: 2B; ``a1``'s
    action does not matter); at the second both are paid the joint payoff: 7 whatever they do in 2A, and in 2B
    ``[[0, 1], [1, 8]]`` (row: ``a0``'s action). The best team return is 8; value decomposition that sums the agents'
    values (VDN) settles for 7 when it learns under uniform exploration, QMIX finds 8. Each agent observes the state
    one-hot (first step, 2A, 2B), which is also ``state()``."""

    metadata: dict = {"name": "two_step", "render_modes": []}
    possible_agents = ["a0", "a1"]
    PAYOFF_2B = np.array([[0.0, 1.0], [1.0, 8.0]], np.float32)

    def __init__(self, env_config: dict | None = None) -> None:
        self._obs_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self._act_space = gym.spaces.Discrete(2)
        self.agents: list[str] = []
        self._state = 0

    def observation_space(self, agent: str) -> gym.Space:
        """Box(3): the state one-hot."""
        return self._obs_space

    def action_space(self, agent: str) -> gym.Space:
        """Discrete(2)."""
        return self._act_space

    def state(self) -> np.ndarray:
        """The state one-hot (first step, 2A, 2B)."""
        return np.eye(3, dtype=np.float32)[self._state]

    def _observe(self) -> dict[str, np.ndarray]:
        return {agent: self.state() for agent in self.agents}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """The first step."""
        self.agents, self._state = list(self.possible_agents), 0
        return self._observe(), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """First step: ``a0`` picks the game (no reward). Second: the payoff, and the episode ends."""
        if self._state == 0:
            self._state = 1 + int(actions["a0"])
            return self._observe(), dict.fromkeys(self.agents, 0.0), dict.fromkeys(self.agents, False), \
                dict.fromkeys(self.agents, False), {agent: {} for agent in self.agents}
        payoff = 7.0 if self._state == 1 else float(self.PAYOFF_2B[int(actions["a0"]), int(actions["a1"])])
        obs, agents = self._observe(), self.agents
        self.agents = []
        return obs, dict.fromkeys(agents, payoff), dict.fromkeys(agents, True), dict.fromkeys(agents, False), \
            {agent: {} for agent in agents}

    def close(self) -> None:
        """Nothing to release."""


def register() -> None:
    """Register the testing envs with Gymnasium (idempotent)."""
    for env_id, entry_point, kwargs in (("herd/Latency-v0", "herdrl.env.testing:LatencyEnv", {}),
                                        ("herd/Faulty-v0", "herdrl.env.testing:FaultyEnv", {}),
                                        ("herd/StatelessCartPole-v1", "herdrl.env.testing:stateless_cartpole",
                                         {"reward_threshold": 475.0}),
                                        ("herd/Recall-v0", "herdrl.env.testing:RecallEnv", {"reward_threshold": 0.95}),
                                        ("herd/Bandit-v0", "herdrl.env.testing:BanditEnv", {"reward_threshold": 9.0})):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, **kwargs)
