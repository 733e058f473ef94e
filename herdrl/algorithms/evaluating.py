"""Evaluation of an algorithm's policies: single-agent on the driver's env copies, multi-agent on the driver's
runner, on evaluation runners of its own (in parallel to training or not), and the scores against random players.

:class:`Evaluating` is mixed into :class:`~herdrl.algorithms.base.Algorithm`, which calls :meth:`evaluate` (or
starts a parallel evaluation) from its train loop; the episodes themselves play in :mod:`herdrl.evaluation`,
:mod:`herdrl.rollout.evaluation` and :mod:`herdrl.rollout.multi_agent`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from herdrl.env.previous import previous_inputs
from herdrl.results import EvaluationResult, Result


class Evaluating:
    """Evaluation and the scores against random players; its state is made on first use, released by ``stop()``."""

    #: The evaluation time bound's name in the line a cut evaluation leaves (``herd evaluate`` names its --timeout-s).
    _timeout_option = "evaluation_sample_timeout_s"
    _evaluator: Any = None  # the driver's evaluation env copies (multi-agent: its runner), made on first use
    _runner_evaluation: Any = None  # herdrl.rollout.evaluation.RunnerEvaluation, made on first use
    _evaluation_thread: Any = None  # evaluation_parallel_to_training: where it runs

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

    def _stop_evaluation(self) -> None:
        """Release what evaluation started on runners: its thread (after the round in flight) and its runners."""
        if self._runner_evaluation is not None:
            self._runner_evaluation.cancelled = True  # an evaluation in flight ends after its round
        if self._evaluation_thread is not None:
            self._evaluation_thread.shutdown(wait=True)
        if self._runner_evaluation is not None:
            self._runner_evaluation.stop()

    def _close_evaluation_envs(self) -> None:
        """Close the driver's evaluation env copies (after the learners, runners and recording: an env whose
        ``close`` fails leaves none of those unstopped)."""
        if self._evaluator is not None:
            (self._evaluator.stop if self.multi_agent else self._evaluator.close)()


def _evaluation_result(metrics: dict[str, float]) -> Result:
    """Evaluation metrics as RLlib's ``on_evaluate_end`` gets them: ``["env_runners"]["episode_return_mean"]`` (also
    ``["episode_return_mean"]``)."""
    return Result({key.removeprefix("evaluation/"): value for key, value in metrics.items()})


