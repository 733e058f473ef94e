"""Episodes as callbacks see them: :class:`Episode` (one env copy's, single-agent) and
:class:`MultiAgentEpisode`, with RLlib's calls of both stacks, and the trackers that feed them step by step to the
episode hooks inside a runner."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from herdrl.errors import CallbackError
from herdrl.metrics_logger import MetricsLogger, push_custom_metrics


def _pick(items: list[Any], indices: int | slice | list[int] | None, stack: bool) -> Any:
    if isinstance(indices, (int, np.integer)):
        return items[indices]
    chosen = items if indices is None else items[indices] if isinstance(indices, slice) else [items[i]
                                                                                              for i in indices]
    if stack and chosen and not isinstance(chosen[0], dict):
        return np.asarray(chosen)
    return list(chosen)


class Episode:
    """One env copy's episode as callbacks see it: RLlib's ``SingleAgentEpisode`` calls (``len(episode)``,
    ``get_return()``, ``get_observations(-1)``, ``get_infos()``, ``custom_data``) and the old stack's ``Episode``
    ones (``length``, ``total_reward``, ``last_info_for()``, ``custom_metrics``, ``user_data``).

    It holds every observation, action, reward and info of the episode (raw, as the env gave them), one more
    observation and info than steps (the reset's).
    """

    def __init__(self, env_index: int) -> None:
        self.id_ = uuid.uuid4().hex
        self.env_index = env_index
        self._observations: list[Any] = []
        self._infos: list[dict] = []
        self._actions: list[Any] = []
        self._rewards: list[float] = []
        self.is_terminated = False
        self.is_truncated = False
        self.custom_data: dict[str, Any] = {}  # RLlib's new stack
        self.custom_metrics: dict[str, float] = {}  # RLlib's old stack: reduced at the episode's end
        self.user_data: dict[str, Any] = {}
        self.hist_data: dict[str, list[float]] = {}  # accepted; not reported

    def begin(self, observation: Any, info: dict) -> None:
        """The reset's observation and info."""
        self._observations.append(observation)
        self._infos.append(info)

    def add_env_step(self, observation: Any, action: Any, reward: float, info: dict, terminated: bool,
                     truncated: bool) -> None:
        """Append one step."""
        self._observations.append(observation)
        self._actions.append(action)
        self._rewards.append(reward)
        self._infos.append(info)
        self.is_terminated, self.is_truncated = terminated, truncated

    def __len__(self) -> int:
        return len(self._rewards)

    @property
    def t(self) -> int:
        """Steps so far."""
        return len(self._rewards)

    @property
    def is_done(self) -> bool:
        """Terminated or truncated."""
        return self.is_terminated or self.is_truncated

    def env_steps(self) -> int:
        """Steps so far."""
        return len(self._rewards)

    def get_return(self) -> float:
        """The sum of rewards so far (raw: before Atari's clipping or reward normalisation)."""
        return float(sum(self._rewards))

    def get_observations(self, indices: int | slice | list[int] | None = None) -> Any:
        """All observations (None), one (``-1``: the latest), or a slice / list of them (stacked as an array)."""
        return _pick(self._observations, indices, stack=True)

    def get_actions(self, indices: int | slice | list[int] | None = None) -> Any:
        """Actions, as :meth:`get_observations` picks them (in the runner's stored layout)."""
        return _pick(self._actions, indices, stack=True)

    def get_rewards(self, indices: int | slice | list[int] | None = None) -> Any:
        """Rewards, as :meth:`get_observations` picks them."""
        return _pick(self._rewards, indices, stack=True)

    def get_infos(self, indices: int | slice | list[int] | None = None) -> Any:
        """Info dicts (the reset's first), as :meth:`get_observations` picks them."""
        return _pick(self._infos, indices, stack=False)

    # RLlib's old stack
    @property
    def episode_id(self) -> str:
        """The episode's id (``id_``)."""
        return self.id_

    @property
    def length(self) -> int:
        """Steps so far."""
        return len(self._rewards)

    @property
    def total_reward(self) -> float:
        """The sum of rewards so far."""
        return self.get_return()

    def last_observation_for(self, agent_id: Any = None) -> Any:
        """The latest observation."""
        return self._observations[-1]

    def last_info_for(self, agent_id: Any = None) -> dict:
        """The latest info dict."""
        return self._infos[-1]

    def last_action_for(self, agent_id: Any = None) -> Any:
        """The latest action (None before the first step)."""
        return self._actions[-1] if self._actions else None

    def last_reward_for(self, agent_id: Any = None) -> float:
        """The latest reward (0 before the first step)."""
        return self._rewards[-1] if self._rewards else 0.0


def env_info(info: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Env copy ``index``'s own info dict out of a vector env's (arrays with ``_key`` masks, nested dicts alike)."""
    own = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not mask[index]:
            continue
        own[key] = env_info(value, index) if isinstance(value, Mapping) else value[index]
    return own


class _Tracker:
    """What both episode trackers share: the runner, its callbacks and metrics logger, and the hook call."""

    def __init__(self, runner: Any, callbacks: Callable[..., None], metrics: MetricsLogger) -> None:
        self.runner = runner
        self.callbacks = callbacks
        self.metrics = metrics
        self.episodes: dict[int, Any] = {}

    def _env_and_policies(self, episode: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def _call(self, hook: str, episode: Any) -> None:
        runner = self.runner
        env, policies = self._env_and_policies(episode)
        self.callbacks(hook, episode=episode, env_runner=runner, worker=runner, metrics_logger=self.metrics, env=env,
                       base_env=env, env_index=episode.env_index, rl_module=runner.module, policies=policies)


class EpisodeTracker(_Tracker):
    """A runner's episodes, one per env copy, fed step by step and handed to the episode hooks. Made only when an
    episode hook is set: without one a runner makes no per-step call for callbacks."""

    def _env_and_policies(self, episode: Episode) -> tuple[Any, Any]:
        return self.runner.env, {"default_policy": self.runner.policy}

    def create(self, env_index: int) -> None:
        """Env copy ``env_index`` is about to reset (RLlib calls ``on_episode_created`` before the reset, so a hook
        can set the env up for the episode)."""
        self.episodes[env_index] = Episode(env_index)
        self._call("on_episode_created", self.episodes[env_index])

    def create_all(self) -> None:
        """Every env copy is about to reset."""
        for index in range(self.runner.num_envs):
            self.create(index)

    def start(self, env_index: int, observation: Any, info: dict) -> None:
        """Env copy ``env_index`` began an episode."""
        episode = self.episodes[env_index]
        episode.begin(observation, info)
        self._call("on_episode_start", episode)

    def start_all(self, observations: Any, info: Mapping[str, Any]) -> None:
        """Every env copy was reset."""
        for index in range(self.runner.num_envs):
            self.start(index, _row(observations, index), _own_info(info, index))

    def step(self, env_indices: np.ndarray, observations: Any, actions: np.ndarray, rewards: np.ndarray,
             terminateds: np.ndarray, truncateds: np.ndarray, info: Mapping[str, Any], reset_only: np.ndarray) -> None:
        """One vector step of the env copies ``env_indices`` (the arrays hold their rows, in that order)."""
        for row, index in enumerate(env_indices):
            observation, own_info = _row(observations, row), _own_info(info, row)
            if reset_only[row]:  # the step after an episode's end only reset this copy: the next episode begins
                self.start(int(index), observation, own_info)
                continue
            episode = self.episodes[int(index)]
            episode.add_env_step(observation, np.array(actions[row]), float(rewards[row]), own_info,
                                 bool(terminateds[row]), bool(truncateds[row]))
            self._call("on_episode_step", episode)
            if episode.is_done:
                self._call("on_episode_end", episode)
                push_custom_metrics(self.metrics, episode.custom_metrics)
                self.create(int(index))  # the next step only resets this copy: the next episode begins there


def _own_info(info: Mapping[str, Any], index: int) -> dict[str, Any]:
    """:func:`env_info` for the episode hooks: an info the env gave that cannot be split per copy is a
    :class:`CallbackError` (one line, and no Ray runner restarted for it)."""
    try:
        return env_info(info, index)
    except Exception as exc:
        raise CallbackError(f"episode callbacks: the env's info dict cannot be split per env copy "
                            f"({type(exc).__name__}: {exc})") from exc


def _row(observations: Any, row: int) -> Any:
    """A copy of one env copy's observation out of a batch (a dict of arrays for Dict/Tuple spaces)."""
    if isinstance(observations, Mapping):
        return {key: np.array(value[row]) for key, value in observations.items()}
    return np.array(observations[row])


class MultiAgentEpisode:
    """One env copy's episode of a multi-agent run as callbacks see it: RLlib's ``MultiAgentEpisode`` calls
    (``len(episode)`` in env steps, ``get_return()`` summed over agents, ``get_observations(-1)`` as
    ``{agent: observation}``, ``get_rewards``, ``get_actions``, ``get_infos``, ``agent_ids``, ``module_for(agent)``,
    ``custom_data``) and the old stack's (``length``, ``total_reward``, ``agent_rewards``, ``policy_for(agent)``,
    ``last_observation_for(agent)``, ``last_info_for(agent)``, ``custom_metrics``, ``user_data``).

    Each agent's lists are in its own time: an observation each time it is to decide (and its last one when it
    ends), an action per decision, a reward per env step that paid it.
    """

    def __init__(self, env_index: int, mapping: dict[str, str]) -> None:
        self.id_ = uuid.uuid4().hex
        self.env_index = env_index
        self._mapping = mapping  # agent -> policy id, filled as agents appear (the runner's own dict)
        self._observations: dict[str, list[Any]] = {}
        self._actions: dict[str, list[Any]] = {}
        self._rewards: dict[str, list[float]] = {}
        self._infos: dict[str, list[dict]] = {}
        self._length = 0
        self.is_terminated = self.is_truncated = False
        self.custom_data: dict[str, Any] = {}
        self.custom_metrics: dict[str, float] = {}
        self.user_data: dict[str, Any] = {}
        self.hist_data: dict[str, list[float]] = {}

    def add(self, step: Any, actions: Mapping[str, Any] | None = None) -> None:
        """Add what an env call produced (``herdrl.env.multi_agent.AgentStep``) after ``actions`` (None: a reset)."""
        if actions is not None:
            self._length += 1
            for agent, action in actions.items():
                self._actions.setdefault(agent, []).append(action)
        for agent, reward in step.rewards.items():
            self._rewards.setdefault(agent, []).append(reward)
        for agent, obs in step.decide.items():
            self._observations.setdefault(agent, []).append(obs)
        for agent, (_, _, obs) in step.ended.items():
            if obs is not None:
                self._observations.setdefault(agent, []).append(obs)
        for agent, info in step.infos.items():
            self._infos.setdefault(agent, []).append(dict(info or {}))
        if step.over:
            ended = step.ended.values()
            # The game over with no agent left to report an end (every agent was removed before): terminated.
            no_agent_reported = not ended
            self.is_terminated = any(terminated for terminated, _, _ in ended) or no_agent_reported
            self.is_truncated = not self.is_terminated

    def __len__(self) -> int:
        return self._length

    @property
    def is_done(self) -> bool:
        """The episode is over."""
        return self.is_terminated or self.is_truncated

    @property
    def agent_ids(self) -> list[str]:
        """The agents seen so far."""
        return sorted(set(self._observations) | set(self._rewards))

    def env_steps(self) -> int:
        """Env steps so far (a turn of a turn-based game is one)."""
        return self._length

    def agent_steps(self) -> int:
        """Decisions of all agents so far."""
        return sum(len(actions) for actions in self._actions.values())

    def get_return(self) -> float:
        """The rewards of every agent so far, summed (RLlib's episode return)."""
        return float(sum(sum(rewards) for rewards in self._rewards.values()))

    def _per_agent(self, table: dict[str, list[Any]], indices: Any, agent_ids: Any, stack: bool) -> dict[str, Any]:
        agents = self.agent_ids if agent_ids is None else [agent_ids] if isinstance(agent_ids, str) else agent_ids
        picked = {}
        for agent in agents:
            items = table.get(agent, [])
            if isinstance(indices, (int, np.integer)) and not -len(items) <= indices < len(items):
                continue  # this agent has no such item (yet)
            picked[agent] = _pick(items, indices, stack)
        return picked

    def get_observations(self, indices: Any = None, agent_ids: Any = None) -> dict[str, Any]:
        """``{agent: observations}``: all (None), one (``-1``: each agent's latest), a slice or a list of them."""
        return self._per_agent(self._observations, indices, agent_ids, stack=True)

    def get_actions(self, indices: Any = None, agent_ids: Any = None) -> dict[str, Any]:
        """``{agent: actions}`` (stored layout), picked as :meth:`get_observations` picks."""
        return self._per_agent(self._actions, indices, agent_ids, stack=True)

    def get_rewards(self, indices: Any = None, agent_ids: Any = None) -> dict[str, Any]:
        """``{agent: rewards}``, picked as :meth:`get_observations` picks."""
        return self._per_agent(self._rewards, indices, agent_ids, stack=True)

    def get_infos(self, indices: Any = None, agent_ids: Any = None) -> dict[str, Any]:
        """``{agent: info dicts}``, picked as :meth:`get_observations` picks."""
        return self._per_agent(self._infos, indices, agent_ids, stack=False)

    def module_for(self, agent_id: str) -> str | None:
        """The policy (RLlib: module) ``agent_id`` plays in this episode."""
        return self._mapping.get(agent_id)

    policy_for = module_for  # the old stack's name

    @property
    def episode_id(self) -> str:
        """The episode's id (``id_``)."""
        return self.id_

    @property
    def length(self) -> int:
        """Env steps so far."""
        return self._length

    @property
    def total_reward(self) -> float:
        """The rewards of every agent so far, summed."""
        return self.get_return()

    @property
    def agent_rewards(self) -> dict[tuple[str, str | None], float]:
        """The old stack's ``{(agent, policy): reward so far}``."""
        return {(agent, self._mapping.get(agent)): float(sum(rewards)) for agent, rewards in self._rewards.items()}

    def last_observation_for(self, agent_id: str) -> Any:
        """``agent_id``'s latest observation (None before its first)."""
        items = self._observations.get(agent_id)
        return items[-1] if items else None

    def last_info_for(self, agent_id: str) -> dict:
        """``agent_id``'s latest info dict ({} before its first)."""
        items = self._infos.get(agent_id)
        return items[-1] if items else {}

    def last_action_for(self, agent_id: str) -> Any:
        """``agent_id``'s latest action (None before its first)."""
        items = self._actions.get(agent_id)
        return items[-1] if items else None

    def last_reward_for(self, agent_id: str) -> float:
        """``agent_id``'s latest reward (0 before its first)."""
        items = self._rewards.get(agent_id)
        return items[-1] if items else 0.0


class MultiAgentEpisodeTracker(_Tracker):
    """A multi-agent runner's episodes, one per env copy, handed to the episode hooks (made only when one is set);
    ``env`` is that copy's PettingZoo env."""

    def _env_and_policies(self, episode: MultiAgentEpisode) -> tuple[Any, Any]:
        return self.runner.envs[episode.env_index].env, self.runner.policies

    def create(self, env_index: int, mapping: dict[str, str]) -> None:
        """Env copy ``env_index`` is about to reset (``mapping``: its agents' policies, filled as they appear)."""
        self.episodes[env_index] = MultiAgentEpisode(env_index, mapping)
        self._call("on_episode_created", self.episodes[env_index])

    def start(self, env_index: int, step: Any) -> None:
        """Env copy ``env_index`` was reset (``step``: what the reset gave)."""
        episode = self.episodes[env_index]
        episode.add(step)
        self._call("on_episode_start", episode)

    def step(self, env_index: int, actions: Mapping[str, Any], step: Any) -> None:
        """Env copy ``env_index`` was stepped with ``actions`` and gave ``step``."""
        episode = self.episodes[env_index]
        episode.add(step, actions)
        self._call("on_episode_step", episode)
        if step.over:
            self._call("on_episode_end", episode)
            push_custom_metrics(self.metrics, episode.custom_metrics)
