"""Result rows that also answer to RLlib's names, old and new, without holding them twice.

``algo.train()`` returns a :class:`Result`: a flat dict of herdrl's keys (what the CSV, JSON, TensorBoard and Tune
get). Reading it with an RLlib script's key works too::

    result["episode_reward_mean"]                     # RLlib's old stack: episode_return_mean
    result["timesteps_total"]                         # num_env_steps_sampled_lifetime
    result["env_runners"]["episode_return_mean"]      # RLlib's new stack nests the runners' metrics
    result["evaluation"]["env_runners"]["episode_return_mean"]   # evaluation/episode_return_mean
    result["env_runners"]["my_metric"]                # a callback's custom metric: env_runners/my_metric
    result["custom_metrics"]["ret_mean"]              # the old stack's episode.custom_metrics: custom_metrics/...
    result["learners"]["default_policy"]["policy_loss"]   # RLlib's new stack nests the learner's metrics by module

Those names are answered on reading (``[]``, ``get``, ``in``) and never stored, so nothing is written twice.
:func:`flat_name` maps them (and their ``/``-joined forms, as Tune names nested metrics) to herdrl's keys: what
stop criteria and Tune metrics go through.
"""

from __future__ import annotations

from typing import Any

#: RLlib's names of herdrl's flat keys (the old stack's, and a few new-stack spellings).
ALIASES: dict[str, str] = {
    "episode_reward_mean": "episode_return_mean",
    "episode_reward_min": "episode_return_min",
    "episode_reward_max": "episode_return_max",
    "timesteps_total": "num_env_steps_sampled_lifetime",
    "timesteps_this_iter": "num_env_steps_sampled",
    "episodes_total": "num_episodes_lifetime",
    "episodes_this_iter": "num_episodes",
    "agent_timesteps_total": "num_agent_steps_sampled_lifetime",
    "num_env_steps_sampled_lifetime": "num_env_steps_sampled_lifetime",
}

#: The keys RLlib's new stack reports under ``result["env_runners"]``.
ENV_RUNNER_KEYS = ("episode_return_mean", "episode_return_min", "episode_return_max", "episode_len_mean",
                   "num_env_steps_sampled", "num_env_steps_sampled_lifetime", "num_episodes", "num_episodes_lifetime",
                   "num_healthy_env_runners", "num_env_runner_restarts", "num_agent_steps_sampled",
                   "num_agent_steps_sampled_lifetime")

#: RLlib's module id of a single-agent run's module, and the key of metrics over all modules.
DEFAULT_MODULE_ID, ALL_MODULES = "default_policy", "__all_modules__"

#: Keys of a single-agent row that are not the learner's (the runners', the driver's, the clock's and Tune's own):
#: ``result["learners"]`` holds the others (the learner's metrics and the scheduled hyperparameters).
NOT_LEARNER_KEYS = frozenset(ENV_RUNNER_KEYS) | {
    "training_iteration", "env_steps_per_s", "num_fragments_lost", "num_env_runners_waiting", "num_extra_fragments",
    "num_nodes_lost", "num_learner_restarts", "num_learner_updates_lost", "object_store_bytes",
    "object_store_fraction", "fragment_bytes_per_env_step", "policy_frozen", "time_this_iter_s", "time_total_s",
    "sample_time_s", "learn_time_s",
    # what Ray Tune adds to a trial's rows
    "timestamp", "date", "done", "trial_id", "hostname", "node_ip", "pid", "time_since_restore",
    "iterations_since_restore", "timesteps_since_restore", "checkpoint_dir_name", "config", "should_checkpoint",
    "experiment_tag"}


def flat_name(name: str) -> str:
    """herdrl's key for an RLlib result name: ``episode_reward_mean`` -> ``episode_return_mean``,
    ``env_runners/episode_return_mean`` -> ``episode_return_mean``, ``evaluation/env_runners/episode_return_mean``
    -> ``evaluation/episode_return_mean``; other names unchanged."""
    prefix = ""
    if name.startswith("evaluation/"):
        prefix, name = "evaluation/", name[len("evaluation/"):]
    if name.startswith("learners/"):  # learners/<module>/<key>: a single-agent row's <key>, else <module>/<key>
        module, _, inner = name[len("learners/"):].partition("/")
        if inner:
            return prefix + (inner if module in (DEFAULT_MODULE_ID, ALL_MODULES) else f"{module}/{inner}")
    if name.startswith("env_runners/"):
        inner = name[len("env_runners/"):]
        if inner in ENV_RUNNER_KEYS or inner in ALIASES:  # else a custom metric, kept as env_runners/<key>
            name = inner
    return prefix + ALIASES.get(name, name)


class Result(dict):
    """One iteration's row: herdrl's flat keys, readable by RLlib's names too (see the module docstring)."""

    def __missing__(self, key: Any) -> Any:
        if key == "env_runners":  # herdrl's runner keys, and custom metrics logged in runners (env_runners/<key>)
            return Result({**{k: dict.__getitem__(self, k) for k in ENV_RUNNER_KEYS if dict.__contains__(self, k)},
                           **self._group("env_runners/")})
        if key == "learners":
            return Result(self._learners())
        if isinstance(key, str) and "/" not in key:  # a group of keys: evaluation/..., custom_metrics/...
            inner = self._group(f"{key}/")
            if inner:
                return Result(inner)
        if isinstance(key, str):
            flat = flat_name(key)
            if flat != key and dict.__contains__(self, flat):
                return dict.__getitem__(self, flat)
        raise KeyError(key)

    def _learners(self) -> dict[str, Result]:
        """RLlib's ``result["learners"]``: module id -> its learner metrics. A single-agent row's module is
        ``default_policy`` (``__all_modules__`` the same); a multi-agent row's are its policies, each with its
        ``<policy>/<key>`` metrics and ``<key>/<policy>`` scheduled values."""
        policies = sorted(self._group("policy_return_mean/"))
        if not policies:
            own = Result({k: v for k, v in self.items() if isinstance(k, str) and "/" not in k
                          and k not in NOT_LEARNER_KEYS})
            return {DEFAULT_MODULE_ID: own, ALL_MODULES: own}
        return {pid: Result({**self._group(f"{pid}/"), **{k[:-len(pid) - 1]: v for k, v in self.items()
                                                          if isinstance(k, str) and k.endswith(f"/{pid}")
                                                          and "/" not in k[:-len(pid) - 1]
                                                          and k.split("/")[0] not in ("agent_return_mean",
                                                                                      "policy_return_mean",
                                                                                      "score_vs_random")}})
                for pid in policies}

    def _group(self, prefix: str) -> dict[str, Any]:
        return {k[len(prefix):]: v for k, v in self.items() if isinstance(k, str) and k.startswith(prefix)}

    def get(self, key: Any, default: Any = None) -> Any:
        """``self[key]`` (RLlib's names included), or ``default``."""
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key):
            return True
        try:
            self[key]
        except KeyError:
            return False
        return True


class EvaluationResult(Result):
    """What ``algo.evaluate()`` returns: herdrl's ``evaluation/...`` keys, also read as RLlib's ``evaluate()``
    nests them, without the prefix: ``["env_runners"]["episode_return_mean"]``, ``["episode_reward_mean"]``."""

    def __missing__(self, key: Any) -> Any:
        if isinstance(key, str) and not key.startswith("evaluation"):
            inner = Result(self._group("evaluation/"))
            if key in inner:
                return inner[key]
        return super().__missing__(key)
