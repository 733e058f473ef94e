"""Algorithm: builds runners and the learner's module, runs iterations, reports one flat result row.

Subclasses implement ``setup()`` (driver-side state) and ``training_step()`` (sample, update, return the learner's
metrics) and give their ``learner_class``. The loop is here; checkpoints, evaluation and acting with the trained
policies are mixins of their own (``checkpointing.py``, ``evaluating.py``, ``acting.py``).
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

# The mixins' helpers are re-exported: ``from herdrl.algorithms.base import ModuleWeights`` (and the rest) works as
# before they moved.
from herdrl.algorithms.acting import Acting, ModuleWeights, _flat_weights  # noqa: F401
from herdrl.algorithms.checkpointing import Checkpointing, _space  # noqa: F401
from herdrl.algorithms.evaluating import Evaluating, _evaluation_result  # noqa: F401
from herdrl.auto_size import sized_config, wants_sizing
from herdrl.callbacks import CallbackError, Callbacks, MetricsLogger, MetricsReducer
from herdrl.cluster.connect import object_store_use
from herdrl.config import AlgorithmConfig
from herdrl.env import env_reward_threshold
from herdrl.errors import HerdError
from herdrl.filters import Normalizer, PolicyNormalizers, model_observation_space
from herdrl.learner import Learner
from herdrl.learner.group import LearnerFailure, make_learner_group
from herdrl.obs import ObsSpec
from herdrl.offline.source import sample_source
from herdrl.policy import Policy
from herdrl.results import NOT_LEARNER_KEYS, SOMETIMES_PREFIXES, Result
from herdrl.rollout.transport import FragmentInput, FragmentLostError, FragmentsLost, Sampled
from herdrl.survival import nodes_lost

logger = logging.getLogger("herdrl")

#: Episodes the running ``episode_return_mean`` averages over (DESIGN.md, Definitions).
EPISODE_WINDOW = 100
#: Updates an iteration tries while its fragments keep being lost (a node dying each time) before it fails.
RESAMPLE_ROUNDS = 4


class Algorithm(Checkpointing, Evaluating, Acting):
    """Base of every algorithm. Build it with ``XxxConfig(...).build()``, then call ``train()``.

    This file holds the build and the train loop (sample, update, one result row); checkpoints, evaluation and
    acting with the trained policies live in their mixins (``checkpointing.py``, ``evaluating.py``, ``acting.py``).
    """

    config: AlgorithmConfig
    #: The algorithm's Learner subclass (its module, optimizers, loss and update).
    learner_class: type[Learner] = Learner

    def __init__(self, config: AlgorithmConfig, logger: Any = None) -> None:
        self.config = sized_config(config) if wants_sizing(config) else config  # "auto" counts: herdrl.auto_size
        self.logger = logger
        self._seed_this_process()
        self._build_runners()
        self._build_normalizer()
        self._build_learners()
        self._build_policies()
        self._init_run_state()
        self._build_callbacks()
        if config.self_play:  # snapshots begin as copies of the policy they follow, not as random networks
            self._copy_policies([(source, copy) for source, copies in config.self_play.items() for copy in copies])
            self.learners.sync()
        self._set_up_algorithm()

    # ------------------------------------------------------- build steps (in __init__'s order)
    def _seed_this_process(self) -> None:
        """Torch's threads and seed in this process, and the algorithm's own seeded stream (:meth:`update_seed`)."""
        config = self.config
        if torch.get_num_threads() != config.num_cpus_for_main_process:
            torch.set_num_threads(config.num_cpus_for_main_process)
        if config.seed is not None:
            torch.manual_seed(config.seed)
        self.rng = np.random.default_rng(config.seed)

    def _build_runners(self) -> None:
        """The env runners (in-process or Ray actors), and the spaces they report."""
        if self.config.num_env_runners > 0:
            env_reward_threshold(self.config.env)  # an unknown env id fails here, before Ray starts
        self.runners = sample_source(self.config)
        #: Multi-agent runs (``.multi_agent()``): the spaces are dicts, policy id -> space.
        self.multi_agent = self.config.is_multi_agent
        self.observation_space: gym.Space = self.runners.observation_space
        self.action_space: gym.Space = self.runners.action_space

    def _build_normalizer(self) -> None:
        """The run's normalisation statistics (herdrl.filters), merged from the runners' fragments; the model reads
        filtered leaves as float32. A multi-agent run's policies each have their own."""
        config = self.config
        single_space = gym.spaces.Dict({}) if self.multi_agent else self.observation_space
        self.obs_spec = ObsSpec(single_space)
        self.normalizer: Normalizer | PolicyNormalizers = Normalizer(single_space, config)
        if self.multi_agent:  # a policy's statistics are its own (its agents' observations and returns)
            from herdrl.multi_agent import policy_config

            self.normalizer = PolicyNormalizers(self.observation_space, {
                pid: policy_config(config, pid) for pid in self.observation_space})
        if (config.observation_filter == "MeanStdFilter" and not self.normalizer.observations
                and config.is_explicit("observation_filter")):  # (an LSTM default has nothing to say here)
            logger.warning("herdrl: observation_filter=MeanStdFilter has nothing to filter in %s (it normalises "
                           "Box leaves that are not images)", self.observation_space)

    def _build_learners(self) -> None:
        """The learner group (in the driver, or N Ray actors) with the algorithm's module, and the schedules its
        updates follow; the runners are stopped if it cannot be built."""
        config = self.config
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

    def _build_policies(self) -> None:
        """The trained policies over the driver's module: ``policy``, or a multi-agent run's ``policies``."""
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

    def _init_run_state(self) -> None:
        """A new run's counters, episode windows and last result, and no checkpoint written yet."""
        self._save_dir: Path | None = None  # where save() without a path writes, with no result folder
        self.last_checkpoint: Path | None = None  # written or restored; named when a learner actor fails
        self._array_checkpoints: list[Path] = []  # checkpoints this instance wrote array files (replay) into
        self.last_result: dict[str, Any] = Result()
        self.iteration = 0
        self.env_steps_lifetime = 0
        self.agent_steps_lifetime = 0  # multi-agent: decisions of all agents
        self.policy_steps_lifetime: dict[str, int] = {}  # multi-agent: each trained policy's agent steps
        self.episodes_lifetime = 0
        self.time_total_s = 0.0
        self._returns: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self._lengths: deque[int] = deque(maxlen=EPISODE_WINDOW)
        # Multi-agent: the returns of each agent and of each policy's agents, "agent/<id>" and "policy/<id>".
        self._part_returns: dict[str, deque[float]] = {}
        self._start_iteration_counts()
        self._degraded_said: tuple[int, int] | None = None
        self._nodes_lost_before = nodes_lost()

    def _start_iteration_counts(self) -> None:
        """Zero what one iteration counts (its steps, episodes, lost fragments, sampling time)."""
        self._iter_steps = self._iter_episodes = self._iter_agent_steps = 0
        self._iter_policy_steps: dict[str, int] = {}
        self._iter_fragments_lost = self._iter_fragment_bytes = self._iter_extra_fragments = 0
        self._iter_sample_time = 0.0

    def _build_callbacks(self) -> None:
        """Callbacks (herdrl.callbacks) and the driver's metrics logger; custom metrics are reduced per iteration."""
        self.callbacks = Callbacks.from_config(self.config)
        self.metrics_logger = MetricsLogger()
        self._runner_metrics, self._driver_metrics = MetricsReducer(), MetricsReducer()

    def _set_up_algorithm(self) -> None:
        """The weights ``init_from`` names, the subclass's :meth:`setup`, then ``on_algorithm_init``; learners and
        runners are stopped if any of them fails."""
        #: Iterations (from the run's first) in which only the value head learns: a fresh one under a policy copied
        #: by ``init_from`` (herdrl.init_from).
        self._value_warmup_iters = 0
        self._policy_frozen = False
        try:
            if self.config.init_from:
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
        self._start_iteration_counts()
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
            "num_target_env_runners": self.runners.num_target,
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

    @property
    def env_runner_group(self) -> Any:
        """RLlib's ``algo.env_runner_group``, as far as scripts use it: ``foreach_env_runner(fn)`` and the runner
        counts (:class:`herdrl.rollout.group.EnvRunnerGroupView`)."""
        from herdrl.rollout.group import EnvRunnerGroupView

        return EnvRunnerGroupView(self.runners)

    def _snapshot(self) -> None:
        """Self-play: shift each policy's snapshots one older and copy the policy into the newest."""
        pairs = []
        for source, copies in self.config.self_play.items():
            pairs += [(copies[i - 1], copies[i]) for i in range(len(copies) - 1, 0, -1)] + [(source, copies[0])]
        self._copy_policies(pairs)

    def _copy_policies(self, pairs: list[tuple[str, str]]) -> None:
        """Copy each ``(source, target)`` policy's weights, and its normalisation statistics: a snapshot acts on
        observations normalised as its policy's were."""
        self.learners.apply("copy_policy", pairs)
        for source, target in pairs:
            self.normalizer.copy(source, target)

    def stop(self) -> None:
        """Release learners, runners (and a Ray this algorithm started), evaluation envs, and close the logger."""
        self._stop_evaluation()  # (first: an evaluation in flight ends before the runners and Ray it may use)
        self.learners.stop()
        self.runners.stop()
        if self.config.output:  # the runners wrote their last episodes: number them, write the metadata
            self._finish_recording()
        self._close_evaluation_envs()
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
