"""The multi-agent runner: PettingZoo env copies, one module per policy, one fragment per policy.

Each env copy's agents act through the policies the mapping gives them for the episode; every step, the
observations of all the agents that decide, over all env copies, go through their policy in one forward pass.

**Rows in agent time.** A row is one decision of one agent: its observation, its action, and the reward it got
from that decision until its next one (or the end of its part in the episode). In a Parallel env every live agent
decides at every step; in a turn-based (AEC) env an agent decides on its turns only, and what it is paid while
the others move (a loss, when the opponent wins) is still its last decision's. A row is complete when the agent
decides again or ends; complete rows ship with the fragment, an open one with the next.

**One fragment per policy.** Each (env copy, agent) that played the policy in this fragment is one column of an
ordinary :class:`~herdrl.rollout.runner.Fragment`: its rows in order, the observation after the last row at the
end (the next decision's, or the final one when the agent ended), right-aligned, with invalid rows in front where
a column is shorter than the longest. Between two episodes of a column comes one invalid row holding the first
episode's final observation — the layout the single-agent runner gives NEXT_STEP's reset-only steps — so the
learners' GAE, value bootstrapping on truncation and masking apply unchanged.

**Recurrent policies** (``model={"use_lstm": True}``): each (env copy, agent) carries its own state from decision
to decision and across fragments, zero when its episode begins. A row keeps the state entering its decision and
the one after it; a policy fragment records, as a single-agent runner's does, the state entering each of its
training sequences (:func:`herdrl.rollout.batch.sequence_index` over its columns: an episode break row starts from
the state after the episode's last decision, the padding in front from zeros) and the state entering the
observation after each column's last row, so the learner unrolls exactly what the runner computed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.callbacks import MultiAgentEpisodeTracker, runner_callbacks
from herdrl.config import AlgorithmConfig
from herdrl.env.multi_agent import AgentEnv, AgentStep, make_agent_env
from herdrl.errors import ConfigError, EnvError
from herdrl.filters import RunnerNormalizer, model_observation_space, policy_slice, split_weights
from herdrl.models.distributions import ActionDistribution
from herdrl.models.protocol import map_state, stack_states, state_rows, state_to_numpy
from herdrl.multi_agent import (
    EpisodeInfo,
    PolicyMapper,
    policy_config,
    policy_spaces,
    trained_policies,
    with_global_state,
    with_state_value,
)
from herdrl.obs import ObsSpec, obs_concat, obs_map
from herdrl.rollout.runner import Fragment, load_weights, runner_module


@dataclass
class MultiAgentFragment:
    """What one runner sampled: a :class:`Fragment` per trained policy, and the episodes that ended."""

    policies: dict[str, Fragment]
    env_steps: int  # env steps (a turn of an AEC game is one)
    agent_steps: int  # decisions of all agents, trained policies or not
    episode_returns: list[float] = field(default_factory=list)  # sum over the episode's agents (RLlib's)
    episode_lengths: list[int] = field(default_factory=list)  # in env steps
    agent_returns: dict[str, list[float]] = field(default_factory=dict)  # agent id -> its returns
    policy_returns: dict[str, list[float]] = field(default_factory=dict)  # policy id -> its agents' summed returns
    worker_index: int = 0
    weights_version: int | dict[str, int] = -1  # asynchronous algorithms: each trained policy's version
    filter_delta: dict[str, np.ndarray] | None = None  # normalisation statistics of its samples, <policy id>.<key>
    metrics: list | None = None  # custom metrics its callbacks logged (herdrl.callbacks.MetricsLogger.take)
    policy_steps: dict[str, int] = field(default_factory=dict)  # trained policy -> its rows shipped (agent steps)


@dataclass(eq=False)
class _Row:
    """One decision of one agent."""

    policy: str
    obs: Any  # stored form, batch of one
    action: np.ndarray | None = None  # stored layout, one row
    logp: float = 0.0
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    final_obs: Any = None  # the agent ended: its last observation (stored form)
    complete: bool = False
    state: Any = None  # recurrent policies: the state entering this decision (one row: herdrl.models.protocol)
    state_after: Any = None  # ... and the state after it
    carried: bool = False  # still open when a fragment shipped: it ships with the next, maybe after new weights


class MultiAgentEnvRunner:
    """Steps ``num_envs_per_env_runner`` copies of a PettingZoo env with every policy; the interface of
    :class:`~herdrl.rollout.runner.EnvRunner` (``sample``, ``set_weights``, ``reseed``, ``stop``)."""

    def __init__(self, config: AlgorithmConfig, worker_index: int = 0, incarnation: int = 0, epoch: int = 0) -> None:
        self.config, self.worker_index, self.incarnation = config, worker_index, incarnation
        self.envs: list[AgentEnv] = [make_agent_env(config.env, config.env_config, worker_index, k)
                                     for k in range(config.num_envs_per_env_runner)]
        self.num_envs = len(self.envs)
        #: Each policy's agents' own observation space; ``observation_space`` is what the policy stores and reads,
        #: with the global state beside it when critics are centralised (``centralized_critic``, MAPPO).
        self.agent_spaces, self.action_space = policy_spaces(config, self.envs[0])
        self.observation_space = dict(self.agent_spaces)
        self._state: list[np.ndarray | None] = [None] * self.num_envs  # each env copy's global state, when used
        if config.centralized_critic:
            for agent_env in self.envs:
                agent_env.track_observations = True
            self.envs[0].reset()  # an env's state() answers once an episode has begun (reseed starts the real one)
            state_space = self.envs[0].global_state_space()
            self.observation_space = {pid: with_global_state(space, state_space)
                                      for pid, space in self.agent_spaces.items()}
        self.mapper = PolicyMapper(config.policy_mapping_fn, list(config.policies), self.envs[0].possible_agents,
                                   config.self_play)
        self.trained = set(trained_policies(config))
        # Each policy's normalisation statistics (observation_filter, norm_reward), its own agents': a
        # RunnerNormalizer per policy; running discounted returns per (env copy, agent, policy) lane.
        self.normalizers = {pid: norm for pid, space in self.observation_space.items()
                            if (norm := RunnerNormalizer(space, policy_config(config, pid), 0)).local.active}
        self._lane_returns: dict[tuple[int, str, str], float] = {}
        # (built on what the policy reads, as the learner's: filtered leaves are float32, not the raw integers)
        self.module = runner_module(config, model_observation_space(self.observation_space, config), self.action_space)
        self.specs = {pid: ObsSpec(space) for pid, space in self.observation_space.items()}  # raw, as stored
        # ... and as fragments carry them: filtered leaves normalised to float32 (herdrl.filters)
        self.fragment_specs = {pid: ObsSpec(model_observation_space(space, config))
                               for pid, space in self.observation_space.items()}
        self.actions = {pid: ActionDistribution(space) for pid, space in self.action_space.items()}
        #: Recurrent policies' initial state, one row (numpy leaves: ``herdrl.models.protocol``); each (env copy,
        #: agent) lane's state lives in ``_hidden``.
        self._initial = {pid: state_rows(state_to_numpy(module.initial_state(1)), 0)
                         for pid, module in self.module.items() if getattr(module, "recurrent", False)}
        self._seq_len = int(config.model.get("max_seq_len", 20))
        # The acting policy's log-probabilities: V-trace's behaviour for every row (IMPALA, APPO); PPO's and TRPO's
        # old policy for the rows carried into a fragment (chosen, maybe, by the weights before: NaN elsewhere,
        # where the learner computes them with the weights that acted, from the same unroll as its loss).
        self._all_logp = bool(getattr(config, "behaviour_logp", False))
        self._with_logp = self._all_logp or bool(getattr(config, "multi_agent_old_logp", False))
        self.weights_version = -1
        self.callbacks, self.metrics_logger, self._episodes = runner_callbacks(
            self, MultiAgentEpisodeTracker, [agent_env.env for agent_env in self.envs])
        self.reseed(epoch)

    # ------------------------------------------------------------------ episodes
    def reseed(self, epoch: int) -> None:
        """Fresh random streams for (seed, runner, incarnation, ``epoch``) and fresh episodes in every env copy."""
        if getattr(self, "_reseeded", False):  # (not at start: on_environment_created may have logged)
            self.metrics_logger.take()  # what hooks logged for the episodes left behind is not reported
        self._reseeded = True
        seed = self.config.seed
        streams = [None] * 3 if seed is None else np.random.SeedSequence(
            [seed, self.worker_index, self.incarnation, epoch]).spawn(3)
        self._rng = np.random.default_rng(streams[1])
        self.torch_stream = streams[2]  # a Ray runner seeds its process's torch with it
        self.policies = {pid: self._runner_policy(pid) for pid in self.module}
        self._hidden: dict[tuple[int, str], np.ndarray] = {}  # recurrent: (env copy, agent) -> its state
        base = None if streams[0] is None else int(streams[0].generate_state(1)[0])
        self._episodes_begun = [0] * self.num_envs
        self._run_tag = f"{self.worker_index}.{self.incarnation}.{epoch}"
        self._lanes: dict[tuple[int, str], list[_Row]] = {}  # (env copy, agent) -> rows not shipped yet
        for norm in self.normalizers.values():  # a new timeline: nothing of the old one is shipped or carried
            norm.restart()
        self._lane_returns = {}
        self._episode: dict[int, EpisodeInfo] = {}
        self._decide: list[dict[str, Any]] = []
        self._mapping: list[dict[str, str]] = []
        self._returns: list[dict[str, float]] = []
        self._lengths = [0] * self.num_envs
        for k in range(self.num_envs):
            self._decide.append({})
            self._mapping.append({})
            self._returns.append({})
            self._begin(k, None if base is None else base + k)

    def _runner_policy(self, pid: str) -> Any:
        if pid in self._initial:
            from herdrl.models.recurrent import RecurrentPolicy

            return RecurrentPolicy(self.module[pid], self._rng, 0)  # states are set per call, lane by lane
        return self.config.runner_policy(self.module[pid], self._rng)

    def _begin(self, k: int, seed: int | None) -> None:
        """Reset env copy ``k``: a new episode, its agents' policies picked as they appear."""
        self._hidden = {lane: state for lane, state in self._hidden.items() if lane[0] != k}  # zero: a new episode
        self._episode[k] = EpisodeInfo(f"{self._run_tag}.{k}.{self._episodes_begun[k]}", self.worker_index, k,
                                       self._episodes_begun[k])
        self._episodes_begun[k] += 1
        self._mapping[k], self._returns[k], self._lengths[k] = {}, {}, 0
        if self._episodes is not None:
            self._episodes.create(k, self._mapping[k])
        try:
            step = self.envs[k].reset(seed=seed)
        except Exception as exc:
            raise self._env_error(exc) from exc
        self._observe_state(k)
        self._decide[k] = step.decide
        self._take(k, step)
        if self._episodes is not None:
            self._episodes.start(k, step)

    def _observe_state(self, k: int) -> None:
        """Env copy ``k``'s global state after its last reset or step (centralised critics only)."""
        if self.config.centralized_critic:
            try:
                self._state[k] = self.envs[k].global_state()
            except EnvError:
                raise
            except Exception as exc:
                raise self._env_error(exc) from exc

    def _policy_of(self, k: int, agent: str) -> str:
        mapping = self._mapping[k]
        if agent not in mapping:
            pid = self.mapper(agent, self._episode[k])
            env = self.envs[k]
            if (env.observation_space(agent), env.action_space(agent)) != (self.agent_spaces[pid],
                                                                            self.action_space[pid]):
                raise ConfigError(f"policy_mapping_fn mapped agent {agent!r} to policy {pid!r}, whose spaces "
                                  f"({self.agent_spaces[pid]}, {self.action_space[pid]}) are not the agent's")
            mapping[agent] = pid
        return mapping[agent]

    def _stored(self, pid: str, k: int, agent: str, raw: Any) -> Any:
        """An observation in stored form, copied: rows keep it for a fragment or more, and an env may reuse its
        arrays. With centralised critics, env copy ``k``'s global state as it is now goes beside it."""
        if self._state[k] is not None:
            raw = with_state_value(raw, self._state[k], self.agent_spaces[pid])
        try:
            return obs_map(np.array, self.specs[pid].one(raw))
        except (ValueError, TypeError) as exc:
            raise EnvError(f"env '{self.config.env}' gave agent {agent!r} an observation that does not fit "
                           f"{self.agent_spaces[pid]}: {exc}") from None

    def _env_error(self, exc: Exception) -> EnvError:
        return EnvError(f"env '{self.config.env}' raised {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ weights
    def set_weights(self, weights: dict[str, Any], version: int | dict[str, int] | None = None) -> None:
        """Load every policy's weights (``<policy id>.<weight>`` numpy arrays), in place, and the normalisation
        statistics sent along (``<policy id>.<key>``); ``version`` (asynchronous algorithms: each trained policy's
        update count) is stamped on the fragments sampled with them."""
        if version is not None:
            self.weights_version = version
        weights, stats = split_weights(weights)
        if stats is not None:
            for pid, norm in self.normalizers.items():
                norm.load(policy_slice(stats, pid))
        load_weights(self.module, weights)

    def set_exploration(self, params: dict[str, Any] | None) -> None:
        """Exploration settings for every policy, or ``{"policies": {policy id: settings}}`` for each its own."""
        params = params or {}
        own = params.get("policies", {})
        for pid, policy in self.policies.items():
            for key, value in own.get(pid, {} if "policies" in params else params).items():
                setattr(policy, key, value)

    def normalizer_state(self) -> dict[str, np.ndarray]:
        """The statistics each policy normalises with, ``<policy id>.<key>`` (empty without normalisation)."""
        return {f"{pid}.{key}": value for pid, norm in self.normalizers.items()
                for key, value in norm.local.state().items()}

    def _normalized(self, pid: str, stored: Any) -> Any:
        """Stored observations as policy ``pid`` reads them (filtered with its statistics, if it filters)."""
        norm = self.normalizers.get(pid)
        return stored if norm is None or not norm.local.observations else norm.local.normalize(stored)

    def _kept(self, pid: str, stored: Any) -> Any:
        """Stored observations as policy ``pid``'s rows keep them: as it reads them (on-policy), or raw (replay
        algorithms normalise each replayed batch with the statistics of the moment)."""
        norm = self.normalizers.get(pid)
        return self._normalized(pid, stored) if norm is None or norm.scale_fragments else stored

    # ------------------------------------------------------------------ sampling
    def sample(self, num_steps: int | None = None) -> MultiAgentFragment:
        """Step every env copy ``num_steps`` times (default: the fragment length) and ship the complete rows."""
        steps = num_steps or self.config.fragment_length()
        result = MultiAgentFragment({}, env_steps=0, agent_steps=0, worker_index=self.worker_index,
                                    weights_version=self.weights_version)
        for _ in range(steps):
            self._step(self._act(), result)
        result.policies = self._ship()
        result.policy_steps = {pid: part.env_steps for pid, part in result.policies.items()}
        if self.normalizers:  # the trained policies' samples since the last fragment, for the run's statistics
            result.filter_delta = {f"{pid}.{key}": value for pid, norm in self.normalizers.items()
                                   if pid in self.trained for key, value in norm.take_delta().items()}
        if self.callbacks is not None:
            self.callbacks("on_sample_end", env_runner=self, worker=self, metrics_logger=self.metrics_logger,
                           samples=[result])
            result.metrics = self.metrics_logger.take()
        return result

    def _step(self, actions: list[dict[str, Any]], result: MultiAgentFragment) -> None:
        """Step every env copy with its agents' actions; count the steps, record ended episodes and begin new ones."""
        result.agent_steps += sum(len(a) for a in actions)
        for k, env in enumerate(self.envs):
            try:
                step = env.step(actions[k])
            except Exception as exc:
                raise self._env_error(exc) from exc
            self._lengths[k] += 1
            result.env_steps += 1
            self._observe_state(k)
            self._decide[k] = step.decide
            self._take(k, step)
            if self._episodes is not None:
                self._episodes.step(k, actions[k], step)
            if step.over:
                self._end_episode(k, result)
                self._begin(k, None)

    def play(self, episodes: int, explore: bool = False, seed: int | None = None,
             max_steps: int | None = None, progress: Callable[[str], None] | None = None,
             timeout_s: float | None = None, timeout_option: str = "evaluation_sample_timeout_s"
             ) -> MultiAgentFragment:
        """Play ``episodes`` whole episodes from fresh resets (greedy unless ``explore``), for at most ``max_steps``
        env steps (default 1M: a bound even for an env that never ends) and ``timeout_s`` seconds (a line says when
        it cut an episode, and how to change ``timeout_option``), and return their returns; nothing is kept for
        learning. Evaluation uses a runner of its own, with one env copy, so that short episodes are not favoured
        over long ones. ``progress``: called with a line every ``herdrl.evaluation.PROGRESS_EVERY_S``."""
        from herdrl.evaluation import Deadline, Ticker

        for k in range(self.num_envs):
            self._begin(k, None if seed is None else seed + k)
        result = MultiAgentFragment({}, env_steps=0, agent_steps=0)
        ticker, deadline = Ticker(), Deadline(timeout_s, timeout_option)
        while len(result.episode_returns) < episodes and result.env_steps < (max_steps or 1_000_000):
            if deadline.passed():
                deadline.say_cut(len(result.episode_returns))
                break
            actions = self._act(explore, count=False)
            self._lanes.clear()  # nothing to learn from
            self._step(actions, result)
            if progress is not None and ticker.due():
                steps = result.env_steps
                progress(f"{len(result.episode_returns)}/{episodes} episodes done, {steps:,} env "
                         f"step{'' if steps == 1 else 's'}")
        return result

    def score_against_random(self, policy_id: str, games: int, seed: int | None = None,
                             max_steps: int = 10_000, max_seconds: float = 30.0) -> float | None:
        """The mean result of ``games`` games of policy ``policy_id`` (greedy) against opponents that play uniformly
        random legal moves: +1 a win, 0 a draw, -1 a loss, by the sign of its agent's return. It takes every seat
        whose spaces are its own in turn (first and second player alike). None if no seat fits the policy. Games
        stop after ``max_seconds`` (long games: chess): the score is over those played.

        A zero-sum game's summed return is 0 by construction, and one shared policy's return is both sides': this
        score is what says whether it learned to play."""
        env = self.envs[0]
        fits = [agent for agent in env.possible_agents if (env.observation_space(agent), env.action_space(agent))
                == (self.agent_spaces[policy_id], self.action_space[policy_id])]
        # The seats the run's mapping gives this policy (a policy per player plays its own side only; a shared or
        # self-play one, every side), probed over a few episodes; else every seat that fits.
        probes = [EpisodeInfo(f"score.{i}", 0, 0, i) for i in range(8)]
        mapped = [agent for agent in fits if any(self.mapper(agent, probe) == policy_id for probe in probes)]
        seats = mapped or fits
        if not seats:
            return None
        rng = np.random.default_rng(seed)
        policy, space = self.policies[policy_id], self.action_space[policy_id]
        results = []
        deadline = time.monotonic() + max_seconds
        for game in range(games):
            if results and time.monotonic() > deadline:
                break
            seat = seats[game % len(seats)]
            step = env.reset(seed=None if seed is None else seed + game)
            total, steps = 0.0, 0
            state = stack_states([self._initial[policy_id]]) if policy_id in self._initial else None
            while True:
                total += step.rewards.get(seat, 0.0)
                if step.over or seat in step.ended or steps >= max_steps:
                    break
                actions = {}
                for agent, raw in step.decide.items():
                    if agent == seat:
                        obs = self._normalized(policy_id, self._stored(policy_id, 0, agent, raw))
                        if state is not None:
                            policy.set_state(state)
                        stored = policy.act(obs, False)  # greedy: no noise
                        if state is not None:
                            state = policy.get_state()
                        actions[agent] = _item(space, self.actions[policy_id].to_env(stored), 0)
                    else:
                        actions[agent] = _random_legal(env.action_space(agent), raw, rng)
                step = env.step(actions)
                steps += 1
            results.append(float(np.sign(total)))
        return float(np.mean(results))

    def _act(self, explore: bool = True, count: bool = True) -> list[dict[str, Any]]:
        """Every deciding agent's action, one forward pass per policy; opens a row per decision, holding the
        observation as the policy read it. ``count``: add the observations to the normalisation statistics."""
        who: dict[str, list[tuple[int, str, Any]]] = {}  # policy -> (env copy, agent, observation as rows keep it)
        for k, decide in enumerate(self._decide):
            for agent, raw in decide.items():
                pid = self._policy_of(k, agent)
                who.setdefault(pid, []).append((k, agent, self._stored(pid, k, agent, raw)))
        actions: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for pid, items in who.items():
            obs = obs_concat([item[2] for item in items])
            norm = self.normalizers.get(pid)
            if norm is not None and norm.local.observations:
                if count and pid in self.trained:  # (a frozen policy's statistics are its own, as its weights)
                    norm.observe(obs)
                    norm.count(obs)
                obs = norm.local.normalize(obs)
                if norm.scale_fragments:  # (else rows keep the raw observations)
                    items = [(k, agent, obs_map(lambda a, i=i: a[i:i + 1], obs)) for i, (k, agent, _) in
                             enumerate(items)]
            policy = self.policies[pid]
            entering = after = None
            if pid in self._initial:  # each lane's own state, the initial one where its episode begins
                zero = self._initial[pid]
                entering = stack_states([self._hidden.get((k, agent), zero) for k, agent, _ in items])
                policy.set_state(entering)
            noise = policy.noise(1, len(items))[0]
            if self._with_logp and explore:
                stored, logp = policy.act_logp(obs, noise)
            else:
                stored, logp = policy.act(obs, explore, noise), np.zeros(len(items), np.float32)
            if entering is not None:
                after = policy.get_state()
                for i, (k, agent, _) in enumerate(items):
                    self._hidden[k, agent] = state_rows(after, i)
            env_actions = self.actions[pid].to_env(stored)
            for i, (k, agent, agent_obs) in enumerate(items):
                actions[k][agent] = _item(self.action_space[pid], env_actions, i)
                self._lanes.setdefault((k, agent), []).append(_Row(
                    pid, agent_obs, stored[i], float(logp[i]),
                    state=None if entering is None else state_rows(entering, i),
                    state_after=None if after is None else self._hidden[k, agent]))
        return actions

    def _take(self, k: int, step: AgentStep) -> None:
        """Pay each agent's open row, close the rows of agents that ended or decide again."""
        returns = self._returns[k]
        for agent, reward in step.rewards.items():
            returns[agent] = returns.get(agent, 0.0) + reward
            row = self._open_row(k, agent)
            if row is not None:
                row.reward += reward
        for agent, (terminated, truncated, raw) in step.ended.items():
            self._hidden.pop((k, agent), None)  # (should it come back, it begins from zero)
            row = self._open_row(k, agent)
            if row is not None:
                row.terminated, row.truncated, row.complete = terminated, truncated, True
                row.final_obs = row.obs if raw is None else self._kept(
                    row.policy, self._stored(row.policy, k, agent, raw))
        for agent in step.decide:
            row = self._open_row(k, agent)
            if row is not None:
                row.complete = True
        if step.over:  # agents the env dropped without saying they ended: cut off (bootstrapped)
            for agent in self._mapping[k]:
                row = self._open_row(k, agent)
                if row is not None:
                    row.truncated, row.complete, row.final_obs = True, True, row.obs

    def _open_row(self, k: int, agent: str) -> _Row | None:
        rows = self._lanes.get((k, agent))
        return rows[-1] if rows and not rows[-1].complete else None

    def _end_episode(self, k: int, result: MultiAgentFragment) -> None:
        returns = self._returns[k]
        result.episode_returns.append(float(sum(returns.values())))
        result.episode_lengths.append(self._lengths[k])
        by_policy: dict[str, float] = {}
        for agent, value in returns.items():
            result.agent_returns.setdefault(agent, []).append(value)
            pid = self._mapping[k].get(agent)
            if pid is not None:
                by_policy[pid] = by_policy.get(pid, 0.0) + value
        for pid, value in by_policy.items():
            result.policy_returns.setdefault(pid, []).append(value)

    # ------------------------------------------------------------------ fragments
    def _ship(self) -> dict[str, Fragment]:
        """The complete rows of the trained policies as one Fragment per policy (columns: see the module doc);
        open rows stay for the next fragment."""
        columns: dict[str, list[tuple[tuple[int, str], list[_Row], Any]]] = {}
        for (k, agent), rows in self._lanes.items():
            done = len(rows) if not rows or rows[-1].complete else len(rows) - 1
            self._lanes[k, agent] = rows[done:]
            for row in rows[done:]:
                row.carried = True
            by_policy: dict[str, list[int]] = {}
            for i in range(done):
                by_policy.setdefault(rows[i].policy, []).append(i)
            for pid, index in by_policy.items():
                if pid not in self.trained:
                    continue
                last = rows[index[-1]]
                if last.terminated or last.truncated:
                    after = last.final_obs
                elif index[-1] + 1 < len(rows):  # the agent decided again: its next row holds that observation
                    after = rows[index[-1] + 1].obs
                else:  # it decides at the next step
                    after = self._kept(pid, self._stored(pid, k, agent, self._decide[k][agent]))
                columns.setdefault(pid, []).append(((k, agent), [rows[i] for i in index], after))
        return {pid: self._fragment(pid, cols) for pid, cols in sorted(columns.items())}

    def _fragment(self, pid: str, columns: list[tuple[tuple[int, str], list[_Row], Any]]) -> Fragment:
        spec, dist = self.fragment_specs[pid], self.actions[pid]
        laid_out = [_with_episode_breaks(rows) for _, rows, _ in columns]
        length = max(len(rows) for rows in laid_out)
        width = len(columns)
        obs = spec.zeros((length + 1, width))
        actions = np.zeros((length, *dist.action_shape(width)), dtype=dist.action_dtype)
        rewards = np.zeros((length, width), np.float32)
        terminateds = np.zeros((length, width), bool)
        truncateds = np.zeros((length, width), bool)
        valid = np.zeros((length, width), bool)
        logp = None if not self._with_logp else np.full((length, width), 0.0 if self._all_logp else np.nan, np.float32)
        for b, (rows, (_, _, after)) in enumerate(zip(laid_out, columns, strict=True)):
            start = length - len(rows)  # right-aligned: the padding in front is invalid
            for t, (row, real) in enumerate(rows, start):
                _write(obs, (t, b), row.obs if real else row.final_obs)
                if real:
                    actions[t, b] = row.action
                    rewards[t, b], terminateds[t, b], truncateds[t, b] = row.reward, row.terminated, row.truncated
                    valid[t, b] = True
                    if logp is not None and (self._all_logp or row.carried):
                        logp[t, b] = row.logp
            _write(obs, (length, b), after)
        norm = self.normalizers.get(pid)
        if norm is not None and norm.local.rewards:
            rewards = self._scaled_rewards(norm, [(*lane, pid) for lane, _, _ in columns], rewards, terminateds,
                                           truncateds, valid)
        state_in = state_last = None
        if pid in self._initial:
            state_in, state_last = self._sequence_states(pid, laid_out, length, valid)
        return Fragment(obs, actions, rewards, terminateds, truncateds, valid, logp=logp,
                        weights_version=self.weights_version, worker_index=self.worker_index,
                        state_in=state_in, state_last=state_last)

    def _sequence_states(self, pid: str, laid_out: list[list[tuple[_Row, bool]]], length: int,
                         valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A recurrent policy fragment's states: entering each training sequence, in the order the learner cuts
        them (:func:`~herdrl.rollout.batch.sequence_index`), and entering the observation after each column."""
        from herdrl.rollout.batch import sequence_index

        width = len(laid_out)
        starts = sequence_index(valid, self._seq_len)[:, 0]
        state_in = [self._initial[pid]] * len(starts)  # padding in front: the initial state
        for n, (t, b) in enumerate(zip(starts // width, starts % width, strict=True)):
            i = t - (length - len(laid_out[b]))  # the column's rows are right-aligned
            if i >= 0:
                row, real = laid_out[b][i]
                state_in[n] = row.state if real else row.state_after  # a break row: after the episode's last
        return stack_states(state_in), stack_states([rows[-1][0].state_after for rows in laid_out])

    def _scaled_rewards(self, norm: RunnerNormalizer, lanes: list[tuple[int, str, str]], rewards: np.ndarray,
                        terminateds: np.ndarray, truncateds: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """A policy fragment's rewards as its learner takes them (``norm_reward``): each column's running discounted
        return (its agent's while it plays this policy: ``lanes`` are (env copy, agent, policy); carried across
        fragments, reset at its episode ends) counted in the policy's statistics, then the rewards scaled by them
        (VecNormalize's scheme, per agent); raw for replay algorithms, which scale replayed batches."""
        gamma, seen = norm.gamma, []
        for b, lane in enumerate(lanes):
            running = self._lane_returns.get(lane, 0.0)
            for t in np.nonzero(valid[:, b])[0]:
                running = running * gamma + float(rewards[t, b])
                seen.append(running)
                if terminateds[t, b] or truncateds[t, b]:
                    running = 0.0
            self._lane_returns[lane] = running
        norm.count_returns(np.asarray(seen))
        return norm.local.scale_rewards(rewards) if norm.scale_fragments else rewards  # (replay scales batches)

    def stop(self) -> None:
        """Close the env copies."""
        for env in self.envs:
            env.close()


def pad_front(fragment: Fragment, length: int) -> Fragment:
    """``fragment`` lengthened to ``length`` steps by invalid rows in front (zero observations, no rewards or ends).

    A policy's fragment is as long as its busiest column, so fragments of several runners differ in length; the
    learner concatenates them side by side. Its own columns are already right-aligned this way: GAE and V-trace
    run backwards, so rows in front of a column's first real step never reach it.
    """
    pad = length - len(fragment.valid)
    if pad <= 0:
        return fragment
    front = lambda a: np.concatenate([np.zeros((pad, *a.shape[1:]), a.dtype), a])  # noqa: E731
    # Recurrent: each padding row is a training sequence of its own (sequence_index cuts after every invalid row),
    # entered from zeros; they come first in its order (by step, then column), the fragment's own after them.
    state_in = fragment.state_in
    if state_in is not None:
        state_in = map_state(lambda s: np.concatenate([np.zeros((pad * len(fragment.valid[0]), *s.shape[1:]),
                                                                s.dtype), s]), state_in)
    return replace(fragment, obs=obs_map(front, fragment.obs), actions=front(fragment.actions),
                   rewards=front(fragment.rewards), terminateds=front(fragment.terminateds),
                   truncateds=front(fragment.truncateds), valid=front(fragment.valid),
                   logp=None if fragment.logp is None else front(fragment.logp), state_in=state_in)


def _with_episode_breaks(rows: list[_Row]) -> list[tuple[_Row, bool]]:
    """``(row, real)`` pairs: the rows, and after each that ended an episode with more rows behind it an unreal
    one standing for its final observation (what a truncated row's value bootstraps from)."""
    out: list[tuple[_Row, bool]] = []
    for i, row in enumerate(rows):
        out.append((row, True))
        if (row.terminated or row.truncated) and i + 1 < len(rows):
            out.append((row, False))
    return out


def _write(storage: Any, index: tuple[int, int], one: Any) -> None:
    """Write one stored observation (a batch of one) into ``storage`` at ``index``, leaf by leaf."""
    obs_map(lambda a, o: a.__setitem__(index, o[0]), storage, one)


def _random_legal(space: gym.Space, obs: Any, rng: np.random.Generator) -> Any:
    """A uniformly random action, among the legal ones where the observation carries an ``action_mask``."""
    mask = obs.get("action_mask") if isinstance(obs, dict) else None
    if isinstance(space, gym.spaces.Discrete):
        legal = np.flatnonzero(mask) if mask is not None else np.arange(space.n)
        return int(space.start + rng.choice(legal))
    space.seed(int(rng.integers(2**31)))
    return space.sample()


def _item(space: gym.Space, batch: Any, i: int) -> Any:
    """Element ``i`` of a batch of env actions, in the space's own form (an int for Discrete)."""
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_item(sub, part, i) for sub, part in zip(space.spaces, batch, strict=True))
    return int(batch[i]) if isinstance(space, gym.spaces.Discrete) else batch[i]
