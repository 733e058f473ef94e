"""A cooperative PettingZoo env as one Gymnasium env: the team is the agent (value decomposition: QMIX, VDN).

Every agent of the team acts at every step (a Parallel env whose agents all live until the episode ends, or whose
ended agents keep being fed a zero observation with no action allowed but 0: see below). The team's observation
is a Dict:

* ``obs``: ``(N, D)`` float32, each agent's observation flattened (``gymnasium.spaces.flatten``; an ``action_mask``
  leaf is taken out of it), in ``possible_agents`` order;
* ``state``: the global state (the env's ``state()``, else every agent's latest observation: as a centralised
  critic sees it, :meth:`herdrl.env.multi_agent.AgentEnv.global_state`);
* ``action_mask``: ``(N, A)`` int8, the actions each agent may take (all, where the env gives no masks).

The action is ``MultiDiscrete([A] * N)``, the reward the mean of the agents' rewards (a shared team reward is
itself), and the episode ends when the env's does: terminated if every agent that ends at that step says it
terminated, else truncated (bootstrapped from the final observations: an agent the env drops without saying it
ended keeps its last one). An agent that ended before the others observes zeros, may take action 0 only, and its
actions are not sent to the env.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.env.multi_agent import AgentEnv
from herdrl.errors import EnvError

MASK = "action_mask"


class TeamEnv(gym.Env):
    """``agent_env``'s agents as one team (see the module doc)."""

    metadata: dict = {"render_modes": []}

    def __init__(self, agent_env: AgentEnv) -> None:
        self.agent_env = agent_env
        name = agent_env.name
        if agent_env.turns:
            raise EnvError(f"env '{name}' takes turns: a team acts at every step (value decomposition needs a "
                           "Parallel env whose agents all act together)")
        self.agents = list(agent_env.possible_agents)
        spaces = [agent_env.action_space(agent) for agent in self.agents]
        if not all(isinstance(s, gym.spaces.Discrete) for s in spaces) or len({s.n for s in spaces}) != 1:
            raise EnvError(f"env '{name}': every agent of a team needs the same Discrete action space, not {spaces}")
        self.actions, self._starts = spaces[0].n, [int(s.start) for s in spaces]
        self._own = [self._own_space(agent_env.observation_space(agent)) for agent in self.agents]
        widths = {gym.spaces.flatdim(space) for space in self._own}
        if len(widths) != 1:
            raise EnvError(f"env '{name}': every agent of a team needs observations of one size, not {widths}")
        agent_env.track_observations = True
        agent_env.reset()  # the global state's width is known once an episode has begun
        state_space = agent_env.global_state_space()
        n, width = len(self.agents), widths.pop()
        self.observation_space = gym.spaces.Dict({
            "obs": gym.spaces.Box(-np.inf, np.inf, (n, width), np.float32),
            "state": state_space,
            MASK: gym.spaces.Box(0, 1, (n, self.actions), np.int8)})
        self.action_space = gym.spaces.MultiDiscrete([self.actions] * n)
        self._live: set[str] = set()  # agents that decided at the last step
        self._last: dict[str, Any] = {}  # each agent's latest observation

    @staticmethod
    def _own_space(space: gym.Space) -> gym.Space:
        """An agent's observation space without its action mask."""
        if isinstance(space, gym.spaces.Dict) and MASK in space.spaces:
            rest = {key: sub for key, sub in space.spaces.items() if key != MASK}
            return rest["observation"] if list(rest) == ["observation"] else gym.spaces.Dict(rest)
        return space

    def _team_obs(self, decide: dict[str, Any]) -> dict[str, np.ndarray]:
        n, width = self.observation_space["obs"].shape
        obs = np.zeros((n, width), np.float32)
        mask = np.zeros((n, self.actions), np.int8)
        mask[:, 0] = 1  # an agent that does not decide (it ended) may take 0 only, which is not sent
        for i, agent in enumerate(self.agents):
            if agent not in decide:
                continue
            raw = decide[agent]
            own = raw
            if isinstance(raw, dict) and MASK in raw:
                mask[i] = np.asarray(raw[MASK], np.int8)
                own = {key: value for key, value in raw.items() if key != MASK}
                own = own["observation"] if list(own) == ["observation"] else own
            else:
                mask[i] = 1
            obs[i] = gym.spaces.flatten(self._own[i], own)
        return {"obs": obs, "state": self.agent_env.global_state(), MASK: mask}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """A new episode: every agent must decide at its first step."""
        super().reset(seed=seed)
        step = self.agent_env.reset(seed=seed)
        missing = [agent for agent in self.agents if agent not in step.decide]
        if missing:
            raise EnvError(f"env '{self.agent_env.name}': agents {missing} do not act at the first step (a team "
                           "acts together from its first step)")
        self._live, self._last = set(step.decide), dict(step.decide)
        return self._team_obs(step.decide), {}

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        """Every live agent's action; the team's mean reward."""
        actions = {agent: int(action[i]) + self._starts[i] for i, agent in enumerate(self.agents)
                   if agent in self._live}
        step = self.agent_env.step(actions)
        reward = float(np.mean([step.rewards.get(agent, 0.0) for agent in self.agents]))
        if step.over:  # the final observations (what a truncated episode bootstraps from)
            ending = [step.ended.get(agent, (False, True, None)) for agent in self._live]  # dropped: cut off
            terminated = bool(ending) and all(term and not trunc for term, trunc, _ in ending)
            final = {agent: self._last[agent] for agent in self._live}
            final.update({agent: obs for agent, (_, _, obs) in step.ended.items() if obs is not None})
            return self._team_obs(final), reward, terminated, not terminated, {}
        self._live = set(step.decide)
        self._last.update(step.decide)
        return self._team_obs(step.decide), reward, False, False, {}

    def close(self) -> None:
        """Close the PettingZoo env."""
        self.agent_env.close()
