"""PettingZoo envs behind one interface: which agents decide now, what every agent was paid, who finished.

PettingZoo has two APIs. In a **Parallel** env every live agent acts at every step (MPE, butterfly); in an
**AEC** env agents take turns (the classic board games), and rewards reach an agent between its turns. The runner
(``herdrl.rollout.multi_agent``) sees both the same way, as :class:`AgentStep` s: the agents that must decide now
with their observations, the rewards each agent got since the last call, and the agents whose part in the
episode ended (with their final observation, which a truncated agent's value bootstraps from).

Envs are made by a creator given to ``herdrl.register_env`` (or passed as ``env=``) that returns a PettingZoo
``ParallelEnv`` or ``AECEnv``, or named:

* ``env="pettingzoo/classic/tictactoe-v3"``: an id of PettingZoo's registry (PettingZoo >= 1.27), made with
  ``pettingzoo.make`` as a Parallel env where it has one, else as an AEC env;
* ``env="mpe2.simple_spread_v3"`` or ``"pettingzoo.classic.tictactoe_v3"``: an env module (its ``parallel_env``
  if it has one, else its ``env``). Only modules under ``pettingzoo.`` and ``mpe2.`` are imported by name.

``env_config`` goes to the env as keyword arguments.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.env.imports import _MODULE_NAME
from herdrl.errors import EnvError
from herdrl.registry import ENV_CREATORS, EnvContext

#: Packages whose env modules may be named as an env id (``pettingzoo.classic.tictactoe_v3``).
PETTINGZOO_PACKAGES = ("pettingzoo.", "mpe2.")
#: The prefix of ids from PettingZoo's own registry (``pettingzoo/classic/tictactoe-v3``).
REGISTRY_PREFIX = "pettingzoo/"


def is_multi_agent_env(instance: Any) -> bool:
    """Whether ``instance`` is a PettingZoo env (Parallel or AEC), told by its API rather than its class."""
    return hasattr(instance, "possible_agents") and callable(getattr(instance, "observation_space", None))


def is_pettingzoo_id(env: Any) -> bool:
    """Whether ``env`` names a PettingZoo env: ``pettingzoo/<registry id>`` or a module (``mpe2.simple_tag_v3``)."""
    return isinstance(env, str) and env.startswith((REGISTRY_PREFIX, *PETTINGZOO_PACKAGES)) and ":" not in env


def create_env(env: Any, env_config: dict | None = None, worker_index: int = 0, vector_index: int = 0) -> Any:
    """The user's env object: a registered creator's, a callable's, or a PettingZoo module's."""
    env_config = dict(env_config or {})
    creator = env if callable(env) else ENV_CREATORS.get(env)
    if creator is not None:
        return creator(EnvContext(env_config, worker_index, vector_index))
    if not is_pettingzoo_id(env):
        return None
    if env.startswith(REGISTRY_PREFIX):
        return _from_registry(env[len(REGISTRY_PREFIX):], env_config)
    if not _MODULE_NAME.match(env):  # only a plain module path under the two packages is ever imported
        raise EnvError(f"env {env!r} names no valid module")
    try:
        module = importlib.import_module(env)
    except ImportError as exc:
        raise EnvError(f"cannot import PettingZoo env '{env}': {exc} (pip install 'herdrl[multiagent]')") from None
    make = getattr(module, "parallel_env", None) or getattr(module, "env", None)
    if make is None:
        raise EnvError(f"module '{env}' has no parallel_env() or env(): not a PettingZoo env module")
    try:
        return make(**env_config)
    except TypeError as exc:
        raise EnvError(f"env '{env}' does not take env_config {env_config}: {exc}") from None


def _from_registry(env_id: str, env_config: dict) -> Any:
    try:
        import pettingzoo
        from pettingzoo.env_registry import registration
    except ImportError:
        raise EnvError(f"env 'pettingzoo/{env_id}' needs PettingZoo >= 1.27 (pip install 'herdrl[multiagent]')") \
            from None
    kind = "parallel" if env_id in registration.parallel_registry else "aec"
    try:
        return pettingzoo.make(kind, env_id, **env_config)
    except Exception as exc:  # an unknown id lists the known ones
        raise EnvError(f"cannot make PettingZoo env '{env_id}': {str(exc).splitlines()[0]}") from None


@dataclass
class AgentStep:
    """What one env call produced, for every agent it concerns."""

    decide: dict[str, Any] = field(default_factory=dict)  # agent -> observation: these agents act next
    rewards: dict[str, float] = field(default_factory=dict)  # agent -> reward received since the last call
    ended: dict[str, tuple[bool, bool, Any]] = field(default_factory=dict)  # agent -> (terminated, truncated, obs)
    over: bool = False  # the episode is over: every agent ended (reset before the next step)
    infos: dict[str, Any] = field(default_factory=dict)  # agent -> the info dict the env gave it (callbacks read it)


class AgentEnv:
    """A PettingZoo env (Parallel or AEC) as :class:`AgentStep` s."""

    #: Whether to keep every agent's latest observation (a centralised critic's global state without ``state()``).
    track_observations = False

    def __init__(self, env: Any, name: str) -> None:
        self.env, self.name = env, name
        self.turns = _takes_turns(env)
        self.possible_agents: list[str] = list(env.possible_agents)
        if not self.possible_agents:
            raise EnvError(f"multi-agent env '{name}' has no possible_agents")
        self._latest: dict[str, np.ndarray] = {}  # agent -> its latest observation, flattened (when tracked)
        self._state_width: int | None = None  # the global state's width, once asked
        self._own_state = False  # whether the env answers state() itself

    def observation_space(self, agent: str) -> gym.Space:
        """The observation space of ``agent``."""
        return self.env.observation_space(agent)

    # ------------------------------------------------------------------ the global state (centralised critics)
    def global_state_space(self) -> gym.spaces.Box:
        """The space of :meth:`global_state` (call it once an episode has begun): the env's ``state()`` flattened
        (as wide as its first answer), else every possible agent's observation flattened and concatenated in
        ``possible_agents`` order (a Discrete leaf one-hot, a Dict's leaves in order: ``gymnasium.spaces.flatten``)."""
        if self._state_width is None:
            state = self._env_state()
            self._own_state = state is not None
            self._state_width = int(np.asarray(state).size) if self._own_state else sum(
                gym.spaces.flatdim(self.observation_space(agent)) for agent in self.possible_agents)
        return gym.spaces.Box(-np.inf, np.inf, (self._state_width,), np.float32)

    def global_state(self) -> np.ndarray:
        """The state a centralised critic sees now (see :meth:`global_state_space`), float32: an agent that has
        not yet observed anything in this episode counts as zeros; one that ended, as its last observation."""
        self.global_state_space()
        if self._own_state:
            state = np.asarray(self._env_state(), np.float32).reshape(-1)
            if state.size != self._state_width:
                raise EnvError(f"env '{self.name}' state() gave {state.size} numbers, earlier {self._state_width}")
            return state
        return np.concatenate([self._latest.get(agent, np.zeros(gym.spaces.flatdim(self.observation_space(agent)),
                                                                np.float32)) for agent in self.possible_agents])

    def _env_state(self) -> Any:
        """The env's own ``state()``, or None where it has none (PettingZoo's default raises)."""
        state = getattr(self.env, "state", None)
        if not callable(state):
            return None
        try:
            return state()
        except (NotImplementedError, AttributeError):
            return None

    def _observed(self, observations: dict[str, Any]) -> None:
        """Keep each agent's latest observation, flattened (the global state where the env has no ``state()``)."""
        for agent, obs in observations.items():
            if obs is not None:
                self._latest[agent] = gym.spaces.flatten(self.observation_space(agent), obs).astype(np.float32)

    def action_space(self, agent: str) -> gym.Space:
        """The action space of ``agent``."""
        return self.env.action_space(agent)

    def reset(self, seed: int | None = None) -> AgentStep:
        """Start an episode: the agents that act first."""
        self._latest = {}
        if self.turns:
            self.env.reset(seed=seed)
            return self._tracked(self._advance(AgentStep()))
        obs, infos = self.env.reset(seed=seed)
        return self._tracked(AgentStep(decide={agent: obs[agent] for agent in self.env.agents},
                                       infos=dict(infos or {})))

    def step(self, actions: dict[str, Any]) -> AgentStep:
        """Apply the deciding agents' actions; return who decides next, what each was paid, who ended."""
        return self._tracked(self._step(actions))

    def _tracked(self, result: AgentStep) -> AgentStep:
        """Keep the agents' latest observations (when tracked): those that ended or decide; in a turn-based
        game every live agent's as it is now (``observe``), not as it was at its own last turn."""
        if self.track_observations:
            self._observed({agent: obs for agent, (_, _, obs) in result.ended.items()})
            if self.turns and callable(getattr(self.env, "observe", None)):
                self._observed({agent: self.env.observe(agent) for agent in self.env.agents})
            self._observed(result.decide)
        return result

    def _step(self, actions: dict[str, Any]) -> AgentStep:
        if self.turns:
            (agent, action), = actions.items()
            self.env.step(action)
            return self._advance(AgentStep())
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        result = AgentStep(rewards={agent: float(r) for agent, r in rewards.items()}, infos=dict(infos or {}))
        for agent in set(terminations) | set(truncations):
            terminated, truncated = bool(terminations.get(agent, False)), bool(truncations.get(agent, False))
            if terminated or truncated:
                result.ended[agent] = (terminated, truncated, obs.get(agent))
        result.decide = {agent: obs[agent] for agent in self.env.agents if agent in obs and agent not in result.ended}
        result.over = not result.decide
        return result

    def _advance(self, result: AgentStep) -> AgentStep:
        """AEC: collect what the agents that are done get (stepping them out with ``None``), up to the next agent
        that acts, or the end of the episode. Rewards come from ``last()``: what the selected agent got since
        it last acted."""
        env = self.env
        while env.agents:
            agent = env.agent_selection
            obs, reward, terminated, truncated, info = env.last()
            result.rewards[agent] = result.rewards.get(agent, 0.0) + float(reward)
            result.infos[agent] = info
            if terminated or truncated:
                result.ended[agent] = (bool(terminated), bool(truncated), obs)
                env.step(None)
                continue
            result.decide = {agent: obs}
            return result
        result.over = True
        return result

    def close(self) -> None:
        """Close the env."""
        self.env.close()


def _takes_turns(env: Any) -> bool:
    """Whether ``env`` has the AEC API (agents act one at a time). PettingZoo's classes say it where they are
    there (a wrapped Parallel env may forward any attribute to an AEC env inside it); otherwise ``last()`` does."""
    try:
        from pettingzoo.utils.env import AECEnv, ParallelEnv
    except ImportError:
        AECEnv = ParallelEnv = ()  # noqa: N806
    if isinstance(env, ParallelEnv):
        return False
    return isinstance(env, AECEnv) or callable(getattr(env, "last", None))


def make_agent_env(env: Any, env_config: dict | None = None, worker_index: int = 0, vector_index: int = 0) -> AgentEnv:
    """An :class:`AgentEnv` for a multi-agent env reference (EnvError when it makes no PettingZoo env)."""
    instance = create_env(env, env_config, worker_index, vector_index)
    if instance is None or not is_multi_agent_env(instance):
        what = "nothing" if instance is None else type(instance).__name__
        raise EnvError(f"env '{getattr(env, '__name__', env)}' made {what}, not a PettingZoo env: multi-agent "
                       "training needs a ParallelEnv or AECEnv (register its creator with herdrl.register_env)")
    return AgentEnv(instance, str(getattr(env, "__name__", env)))
