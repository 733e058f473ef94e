"""Evaluation on env runners of its own, as RLlib does it (``evaluation_num_env_runners``, the ``timesteps`` unit)."""

from __future__ import annotations

import math
import time
from typing import Any

from herdrl.evaluation import Deadline, say_cut, summarize

#: Steps per env each evaluation call samples (between checks of the episodes finished and of the timeout).
EVALUATION_CHUNK = 256
#: Evaluations are told apart from training's random streams (a runner's reseed epoch) by this offset.
EVALUATION_EPOCH = 1_000_000_000


class RunnerEvaluation:
    """Evaluation on env runners of its own, as RLlib does it: ``evaluation_num_env_runners`` Ray actors (restarted
    like training runners when they fail), or, for the ``timesteps`` unit without them, one runner in the driver.

    ``episodes`` unit: every runner starts each evaluation with fresh episodes and samples until
    ``evaluation_duration`` episodes have finished over all of them, taken in runner order within a round (with
    several env copies per runner, short episodes are favoured, as in RLlib). ``timesteps`` unit:
    ``evaluation_duration`` env steps over all runners, episodes carried over from one evaluation to the next, those
    that finish counted. Both sample in
    rounds of at most :data:`EVALUATION_CHUNK` steps per env (or ``rollout_fragment_length`` of
    ``evaluation_config``), shortened to fit the time left when earlier rounds say they would not; an evaluation
    stops after ``evaluation_sample_timeout_s`` with what finished by then, and a line saying so (a Ray runner's
    round still running at that moment is left out; the driver's own runner stops between rounds).
    """

    def __init__(self, config: Any, observation_space: Any = None, action_space: Any = None) -> None:
        """``observation_space``, ``action_space``: the trained policy's; evaluation envs with others are refused."""
        self.config = config
        self.runner_config = config.evaluation_runner_config()
        self.group: Any = None
        self.runner: Any = None
        self.cancelled = False  # set by the algorithm's stop(): an evaluation in flight ends after its round
        self._count = 0  # evaluations so far: each loads its weights on every runner
        if config.evaluation_num_env_runners:
            from herdrl.rollout.group import RayRunnerGroup

            # Inside a Tune trial its bundles follow the driver's, the training runners' and the learners'.
            self.group = RayRunnerGroup(self.runner_config, first_bundle=1 + config.num_env_runners +
                                        config.num_learners, label="evaluation runner")
        else:
            from herdrl.rollout.runner import EnvRunner

            self.runner = EnvRunner(self.runner_config, worker_index=0)
        where = self.group if self.group is not None else self.runner
        if observation_space is not None and (where.observation_space, where.action_space) != (observation_space,
                                                                                                 action_space):
            self.stop()
            from herdrl.errors import ConfigError

            raise ConfigError(f"the evaluation env has spaces {where.observation_space}, {where.action_space}; the "
                              f"policy was trained on {observation_space}, {action_space}: check evaluation_config")

    def run(self, weights: dict[str, Any], iteration: int) -> dict[str, float]:
        """One evaluation with ``weights``; its ``evaluation/...`` metrics."""
        start = time.perf_counter()
        cfg, runner_cfg = self.config, self.runner_config
        explore = bool(cfg.evaluation_config.get("explore", False))
        max_steps = cfg.evaluation_config.get("max_steps")
        episodes = cfg.evaluation_duration_unit == "episodes"
        self._count += 1
        evaluation = (self._count, EVALUATION_EPOCH + iteration)  # (its id, the epoch its random streams take)
        if self.group is not None:
            import ray

            weights = ray.put(weights)  # one copy for every call of this evaluation
        envs = runner_cfg.num_envs_per_env_runner
        chunk = cfg.evaluation_config.get("rollout_fragment_length", "auto")
        chunk = EVALUATION_CHUNK if chunk == "auto" else int(chunk)
        deadline = Deadline(cfg.evaluation_sample_timeout_s)
        returns: list[float] = []
        lengths: list[int] = []
        steps = steps_per_env = 0
        step_s = 0.0  # the slowest round's seconds per step (per env), to fit the next round in the time left
        cut = ""
        while (len(returns) if episodes else steps) < cfg.evaluation_duration:
            if max_steps is not None and steps_per_env >= max_steps:
                cut, change = f"evaluation_config max_steps={max_steps}", "raise it to let them finish"
                break
            if deadline.passed():
                cut, change = deadline.bound, deadline.change
                break
            if self.cancelled:
                cut, change = "the run's stop", ""
                break
            runners = self.group.num_healthy if self.group is not None else 1
            count = chunk if episodes else min(chunk, math.ceil((cfg.evaluation_duration - steps) /
                                                                (max(runners, 1) * envs)))
            if max_steps is not None:
                count = min(count, max_steps - steps_per_env)
            left = deadline.left()
            if left is not None and step_s > 0:  # a round past the deadline would be lost (Ray) or late (driver)
                count = max(1, min(count, int(left / step_s)))
            args = (weights, explore, evaluation, episodes, count)
            began = time.monotonic()
            answers = self.group.call_each("evaluation_sample", *args, deadline_s=left) if self.group is not None \
                else [self.runner.evaluation_sample(*args)]
            for part_returns, part_lengths, part_steps in answers:
                returns += part_returns
                lengths += part_lengths
                steps += part_steps
            steps_per_env += count
            step_s = max(step_s, (time.monotonic() - began) / count)
        if cut:
            say_cut(cut, len(returns), change)
        if episodes:
            returns, lengths = returns[:cfg.evaluation_duration], lengths[:cfg.evaluation_duration]
        metrics = {**summarize(returns, lengths, "evaluation/"), "evaluation/num_env_steps_sampled": steps}
        if episodes:
            metrics["evaluation/num_episodes_cut"] = cfg.evaluation_duration - len(returns)
        if self.group is not None:
            metrics["evaluation/num_healthy_env_runners"] = self.group.num_healthy
        metrics["evaluation/time_s"] = time.perf_counter() - start
        return metrics

    def stop(self) -> None:
        """Stop the evaluation runners (or close the driver's envs)."""
        if self.group is not None:
            self.group.stop()
        if self.runner is not None:
            self.runner.stop()
