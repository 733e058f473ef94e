"""Algorithm: builds runners and the learner's module, runs iterations, reports one flat result row.

Subclasses implement ``setup()`` (optimizers) and ``training_step()`` (sample,
update, return the learner's metrics); everything else lives here.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from herdrl.callbacks import CallbackError, Callbacks, MetricsLogger, MetricsReducer
from herdrl.checkpoint import (
    PREFIX,
    SITE_KEYS,
    CheckpointError,
    CheckpointPath,
    as_checkpoint_path,
    checkpoint_config,
    checkpoint_name,
    list_checkpoints,
    read_meta,
    read_tensors,
    space_from_json,
    space_to_json,
    write_checkpoint,
)
from herdrl.cluster.connect import object_store_use
from herdrl.config import AlgorithmConfig
from herdrl.env import env_reward_threshold
from herdrl.env.imports import env_origin
from herdrl.env.previous import previous_inputs
from herdrl.errors import ConfigError, HerdError
from herdrl.filters import Normalizer, PolicyNormalizers, model_observation_space
from herdrl.learner import Learner
from herdrl.learner.group import LearnerFailure, make_learner_group
from herdrl.models.encoders import encoding_differs
from herdrl.obs import ObsSpec
from herdrl.offline.source import sample_source
from herdrl.policy import Policy
from herdrl.results import DEFAULT_MODULE_ID, NOT_LEARNER_KEYS, SOMETIMES_PREFIXES, EvaluationResult, Result
from herdrl.rollout.transport import FragmentInput, FragmentLostError, FragmentsLost, Sampled
from herdrl.survival import nodes_lost

logger = logging.getLogger("herdrl")

#: Episodes the running ``episode_return_mean`` averages over (DESIGN.md, Definitions).
EPISODE_WINDOW = 100
#: Updates an iteration tries while its fragments keep being lost (a node dying each time) before it fails.
RESAMPLE_ROUNDS = 4


class Algorithm:
    """Base of every algorithm. Build it with ``XxxConfig(...).build()``, then call ``train()``."""

    config: AlgorithmConfig
    #: The algorithm's Learner subclass (its module, optimizers, loss and update).
    learner_class: type[Learner] = Learner
    #: The evaluation time bound's name in the line a cut evaluation leaves (``herd evaluate`` names its --timeout-s).
    _timeout_option = "evaluation_sample_timeout_s"

    def __init__(self, config: AlgorithmConfig, logger: Any = None) -> None:
        self.config = config
        self.logger = logger
        if torch.get_num_threads() != config.num_cpus_for_main_process:
            torch.set_num_threads(config.num_cpus_for_main_process)
        if config.seed is not None:
            torch.manual_seed(config.seed)
        self.rng = np.random.default_rng(config.seed)
        if config.num_env_runners > 0:
            env_reward_threshold(config.env)  # an unknown env id fails here, before Ray starts
        self.runners = sample_source(config)
        #: Multi-agent runs (``.multi_agent()``): the spaces are dicts, policy id -> space.
        self.multi_agent = config.is_multi_agent
        self.observation_space: gym.Space = self.runners.observation_space
        self.action_space: gym.Space = self.runners.action_space
        single_space = gym.spaces.Dict({}) if self.multi_agent else self.observation_space
        self.obs_spec = ObsSpec(single_space)
        # The run's normalisation statistics (herdrl.filters), merged from the runners' fragments; the model reads
        # filtered leaves as float32.
        self.normalizer: Normalizer | PolicyNormalizers = Normalizer(single_space, config)
        if self.multi_agent:  # a policy's statistics are its own (its agents' observations and returns)
            from herdrl.multi_agent import policy_config

            self.normalizer = PolicyNormalizers(self.observation_space, {
                pid: policy_config(config, pid) for pid in self.observation_space})
        if (config.observation_filter == "MeanStdFilter" and not self.normalizer.observations
                and config.is_explicit("observation_filter")):  # (an LSTM default has nothing to say here)
            logger.warning("herdrl: observation_filter=MeanStdFilter has nothing to filter in %s (it normalises "
                           "Box leaves that are not images)", self.observation_space)
        try:
            init_seed = config.seed if config.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
            learner_class = self.learner_class_for(self.action_space)
            if self.multi_agent:
                from herdrl.learner.multi_agent import MultiAgentLearner

                learner_class = MultiAgentLearner
            self.learners = make_learner_group(config, learner_class,
                                               model_observation_space(self.observation_space, config),
                                               self.action_space, init_seed)
        except BaseException:
            self.runners.stop()
            raise
        self.learner: Learner | None = self.learners.learner  # in the driver: the learner; None with actors
        self._save_dir: Path | None = None  # where save() without a path writes, with no result folder
        # Scheduled hyperparameters (lr, entropy_coeff, epsilon: herdrl.schedules) follow env steps sampled, this
        # iteration's included; a resumed run continues from its restored count.
        self.schedules = config.schedules()
        if self.multi_agent:  # each policy by its own config (a policy's own lr, entropy_coeff, ...)
            from herdrl.multi_agent import policy_config

            self._policy_schedules = {pid: policy_config(config, pid).schedules() for pid in config.policies}
        self.learners.step_source = self._schedule_steps
        if hasattr(self.learners, "checkpoint_state"):  # learner actors: a restart's last resort
            self.learners.checkpoint_state = self._checkpoint_learner_state
        self.module = self.learners.module
        self.device = self.learners.device
        self.last_checkpoint: Path | None = None  # written or restored; named when a learner actor fails
        self._array_checkpoints: list[Path] = []  # checkpoints this instance wrote array files (replay) into
        #: The trained policy; a multi-agent run has one per policy id in ``policies`` (and ``policy`` is None).
        self.policies: dict[str, Policy] = {}
        if self.multi_agent:
            from herdrl.multi_agent import actor_normalizer, actor_observation_space

            self.policy = None  # (a centralised critic's policy acts on its agent's own observation)
            parts = self.normalizer.parts if self.normalizer.active else {}
            self.policies = {pid: Policy(self.module[pid], actor_observation_space(space), self.action_space[pid],
                                         actor_normalizer(parts.get(pid), space))
                             for pid, space in self.observation_space.items()}
        else:
            self.policy = Policy(self.module, self.observation_space, self.action_space,
                                 self.normalizer if self.normalizer.active else None)
        self.last_result: dict[str, Any] = Result()
        self._evaluator: Any = None
        self._runner_evaluation: Any = None  # herdrl.rollout.evaluation.RunnerEvaluation, made on first use
        self._evaluation_thread: Any = None  # evaluation_parallel_to_training: where it runs
        self.iteration = 0
        self.env_steps_lifetime = 0
        self.agent_steps_lifetime = 0  # multi-agent: decisions of all agents
        self.policy_steps_lifetime: dict[str, int] = {}  # multi-agent: each trained policy's agent steps
        self._iter_policy_steps: dict[str, int] = {}
        self.episodes_lifetime = 0
        self.time_total_s = 0.0
        self._returns: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self._lengths: deque[int] = deque(maxlen=EPISODE_WINDOW)
        # Multi-agent: the returns of each agent and of each policy's agents, "agent/<id>" and "policy/<id>".
        self._part_returns: dict[str, deque[float]] = {}
        self._iter_agent_steps = 0
        self._iter_steps = self._iter_episodes = 0
        self._iter_fragments_lost = self._iter_fragment_bytes = self._iter_extra_fragments = 0
        self._iter_sample_time = 0.0
        self._degraded_said: tuple[int, int] | None = None
        self._nodes_lost_before = nodes_lost()
        #: Callbacks (herdrl.callbacks) and the driver's metrics logger; custom metrics are reduced per iteration.
        self.callbacks = Callbacks.from_config(config)
        self.metrics_logger = MetricsLogger()
        self._runner_metrics, self._driver_metrics = MetricsReducer(), MetricsReducer()
        if config.self_play:  # snapshots begin as copies of the policy they follow, not as random networks
            pairs = [(source, copy) for source, copies in config.self_play.items() for copy in copies]
            self.learners.apply("copy_policy", pairs)
            self.learners.sync()
            for source, target in pairs:
                self.normalizer.copy(source, target)
        #: Iterations (from the run's first) in which only the value head learns: a fresh one under a policy copied
        #: by ``init_from`` (herdrl.init_from).
        self._value_warmup_iters = 0
        self._policy_frozen = False
        try:
            if config.init_from:
                from herdrl.init_from import load_initial_weights

                self._value_warmup_iters = load_initial_weights(self)
            self.setup()
            self._callback("on_algorithm_init", algorithm=self)
        except BaseException:
            self.learners.stop()
            self.runners.stop()
            raise

    def _callback(self, hook: str, **kwargs: Any) -> None:
        """Call ``hook`` of the run's callbacks (if any) in the driver, with its metrics logger."""
        if self.callbacks is not None:
            self.callbacks(hook, metrics_logger=self.metrics_logger, **kwargs)

    # ------------------------------------------------------- for subclasses
    def learner_class_for(self, action_space: gym.Space) -> type[Learner]:
        """The learner for this action space: :attr:`learner_class` (CQL: a Q-network's for discrete actions)."""
        return self.learner_class

    def setup(self) -> None:
        """Create the algorithm's driver-side state (a replay buffer); called at the end of ``__init__``."""

    def training_step(self) -> dict[str, float]:
        """Sample, update, and return the learner's metrics (losses, ...)."""
        raise NotImplementedError

    def update_seed(self) -> int:
        """A seed for one update's random choices (minibatch order), drawn from the algorithm's seeded stream:
        the same on every learner, and restored with checkpoints."""
        return int(self.rng.integers(2**63))

    def sample(self, exploration: dict[str, Any] | None = None, count: int | None = None) -> list[Sampled]:
        """Send the current weights (and ``exploration`` settings) to the runners; collect a fragment from each (as
        a reference, from Ray runners: ``herdrl.rollout.transport``), or from ``count`` of them, and record it."""
        start = time.perf_counter()
        weights = self.runner_weights()
        sampled = self.runners.sample(weights, exploration, self.iteration, count)
        want = len(self.runners.actors) if count is None and hasattr(self.runners, "actors") else len(sampled)
        if len(sampled) >= want:
            self._degraded_said = None  # every runner delivered: a later shortfall is said again
        elif self.config.keep_train_batch_size:
            self._say_degraded(want - len(sampled))
            for _ in range(want):  # the runners in service sample the missing fragments, taken in turn
                extra = self.runners.sample(weights, exploration, self.iteration, want - len(sampled))
                self._iter_extra_fragments += len(extra)
                sampled += extra
                if len(sampled) >= want:
                    break
        if not sampled:  # every runner in service failed in this call: wait (bounded) for a replacement, sample again
            sampled = self.runners.sample(weights, exploration, self.iteration, count)
            if not sampled:
                from herdrl.rollout.group import RunnerFailure

                raise RunnerFailure("no env runner delivered a fragment in this iteration, even after waiting for "
                                    "their replacements: see the lines above for why")
        self.record(sampled)
        self._iter_sample_time += time.perf_counter() - start
        return sampled

    def _policy_steps(self) -> dict[str, int]:
        """Each trained policy's agent steps sampled, this iteration's included (multi-agent runs)."""
        steps = dict(self.policy_steps_lifetime)
        for pid, count in self._iter_policy_steps.items():
            steps[pid] = steps.get(pid, 0) + count
        return steps

    def _schedule_steps(self) -> int | dict[str, int]:
        """The count schedules follow at this moment: env steps sampled, this iteration's included; in multi-agent
        runs each policy's own agent steps."""
        return self._policy_steps() if self.multi_agent else self.env_steps_lifetime + self._iter_steps

    def _scheduled_values(self) -> dict[str, float]:
        """The scheduled hyperparameters as the last update took them, for the row (DQN's epsilon: its own, per
        round); multi-agent runs: per policy, ``lr/<policy>``."""
        if self.multi_agent:
            return {f"{key}/{pid}": schedule(steps) for pid, steps in sorted(self.policy_steps_lifetime.items())
                    for key, schedule in self._policy_schedules[pid].items() if key != "epsilon"}
        return {key: schedule(self.env_steps_lifetime) for key, schedule in self.schedules.items() if key != "epsilon"}

    def _say_degraded(self, missing: int) -> None:
        """One console line each time the number of runners in service changes while some are missing."""
        runners = self.runners
        state = (runners.num_healthy, runners.num_waiting)
        if state == self._degraded_said:
            return
        self._degraded_said = state
        where = (" (inside a Tune trial, whose placement group is fixed: until Ray places them again in it)"
                 if runners.in_fixed_group else "")
        logger.warning("herdrl: %d of %d env runners in service, %d starting or waiting for room on the cluster%s; "
                       "the others sample %d more fragment%s per iteration so the train batch keeps its size",
                       runners.num_healthy, len(runners.actors), runners.num_waiting, where, missing,
                       "" if missing == 1 else "s")

    def update_on(self, sampled: list[Sampled], *args: Any) -> Any:
        """``learners.update(fragments, *args)``; fragments lost with their node before a learner read them are
        dropped and as many sampled again, one from each of as many runners (the update then happens once, on a
        full batch). The lost fragments' env steps stay counted as sampled (they were). Fragments lost in
        :data:`RESAMPLE_ROUNDS` rounds in a row end the iteration with :class:`FragmentLostError`."""
        size = len(sampled)
        for round_ in range(1, RESAMPLE_ROUNDS + 1):
            result = self.learners.update(FragmentInput(item.data for item in sampled), *args)
            if not isinstance(result, FragmentsLost):
                return result
            lost = set(result.indices)
            self._iter_fragments_lost += len(lost)
            logger.warning("herdrl: %d fragment%s lost with %s node or runner before the learner read %s; sampling "
                           "again", len(lost), "" if len(lost) == 1 else "s", "its" if len(lost) == 1 else "their",
                           "it" if len(lost) == 1 else "them")
            sampled = [item for i, item in enumerate(sampled) if i not in lost]
            if round_ == RESAMPLE_ROUNDS:
                break
            for _ in range(RESAMPLE_ROUNDS):  # the runners asked may fail too (the same node): ask the next ones
                sampled += self.sample(count=size - len(sampled))
                if len(sampled) >= size:
                    break
            else:
                raise FragmentLostError(f"{size - len(sampled)} of the {size} fragments of this update were lost and "
                                        "could not be sampled again: the runners asked kept failing")
        raise FragmentLostError(f"fragments were lost before the learner read them in {RESAMPLE_ROUNDS} rounds of "
                                "sampling in a row: nodes keep dying (see the runner lines above)")

    def runner_weights(self) -> dict[str, Any]:
        """What runners sample with: the weights, and the merged normalisation statistics if any."""
        weights = self.learners.get_weights()
        return {**weights, **self.normalizer.to_weights()} if self.normalizer.active else weights

    def record(self, sampled: list[Sampled]) -> None:
        """Count the fragments' env steps and finished episodes in this iteration's result, and merge their
        normalisation statistics into the run's (from their infos: the arrays may be elsewhere)."""
        for fragment in (item.info for item in sampled):
            if fragment.metrics:
                self._runner_metrics.add(fragment.metrics)
            self._iter_fragment_bytes += fragment.nbytes
            if fragment.filter_delta is not None:
                self.normalizer.merge(fragment.filter_delta)
            self._iter_steps += fragment.env_steps
            self._iter_episodes += len(fragment.episode_returns)
            self._returns.extend(fragment.episode_returns)
            self._lengths.extend(fragment.episode_lengths)
            if self.multi_agent:
                self._iter_agent_steps += fragment.agent_steps
                for pid, steps in fragment.policy_steps.items():
                    self._iter_policy_steps[pid] = self._iter_policy_steps.get(pid, 0) + steps
                for kind, returns in (("agent", fragment.agent_returns), ("policy", fragment.policy_returns)):
                    for name, values in returns.items():
                        self._part_returns.setdefault(f"{kind}/{name}", deque(maxlen=EPISODE_WINDOW)).extend(values)

    # ------------------------------------------------------------- public
    def train(self) -> dict[str, Any]:
        """Run one iteration; return its result row (a flat dict) and pass it to the logger."""
        start = time.perf_counter()
        self._iter_steps = self._iter_episodes = self._iter_agent_steps = 0
        self._iter_policy_steps = {}
        self._iter_fragments_lost = self._iter_fragment_bytes = self._iter_extra_fragments = 0
        self._iter_sample_time = 0.0
        interval = self.config.evaluation_interval
        evaluate_now = bool(interval) and (self.iteration + 1) % interval == 0
        pending, waited = None, 0.0  # waited: this iteration's time spent on evaluation, not overlapping training
        if evaluate_now and self.config.evaluation_parallel_to_training:
            started = time.perf_counter()
            pending = self._start_parallel_evaluation()
            waited = time.perf_counter() - started  # (evaluation runners start on the first one)
        frozen = self.iteration < self._value_warmup_iters
        if frozen or self._policy_frozen:  # (every warm-up iteration: a restarted learner group forgets it)
            self.learners.apply("freeze_policy", frozen)
            self._policy_frozen = frozen
        try:
            learner_metrics = self.training_step()
        except LearnerFailure as exc:
            where = f"last checkpoint: {self.last_checkpoint}" if self.last_checkpoint else "no checkpoint saved yet"
            raise LearnerFailure(f"{exc} ({where})") from exc
        self.iteration += 1
        if self.config.self_play and self.iteration % self.config.self_play_interval == 0:
            self._snapshot()
        self.learners.sync()  # learner actors: the driver's module (policy, evaluation) takes their weights
        self.learners.end_iteration(self.iteration)
        evaluation: dict[str, float] = {}
        if pending is not None:  # evaluated while the iteration trained: its time overlaps, only the wait counts
            started = time.perf_counter()
            evaluation = self._evaluate_end(pending.result())  # (its time_s: its own, in its thread)
            waited += time.perf_counter() - started
        elif evaluate_now:
            evaluation = self.evaluate()
            waited = evaluation["evaluation/time_s"]
        scores_start = time.perf_counter()
        scores = self._scores_against_random()
        scores_time = time.perf_counter() - scores_start if scores else 0.0
        elapsed = time.perf_counter() - start
        self.env_steps_lifetime += self._iter_steps
        self.agent_steps_lifetime += self._iter_agent_steps
        self.policy_steps_lifetime = self._policy_steps()
        self.episodes_lifetime += self._iter_episodes
        self.time_total_s += elapsed
        # The first keys are what consoles show (Tune's trial table takes the first few): keep them first.
        result = Result({
            "training_iteration": self.iteration,
            "episode_return_mean": _mean(self._returns),
            "num_env_steps_sampled_lifetime": self.env_steps_lifetime,
            "env_steps_per_s": self._iter_steps / elapsed if elapsed > 0 else math.nan,
            "episode_len_mean": _mean(self._lengths),
            "episode_return_min": min(self._returns, default=math.nan),
            "episode_return_max": max(self._returns, default=math.nan),
            "num_env_steps_sampled": self._iter_steps,
            "num_episodes_lifetime": self.episodes_lifetime,
            "num_episodes": self._iter_episodes,
            "num_healthy_env_runners": self.runners.num_healthy,
            "num_env_runner_restarts": self.runners.num_restarts,
            "num_fragments_lost": self._iter_fragments_lost,
            "num_env_runners_waiting": self.runners.num_waiting,
            "num_extra_fragments": self._iter_extra_fragments,
            "num_nodes_lost": nodes_lost() - self._nodes_lost_before,
            "num_learner_restarts": self.learners.num_restarts,
            "num_learner_updates_lost": self.learners.num_updates_lost,
            **object_store_use(),
            **({"fragment_bytes_per_env_step": self._iter_fragment_bytes / self._iter_steps}
               if self._iter_fragment_bytes and self._iter_steps else {}),
            **self._scheduled_values(),
            **({"policy_frozen": 1} if frozen else {}),
            **learner_metrics,
            **self._runner_metrics.reduce(),  # custom metrics of the runners' callbacks: env_runners/<key>
            **self._multi_agent_metrics(),
            **scores,
            "time_this_iter_s": elapsed,
            "time_total_s": self.time_total_s,
            "sample_time_s": self._iter_sample_time,
            "learn_time_s": elapsed - self._iter_sample_time - waited - scores_time,
            **evaluation,
        })
        if self.multi_agent:
            result.module_ids = tuple(self.policies)  # (RLlib's result["learners"][policy], episodes or not)
        if self.callbacks is not None:
            self._callback("on_train_result", algorithm=self, result=result)
            result.flatten()  # dicts the callback stored: <key>/<leaf>, as every sink takes them
            self._driver_metrics.add(self.metrics_logger.take())
            result.update(_driver_values(result, self._driver_metrics.reduce()))
        self.last_result = result
        if self.logger is not None:
            self.logger.log(result)
        return result

    def _multi_agent_metrics(self) -> dict[str, float]:
        """Per-agent and per-policy return means (last 100 episodes each) and agent steps, for multi-agent runs."""
        if not self.multi_agent:
            return {}
        means = {f"{kind}_return_mean/{name}": _mean(values)
                 for key, values in sorted(self._part_returns.items()) for kind, name in [key.split("/", 1)]}
        return {**means, "num_agent_steps_sampled": self._iter_agent_steps,
                "num_agent_steps_sampled_lifetime": self.agent_steps_lifetime}

    def _scores_against_random(self) -> dict[str, float]:
        """Turn-based zero-sum games, every ``random_opponent_interval`` iterations: each trained policy's mean result
        against uniformly random legal moves, ``score_vs_random/<policy>`` (their summed return is 0 by
        construction, so it is what shows learning). Played in this process on the evaluation env copy."""
        interval = self.config.random_opponent_interval
        if not (self.multi_agent and interval and self.iteration % interval == 0 and self._returns):
            return {}
        agents = [value for key, values in self._part_returns.items() if key.startswith("agent/") for value in values]
        # Zero-sum: every recent episode summed to 0 while its players' own returns did not (a sparse cooperative
        # game whose agents have earned nothing yet is not one).
        if max(abs(r) for r in self._returns) > 1e-6 or not any(abs(value) > 1e-6 for value in agents):
            return {}
        from herdrl.multi_agent import trained_policies

        player = self._multi_agent_player()
        if not player.envs[0].turns or len(player.envs[0].possible_agents) < 2:
            return {}
        player.set_weights(self.runner_weights())  # (with the normalisation statistics, if any)
        seed = None if self.config.seed is None else self.config.seed * 1_000_033 + self.iteration
        scores = {pid: player.score_against_random(pid, self.config.random_opponent_games, seed)
                  for pid in trained_policies(self.config)}
        return {f"score_vs_random/{pid}": score for pid, score in scores.items() if score is not None}

    def _snapshot(self) -> None:
        """Self-play: shift each policy's snapshots one older and copy the policy into the newest."""
        pairs = []
        for source, copies in self.config.self_play.items():
            pairs += [(copies[i - 1], copies[i]) for i in range(len(copies) - 1, 0, -1)] + [(source, copies[0])]
        self.learners.apply("copy_policy", pairs)
        for source, target in pairs:  # a snapshot acts on observations normalised as its policy's were
            self.normalizer.copy(source, target)

    def get_policy(self, policy_id: str | None = None) -> Policy:
        """The trained policy (RLlib's ``algo.get_policy``); a multi-agent run's by ``policy_id``."""
        if not self.multi_agent:
            return self.policy
        if policy_id not in self.policies:
            raise ConfigError(f"policy_id {policy_id!r} is not a policy of this run; policies: {sorted(self.policies)}")
        return self.policies[policy_id]

    def evaluate(self, progress: Any = None) -> EvaluationResult:
        """Play ``evaluation_duration`` episodes on separate env copies with the current policy (greedy unless
        ``evaluation_config={"explore": True}``); return ``evaluation/...`` metrics, also read as RLlib's
        ``evaluate()`` nests them (``["env_runners"]["episode_return_mean"]``). ``progress``: called with a
        line every few seconds while episodes play (``herd evaluate``). Callbacks' ``on_evaluate_start`` and
        ``on_evaluate_end`` run around it."""
        self._callback("on_evaluate_start", algorithm=self)
        start = time.perf_counter()
        if self.multi_agent:
            metrics = self._evaluate_multi_agent(progress)
        elif self._evaluates_on_runners():
            metrics = self._runner_evaluator().run(self.runner_weights(), self.iteration)
        else:
            metrics = self._evaluate_single_agent(progress)
        metrics["evaluation/time_s"] = time.perf_counter() - start
        return EvaluationResult(self._evaluate_end(metrics))

    def _evaluates_on_runners(self) -> bool:
        """Whether evaluation runs on env runners of its own (herdrl.rollout.evaluation.RunnerEvaluation)."""
        return bool(self.config.evaluation_num_env_runners) or self.config.evaluation_duration_unit == "timesteps"

    def _runner_evaluator(self) -> Any:
        if self._runner_evaluation is None:
            from herdrl.rollout.evaluation import RunnerEvaluation

            self._runner_evaluation = RunnerEvaluation(self.config, self.observation_space, self.action_space)
        return self._runner_evaluation

    def _start_parallel_evaluation(self) -> Any:
        """Start evaluating the weights this iteration begins with, on the evaluation runners, in a thread of its
        own (the driver waits on Ray there while it trains here)."""
        from concurrent.futures import ThreadPoolExecutor

        self._callback("on_evaluate_start", algorithm=self)
        evaluator = self._runner_evaluator()  # made here: Ray actors are started from the main thread
        if self._evaluation_thread is None:
            self._evaluation_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="herd-evaluation")
        return self._evaluation_thread.submit(evaluator.run, self.runner_weights(), self.iteration + 1)

    def _evaluate_end(self, metrics: dict[str, float]) -> dict[str, float]:
        """``on_evaluate_end`` with the metrics nested as RLlib's; keys a callback adds go into the row."""
        if self.callbacks is not None:
            nested = _evaluation_result(metrics)
            self._callback("on_evaluate_end", algorithm=self, evaluation_metrics=nested)
            metrics.update({f"evaluation/{key}": value for key, value in dict(nested).items()
                            if f"evaluation/{key}" not in metrics})
        return metrics

    def _evaluate_single_agent(self, progress: Any = None) -> dict[str, float]:
        """Greedy (unless ``explore``) episodes of the policy on the driver's evaluation env copies."""
        from herdrl.evaluation import Evaluator, summarize

        cfg = self.config
        if self._evaluator is None:
            env_config = {**cfg.env_config, **cfg.evaluation_config.get("env_config", {})}
            self._evaluator = Evaluator(cfg.evaluation_config.get("env", cfg.env), env_config, cfg.evaluation_duration,
                                        cfg.evaluation_config.get("gym_env_vectorize_mode",
                                                                  cfg.gym_env_vectorize_mode),
                                        previous_inputs(cfg.model))
        seed = None if cfg.seed is None else cfg.seed * 1_000_003 + self.iteration
        returns, lengths = self._evaluator.run(self.policy, seed=seed,
                                               explore=bool(cfg.evaluation_config.get("explore", False)),
                                               max_steps=cfg.evaluation_config.get("max_steps"), progress=progress,
                                               timeout_s=cfg.evaluation_sample_timeout_s,
                                               timeout_option=self._timeout_option)
        return {**summarize(returns, lengths, "evaluation/"),
                "evaluation/num_episodes_cut": cfg.evaluation_duration - len(returns)}

    def _evaluate_multi_agent(self, progress: Any = None) -> dict[str, float]:
        """The policies greedy (unless ``explore``) on an evaluation env copy, separate from the training ones: the
        returns summed over agents, and per agent and policy."""
        from herdrl.evaluation import summarize

        cfg = self.config
        seed = None if cfg.seed is None else cfg.seed * 1_000_003 + self.iteration
        explore = bool(cfg.evaluation_config.get("explore", False))
        player = self._multi_agent_player()
        player.set_weights(self.runner_weights())  # (with the normalisation statistics, if any)
        played = player.play(cfg.evaluation_duration, explore, seed, cfg.evaluation_config.get("max_steps"),
                             progress, cfg.evaluation_sample_timeout_s, self._timeout_option)
        parts = {f"evaluation/{kind}_return_mean/{name}": float(np.mean(values))
                 for kind, returns in (("agent", played.agent_returns), ("policy", played.policy_returns))
                 for name, values in sorted(returns.items())}
        return {**summarize(played.episode_returns, played.episode_lengths, "evaluation/"), **parts,
                "evaluation/num_episodes_cut": cfg.evaluation_duration - len(played.episode_returns)}

    def _multi_agent_player(self) -> Any:
        """The driver's multi-agent runner for evaluation and scores (one env copy, evaluation's env_config, on the
        CPU), made on first use; callers load the weights they play with."""
        from herdrl.rollout.multi_agent import MultiAgentEnvRunner

        cfg = self.config
        if self._evaluator is None:
            eval_config = cfg.copy()
            eval_config.update_from_dict({"num_envs_per_env_runner": 1, "num_gpus_per_env_runner": 0, "env_config": {
                **cfg.env_config, **cfg.evaluation_config.get("env_config", {})}, "callbacks_class": None,
                "callbacks_hooks": {}})  # (episode hooks do not run in evaluation)
            self._evaluator = MultiAgentEnvRunner(eval_config)
        return self._evaluator

    def get_weights(self, policies: list[str] | None = None) -> dict[str, Any]:
        """The learner module's weights as numpy arrays (copies: safe to ship while learning goes on), by name
        (a multi-agent run's ``<policy id>.<name>``). ``policies`` (RLlib's): module ids, and the weights nested
        by module as RLlib's ``get_weights`` gives them (a single-agent run's module: ``default_policy``); the flat
        dict answers ``["default_policy"]`` (and a multi-agent run's ``[policy_id]``) as well."""
        weights = ModuleWeights(self.learners.get_weights())
        if policies is None:
            return weights
        return {pid: weights[pid] for pid in policies}

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        """Load weights into the learner's module (the runners sample with them from the next iteration, and
        ``compute_single_action`` acts with them at once): what :meth:`get_weights` returns, flat or nested by
        module id as RLlib's ``{"default_policy": {...}}``. Every weight of each module given must be there."""
        flat = _flat_weights(weights, self.multi_agent)
        current = self.learners.get_weights()
        unknown = sorted(set(flat) - set(current))
        modules = {k.split(".", 1)[0] for k in flat} if self.multi_agent else None
        missing = sorted(k for k in current if k not in flat and (modules is None or k.split(".", 1)[0] in modules))
        problems = [f"{what} weights {', '.join(names[:3])}" for what, names in (("unknown", unknown),
                                                                              ("missing", missing)) if names]
        if problems:
            raise ConfigError(f"set_weights: {'; '.join(problems)} (give what get_weights() returns)")
        try:
            self.learners.apply("load_matching_weights", {k: torch.as_tensor(np.array(v)) for k, v in flat.items()})
        except RuntimeError as exc:  # a shape that differs
            raise ConfigError(f"set_weights: {str(exc).splitlines()[-1].strip()}") from None
        self.learners.sync()

    def get_module(self, module_id: str | None = None) -> torch.nn.Module | None:
        """RLlib's ``get_module``: the policy's torch module (the driver's copy; a multi-agent run's by
        ``module_id``, a policy id); None for a module id the run does not have, as in RLlib. herdrl's modules
        take observations (``module.dist_inputs(obs)``, ``module.act(obs, explore)``), not RLlib's batch dicts."""
        if not self.multi_agent:
            return self.module if module_id in (None, DEFAULT_MODULE_ID) else None
        return self.module[module_id] if module_id in self.policies else None

    @property
    def env_runner_group(self) -> Any:
        """RLlib's ``algo.env_runner_group``, as far as scripts use it: ``foreach_env_runner(fn)`` and the runner
        counts (:class:`herdrl.rollout.group.EnvRunnerGroupView`)."""
        from herdrl.rollout.group import EnvRunnerGroupView

        return EnvRunnerGroupView(self.runners)

    def compute_single_action(self, obs: Any, explore: bool = False, policy_id: str | None = None) -> Any:
        """The action for one observation: an int (Discrete) or an array clipped to the Box bounds (``policy_id``:
        which policy of a multi-agent run)."""
        return self.get_policy(policy_id).compute_single_action(obs, explore=explore)

    def compute_actions(self, observations: Mapping[Any, Any], explore: bool = False,
                        policy_id: str | None = None) -> dict[Any, Any]:
        """RLlib's older call: an action for each entry of ``observations`` (agent id, or any key -> one
        observation). A single-agent run acts with its policy; a multi-agent run with ``policy_id``, else with each
        agent's policy where ``policy_mapping_fn`` names it without an episode ('shared', 'per_agent', a dict)."""
        if not isinstance(observations, Mapping):
            raise ConfigError("compute_actions takes a dict {agent or key: observation}; for one observation use "
                              "compute_single_action(obs)")
        actions = {}
        for key, obs in observations.items():
            pid = policy_id
            if self.multi_agent and pid is None:
                mapping = self.config.policy_mapping_fn
                if mapping == "shared" or (mapping is None and len(self.policies) == 1):
                    pid = next(iter(self.policies))
                elif mapping == "per_agent" or (mapping is None and key in self.policies):
                    pid = key
                elif isinstance(mapping, Mapping):
                    pid = mapping.get(key)
                else:
                    raise ConfigError("compute_actions: this run's policy_mapping_fn needs an episode: give "
                                      "policy_id=...")
            actions[key] = self.compute_single_action(obs, explore=explore, policy_id=pid)
        return actions

    def get_policy_state(self) -> dict[str, Any]:
        """Everything inference needs, as plain data: weights and normalisation statistics (numpy), spaces (JSON
        form), model config. Multi-agent runs: see ``Policy.from_checkpoint(path, policy_id=...)``."""
        if self.multi_agent:
            raise ConfigError("get_policy_state() is for single-agent runs: save a checkpoint and load one policy "
                              "with Policy.from_checkpoint(path, policy_id=...)")
        return {"weights": self.learners.get_weights(), "model": dict(self.config.model),
                "filters": self.normalizer.state(), "observation_filter": self.config.observation_filter,
                "clip_obs": self.config.clip_obs, "observation_space": space_to_json(self.observation_space),
                "model_observation_space": space_to_json(model_observation_space(self.observation_space,
                                                                                 self.config)),
                "action_space": space_to_json(self.action_space)}

    # --------------------------------------------------------- checkpoints
    def _checkpoint_learner_state(self) -> dict[str, Any] | None:
        """The learner state of the newest checkpoint written or restored, if it can be read."""
        if self.last_checkpoint is None:
            return None
        try:
            return read_tensors(self.last_checkpoint)["learner"]
        except (CheckpointError, OSError, KeyError) as exc:
            logger.warning("herdrl: cannot read the learner state of %s: %s", self.last_checkpoint, exc)
            return None

    def learner_state(self) -> dict[str, Any]:
        """Tensors of the learner (module, optimizers, target networks); off-policy algorithms add their
        replay debt."""
        return self.learners.state()

    def load_learner_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`learner_state`."""
        self.learners.load_state(state)

    def _default_trial_dir(self) -> Path:
        """Where ``save()`` without a path writes: the run's trial folder, or for an algorithm built in Python a new
        one, ``results/<env>/<ALGO>_<env>_<seed>_<time>`` (made on the first save, then kept)."""
        if self.logger is not None:
            return Path(self.logger.logdir)
        if self._save_dir is None:
            from herdrl.experiment import experiment_name, run_subject, trial_name
            from herdrl.trial_dir import create_trial_dir

            self._save_dir = create_trial_dir(Path("results").resolve() / experiment_name(run_subject(self.config))
                                              / trial_name(self.config), exact=False)
            logger.info("herdrl: checkpoints of this algorithm go to %s", self._save_dir)
        return self._save_dir

    def save(self, checkpoint_dir: str | Path | None = None) -> CheckpointPath:
        """Write a checkpoint (atomically) and return its path (a Path, also read as RLlib's training result:
        ``.checkpoint.path``, ``.metrics``).

        ``checkpoint_dir``: where to write it; default ``<trial dir>/checkpoint_<iteration>`` (an algorithm built in
        Python, with no trial folder: a new one under ``results/<env>/``, made on the first save).
        """
        if checkpoint_dir is None:
            checkpoint_dir = self._default_trial_dir() / checkpoint_name(self.iteration)
        config = self.config.to_dict()
        if callable(config["env"]):
            config["env"] = None  # a class or function: from_checkpoint then needs env=... again
        if callable(config["policy_mapping_fn"]):
            config["policy_mapping_fn"] = None  # a function: a resumed run needs it passed again
        config["callbacks_class"], config["callbacks_hooks"] = None, {}  # code: never saved, never read back
        if config["policies"] is not None:  # policy spaces are saved with the others, below; their own keys here
            config["policies"] = {pid: {"config": spec["config"]} if spec.get("config") else None
                                  for pid, spec in sorted(config["policies"].items())}
        for key in SITE_KEYS:  # where it ran is not part of the experiment (and never read back)
            config[key] = None
        meta = {
            "algorithm": self.config.algo_name, "config": config,
            "counters": {"training_iteration": self.iteration,
                         "num_env_steps_sampled_lifetime": self.env_steps_lifetime,
                         "num_episodes_lifetime": self.episodes_lifetime, "time_total_s": self.time_total_s,
                         "num_agent_steps_sampled_lifetime": self.agent_steps_lifetime,
                         "policy_steps_lifetime": self.policy_steps_lifetime},
            "episodes": {"returns": list(self._returns), "lengths": list(self._lengths),
                         "parts": {key: list(values) for key, values in self._part_returns.items()}},
            "numpy_rng": self.rng.bit_generator.state,
            "spaces": {"observation": space_to_json(_space(self.observation_space)),
                       "action": space_to_json(_space(self.action_space))},
            "metrics": {k: v for k, v in self.last_result.items() if isinstance(v, (int, float))},
            "custom_metrics": {"runners": self._runner_metrics.state(), "driver": self._driver_metrics.state()},
            **env_origin(self.config.env),
        }
        filters = {key: torch.from_numpy(np.asarray(value)) for key, value in self.normalizer.state().items()}
        tensors = {"learner": self.learner_state(), "torch_rng": torch.get_rng_state(), "filters": filters}
        arrays = self.checkpoint_arrays()
        path = write_checkpoint(Path(checkpoint_dir), meta, tensors, arrays)
        self.last_checkpoint = path
        if hasattr(self.logger, "checkpoint"):  # trackers record the newest checkpoint folder
            self.logger.checkpoint(path)
        self.learners.checkpoint_written()
        # Large array files (replay buffers) live in this run's newest checkpoint only: dropped from the checkpoints
        # this instance wrote before and from its own trial folder's, never from anyone else's.
        if arrays and path.name.startswith(PREFIX):  # (a Tune trial's checkpoints keep theirs: PBT may restore any)
            trial_dir = Path(self.logger.logdir).resolve() if self.logger is not None else None
            ours = set(self._array_checkpoints)
            if trial_dir is not None and path.parent.resolve() == trial_dir:
                ours.update(p.resolve() for p in list_checkpoints(trial_dir))
            ours.discard(path.resolve())
            for older in ours:
                for name in arrays:
                    (older / f"{name}.npz").unlink(missing_ok=True)
            self._array_checkpoints = [path.resolve()]
        saved = CheckpointPath(path)
        saved.metrics = Result(self.last_result)
        return saved

    def checkpoint_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """Extra state saved as plain numpy arrays, one ``.npz`` file per key (off-policy: the replay buffer)."""
        return {}

    def load_checkpoint_arrays(self, path: Path) -> None:
        """Inverse of :meth:`checkpoint_arrays`, given the checkpoint directory."""

    def restore(self, path: str | Path | Any) -> None:
        """Load a checkpoint of this algorithm into this instance: weights, optimizer, counters, RNG states.
        ``path``: a folder, or what ``save()`` returned, or a Tune result's ``.checkpoint``."""
        meta = read_meta(as_checkpoint_path(path))
        where = meta["path"]
        if meta.get("algorithm") != self.config.algo_name:
            raise CheckpointError(f"checkpoint '{where}' is a {meta.get('algorithm')} checkpoint, not "
                                  f"{self.config.algo_name}: load it with Algorithm.from_checkpoint")
        for kind, space in (("observation", _space(self.observation_space)), ("action", _space(self.action_space))):
            trained = space_from_json(meta["spaces"][kind])
            if trained != space or trained.dtype != space.dtype:
                raise CheckpointError(f"checkpoint '{where}' was trained with {kind} space {trained}; this env "
                                      f"has {space}")
        if (meta.get("format_version", 1) < 3 and self.config.model.get("obs_encoding") != "flat"
                and encoding_differs(self.observation_space)):
            raise CheckpointError(f"checkpoint '{where}' was written before encoders existed (format "
                                  f"{meta.get('format_version', 1)}) for observations today's encoders read "
                                  "differently: load it with Algorithm.from_checkpoint (or herd train --resume), "
                                  "or set model obs_encoding='flat'")
        clash = self.config.checkpoint_clash(meta, self.action_space)
        if clash:
            raise CheckpointError(f"checkpoint '{where}': {clash}")
        self._check_normalisation(meta)
        tensors = read_tensors(where)
        # The statistics first: loading the learner state of an asynchronous algorithm broadcasts them.
        self.normalizer.load_state(tensors.get("filters", {}))  # checkpoints before normalisation: none
        try:
            self.load_learner_state(tensors["learner"])
        except (KeyError, RuntimeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint '{where}' does not fit this {self.config.algo_name} "
                                  f"(a different model config?): {str(exc).splitlines()[0]}") from None
        torch.set_rng_state(tensors["torch_rng"])
        counters = meta["counters"]
        self.iteration = counters["training_iteration"]
        self.env_steps_lifetime = counters["num_env_steps_sampled_lifetime"]
        self.episodes_lifetime = counters["num_episodes_lifetime"]
        self.time_total_s = counters["time_total_s"]
        self._returns = deque(meta["episodes"]["returns"], maxlen=EPISODE_WINDOW)
        self._lengths = deque(meta["episodes"]["lengths"], maxlen=EPISODE_WINDOW)
        self._part_returns = {key: deque(values, maxlen=EPISODE_WINDOW)
                              for key, values in meta["episodes"].get("parts", {}).items()}
        self.agent_steps_lifetime = counters.get("num_agent_steps_sampled_lifetime", 0)
        # (before herdrl 0.4 schedules counted env steps for every policy: a checkpoint without counts starts there)
        self.policy_steps_lifetime = {str(k): int(v) for k, v in counters.get(
            "policy_steps_lifetime", dict.fromkeys(self.policies, self.env_steps_lifetime)).items()}
        self.rng.bit_generator.state = meta["numpy_rng"]
        self.last_result = Result(meta.get("metrics", {}))
        custom = meta.get("custom_metrics") or {} if self.callbacks is not None else {}  # (none log without them)
        self._runner_metrics.load_state(custom.get("runners", {}))
        self._driver_metrics.load_state(custom.get("driver", {}))
        self.load_checkpoint_arrays(Path(where))
        self.last_checkpoint = Path(where)
        self.runners.reseed(self.iteration)  # a resumed run must not replay the episodes and noise it began with
        self._callback("on_checkpoint_loaded", algorithm=self)

    def _check_normalisation(self, meta: dict[str, Any]) -> None:
        """A policy trained on normalised observations reads nothing else: refuse a config that normalises
        differently from the checkpoint's (its weights would load and silently read other inputs)."""
        saved = meta["config"]
        keys = [key for key, default in (("observation_filter", "NoFilter"), ("clip_obs", 10.0),
                                         ("norm_reward", False))
                if saved.get(key, default) != getattr(self.config, key)]
        if keys:
            key = keys[0]
            raise CheckpointError(f"checkpoint '{meta['path']}' was trained with {key}="
                                  f"{saved.get(key)!r}, this config has {getattr(self.config, key)!r}: "
                                  f"resume with the same {key}")

    @classmethod
    def from_checkpoint(cls, path: str | Path | Any, **config_overrides: Any) -> Algorithm:
        """Rebuild the algorithm a checkpoint was saved from (its config, plus ``config_overrides``) and restore it.

        Example: ``Algorithm.from_checkpoint(path, num_env_runners=0)``. Where the run executes comes from
        ``config_overrides`` only (``address=...``; the checkpoint's are dropped), and a checkpoint env of the
        ``module:EnvId`` form (which imports ``module``) is made only when passed here too: ``env="module:EnvId"``.
        """
        from herdrl.multi_agent import actor_observation_space
        from herdrl.registry import get_config_class

        meta = read_meta(as_checkpoint_path(path))  # (also what save() returned, a Tune result's .checkpoint)
        # An env of the caller's replaces the checkpoint's (which then is never made).
        config = get_config_class(meta["algorithm"]).from_dict(
            checkpoint_config(meta, makes_env=config_overrides.get("env") is None))
        if config.policies is not None:  # multi-agent: each policy keeps the spaces it was trained with, its keys
            spaces = {kind: space_from_json(meta["spaces"][kind]) for kind in ("observation", "action")}
            own = config.policies if isinstance(config.policies, dict) else {}  # (a list before herdrl 0.4)
            # A policy's spec names its agents' own observations; the checkpoint holds what the policy stores,
            # which with a centralised critic has the global state beside them (the runners add it again).
            agent_space = actor_observation_space if config.centralized_critic else (lambda space: space)
            config.policies = {pid: {"observation_space": agent_space(spaces["observation"][pid]),
                                     "action_space": spaces["action"][pid],
                                     **({"config": own[pid]["config"]} if (own.get(pid) or {}).get("config")
                                        else {})} for pid in config.policies}
        config.update_from_dict(config_overrides)
        algo = config.build()
        try:
            algo.restore(meta["path"])
        except BaseException:
            algo.stop()
            raise
        return algo

    def stop(self) -> None:
        """Release learners, runners (and a Ray this algorithm started), evaluation envs, and close the logger."""
        if self._runner_evaluation is not None:
            self._runner_evaluation.cancelled = True  # an evaluation in flight ends after its round
        if self._evaluation_thread is not None:
            self._evaluation_thread.shutdown(wait=True)
        if self._runner_evaluation is not None:
            self._runner_evaluation.stop()
        self.learners.stop()
        self.runners.stop()
        if self.config.output:  # the runners wrote their last episodes: number them, write the metadata
            self._finish_recording()
        if self._evaluator is not None:
            (self._evaluator.stop if self.multi_agent else self._evaluator.close)()
        if self.logger is not None:
            self.logger.close()

    def _finish_recording(self) -> None:
        """Number the recorded episodes and write the dataset's metadata; a warning (never an error that would
        leave the rest unstopped) when this process cannot see them (runners on nodes without a shared folder)."""
        from herdrl.offline.recorder import finish_recording

        try:
            finish_recording(self.config.output, algorithm_name=self.config.algo_name,
                             description=f"training episodes of {self.config.algo_name} on {self.config.env}",
                             herdrl_env=str(self.config.env))
        except (HerdError, OSError) as exc:
            logger.warning("herdrl: the episodes recorded into %s were not finished (%s): run herd data finish "
                           "where they are", self.config.output, exc)


def _evaluation_result(metrics: dict[str, float]) -> Result:
    """Evaluation metrics as RLlib's ``on_evaluate_end`` gets them: ``["env_runners"]["episode_return_mean"]`` (also
    ``["episode_return_mean"]``)."""
    return Result({key.removeprefix("evaluation/"): value for key, value in metrics.items()})


class ModuleWeights(dict):
    """``get_weights()``'s flat dict, name -> array, that also answers RLlib's module ids: ``["default_policy"]``
    (a single-agent run's whole module), ``[policy_id]`` (a multi-agent run's ``<policy id>.<name>`` weights)."""

    def __missing__(self, key: Any) -> Any:
        prefix = f"{key}."
        own = {k[len(prefix):]: v for k, v in self.items() if k.startswith(prefix)}
        if own:
            return own
        if key == DEFAULT_MODULE_ID and self:
            return dict(self)
        raise KeyError(key)


def _flat_weights(weights: Mapping[str, Any], multi_agent: bool) -> dict[str, Any]:
    """Weights flat by name, from a flat dict or one nested by module id (RLlib's ``get_weights()``)."""
    if not isinstance(weights, Mapping):
        raise ConfigError(f"set_weights takes a dict of weights (what get_weights() returns), got "
                          f"{type(weights).__name__}")
    if not weights or not all(isinstance(v, Mapping) for v in weights.values()):
        return dict(weights)
    if multi_agent:
        return {f"{pid}.{name}": value for pid, inner in weights.items() for name, value in inner.items()}
    if len(weights) != 1:
        raise ConfigError(f"set_weights: this run has one module; got weights of {sorted(weights)}")
    return dict(next(iter(weights.values())))


def _space(space: gym.Space | dict[str, gym.Space]) -> gym.Space:
    """A space as checkpoints hold it: a multi-agent run's policy id -> space as a Dict space."""
    return gym.spaces.Dict(space) if isinstance(space, dict) else space


def _driver_values(row: Mapping[str, Any], values: dict[str, float]) -> dict[str, float]:
    """The driver's custom metrics, checked against the row they join: one named like a key it has already (herdrl's
    own, a runner's custom metric, or one ``on_train_result`` set) would replace that key without a word; so would
    one named like a key only some rows have (evaluation, scores against random play, counts of lost work), refused
    from the first row on, not hours into a run."""
    for key in values:
        if (key in row or key in NOT_LEARNER_KEYS or key.startswith(SOMETIMES_PREFIXES)
                or f"{key}/" in SOMETIMES_PREFIXES):
            raise CallbackError(f"metrics_logger.log_value({key!r}) in the driver: herdrl's result rows have a key "
                                f"{key!r} (this one or others); log it under another name, e.g. 'custom/{key}'")
    return values


def _mean(values: deque) -> float:
    return float(np.mean(values)) if values else math.nan
