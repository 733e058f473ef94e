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

Groups are live views of the flat keys, writable as RLlib's nested dicts are: in ``on_train_result``,
``result["custom_metrics"]["x"] = v`` sets ``custom_metrics/x`` in the row (``custom_metrics``, ``env_runners`` and
``learners`` exist even while empty), and a dict set as a value is flattened to ``<key>/<leaf>`` keys.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
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
    "num_target_env_runners",
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


#: Prefixes of keys only some rows have (evaluation iterations; a multi-agent run's per-policy returns and scores,
#: which are the runners' and the driver's, not a learner's).
SOMETIMES_PREFIXES = ("evaluation/", "score_vs_random/", "policy_return_mean/", "agent_return_mean/")

#: Groups every row has, as RLlib's rows do: a callback can write into them before anything was logged there.
ALWAYS_GROUPS = ("custom_metrics", "env_runners", "learners")


class Result(dict):
    """One iteration's row: herdrl's flat keys, readable by RLlib's names too (see the module docstring).

    A group (``result["custom_metrics"]``, ``["env_runners"]``, ``["learners"]``, ``["evaluation"]``, or any
    ``<name>`` with keys ``<name>/...``) is a live :class:`ResultGroup` view: what is written into it is written into
    the row, as ``<name>/<key>``. A dict stored as a value is held as it is until :meth:`flatten` turns it into
    ``<key>/<leaf>`` keys (the algorithm calls it after ``on_train_result``, before the row is logged)."""

    #: The policies of a multi-agent run (RLlib's module ids under ``result["learners"]``), set by the algorithm;
    #: empty: single-agent, or a row read back (its ``policy_return_mean/<policy>`` keys name them then).
    module_ids: tuple[str, ...] = ()

    def __missing__(self, key: Any) -> Any:
        return _find(self, "", key)

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

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """``self[key]`` if it answers (a group view included), else ``default``, stored first."""
        if key in self:
            return self[key]
        return dict.setdefault(self, key, default)

    def flatten(self) -> None:
        """Replace every dict value by its leaves, ``<key>/<leaf>`` (nested dicts joined with ``/`` too), added to
        the keys already there: the CSV, TensorBoard and trackers take numbers, and Tune names nested keys so. A
        dict set at ``learners`` goes through :class:`LearnersGroup` (a module's keys where the row reads them)."""
        while keys := [k for k, v in self.items() if isinstance(v, Mapping)]:
            for key in keys:
                value = dict.pop(self, key)
                if key == "learners":
                    LearnersGroup(self).update(value)  # (a module's dict: its keys; others: learners/<key>)
                    continue
                for leaf, inner in _leaves(value, f"{key}/"):
                    self[leaf] = inner


class ResultGroup(MutableMapping):
    """A live view of a row's keys under ``prefix`` (``result["custom_metrics"]`` is the keys
    ``custom_metrics/...``): reading, writing and deleting act on the row itself, so a callback's writes are logged.
    An ``env_runners`` group also answers herdrl's runner keys (:data:`ENV_RUNNER_KEYS`, at ``runners``)."""

    def __init__(self, row: Result, prefix: str, runners: str | None = None) -> None:
        self._row, self._prefix, self._runners = row, prefix, runners

    def _key(self, key: Any) -> str:
        """The row's key for this group's ``key``."""
        if not isinstance(key, str):
            raise KeyError(key)
        if self._runners is not None and ALIASES.get(key, key) in ENV_RUNNER_KEYS:
            return self._runners + ALIASES.get(key, key)
        return self._prefix + key

    def __getitem__(self, key: Any) -> Any:
        return _find(self._row, self._prefix, key, self._key(key))

    def __setitem__(self, key: Any, value: Any) -> None:
        self._row[self._key(key)] = value  # (a dict is flattened with the row)

    def __delitem__(self, key: Any) -> None:
        flat = self._key(key)
        if dict.__contains__(self._row, flat):
            del self._row[flat]
            return
        group = [k for k in self._row if isinstance(k, str) and k.startswith(f"{flat}/")]
        if not group:
            raise KeyError(key)
        for k in group:
            del self._row[k]

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        if self._runners is not None:
            seen.update(k for k in ENV_RUNNER_KEYS if dict.__contains__(self._row, self._runners + k))
            yield from (k for k in ENV_RUNNER_KEYS if k in seen)
        for key in list(self._row):
            if isinstance(key, str) and key.startswith(self._prefix):
                name = key[len(self._prefix):].split("/", 1)[0]  # a nested group is one key here
                if name not in seen:
                    seen.add(name)
                    yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


class LearnersGroup(ResultGroup):
    """RLlib's ``result["learners"]``: each module id (a single-agent row's ``default_policy`` and
    ``__all_modules__``; a multi-agent row's policies) is a live :class:`ModuleView` of its learner metrics; other
    keys are the ``learners/...`` keys written there. A dict set at a module id sets its keys in the module's view
    (merged, not replacing the module's other keys)."""

    def __init__(self, row: Result) -> None:
        super().__init__(row, "learners/")

    def module_ids(self) -> list[str]:
        """The row's modules, as RLlib names them."""
        policies = self._row.module_ids or sorted(self._row._group("policy_return_mean/"))
        return list(policies) if policies else [DEFAULT_MODULE_ID, ALL_MODULES]

    def _module(self, key: Any) -> ModuleView | None:
        ids = self.module_ids()
        if key not in ids:
            return None
        single_agent = ids == [DEFAULT_MODULE_ID, ALL_MODULES] and not self._row.module_ids
        return ModuleView(self._row, None if single_agent else key)

    def __getitem__(self, key: Any) -> Any:
        module = self._module(key)
        return super().__getitem__(key) if module is None else module

    def __setitem__(self, key: Any, value: Any) -> None:
        module = self._module(key)
        if module is None:
            super().__setitem__(key, value)
        elif isinstance(value, Mapping):
            module.update(value)
        else:
            raise KeyError(f"result['learners'][{key!r}] is a module's metrics: set a dict, or keys inside it")

    def __delitem__(self, key: Any) -> None:
        module = self._module(key)
        if module is None:
            super().__delitem__(key)
        else:
            module.clear()

    def __iter__(self) -> Iterator[str]:
        written = list(super().__iter__())
        yield from written
        yield from (name for name in self.module_ids() if name not in written)


class ModuleView(MutableMapping):
    """One module's learner metrics in a row, live: a single-agent row's own top-level keys that are the learner's
    (``policy``: None; the keys of :data:`NOT_LEARNER_KEYS` are not), or a policy's ``<policy>/<key>`` metrics and
    ``<key>/<policy>`` scheduled values. A write sets the key the row reads it from (``<key>``, or
    ``<policy>/<key>`` for a new one), which is where :func:`flat_name` maps ``learners/<module>/<key>``."""

    def __init__(self, row: Result, policy: str | None) -> None:
        self._row, self._policy = row, policy

    def _keys(self) -> dict[str, str]:
        """This module's names -> the row's keys."""
        row, pid = self._row, self._policy
        if pid is None:
            return {k: k for k in row if isinstance(k, str) and "/" not in k and k not in NOT_LEARNER_KEYS}
        keys = {k[:-len(pid) - 1]: k for k in row
                if isinstance(k, str) and k.endswith(f"/{pid}") and "/" not in k[:-len(pid) - 1]
                and not k.startswith(SOMETIMES_PREFIXES)}
        keys.update({k[len(pid) + 1:]: k for k in row if isinstance(k, str) and k.startswith(f"{pid}/")})
        return keys

    def __getitem__(self, key: Any) -> Any:
        keys = self._keys()
        if key not in keys:
            raise KeyError(key)
        return dict.__getitem__(self._row, keys[key])

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(key, str):
            raise KeyError(key)
        if self._policy is None and (key in NOT_LEARNER_KEYS or "/" in key):
            raise KeyError(f"{key!r} is not a learner's metric name here (a key of the runners, the driver or Tune, "
                           "or one with '/'): choose another")
        self._row[self._keys().get(key, key if self._policy is None else f"{self._policy}/{key}")] = value

    def __delitem__(self, key: Any) -> None:
        del self._row[self._keys()[key]]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._keys()))

    def __len__(self) -> int:
        return len(self._keys())

    def __repr__(self) -> str:
        return repr(dict(self.items()))


def _find(row: Result, prefix: str, key: Any, flat: str | None = None) -> Any:
    """``key`` of the group ``prefix`` of ``row`` (``""``: the row itself): a value, a group's view, or
    ``KeyError``. ``flat``: the row's key for it, if not ``prefix + key``."""
    if not isinstance(key, str):
        raise KeyError(key)
    flat = prefix + key if flat is None else flat
    if dict.__contains__(row, flat):
        return dict.__getitem__(row, flat)
    if key == "env_runners":  # herdrl's runner keys, and custom metrics logged in runners (env_runners/<key>)
        return ResultGroup(row, f"{flat}/", runners=prefix)
    if key == "learners" and not prefix:  # what is written there, and RLlib's learner metrics by module
        return LearnersGroup(row)
    if (not prefix and key in ALWAYS_GROUPS) or any(isinstance(k, str) and k.startswith(f"{flat}/") for k in row):
        return ResultGroup(row, f"{flat}/")
    alias = prefix + flat_name(key)
    if alias != flat and dict.__contains__(row, alias):
        return dict.__getitem__(row, alias)
    module, _, inner = key.removeprefix("learners/").partition("/")
    if not prefix and key.startswith("learners/") and inner:  # a multi-agent run's policy named default_policy
        with contextlib.suppress(KeyError):
            return LearnersGroup(row)[module][inner]
    raise KeyError(key)


def _leaves(value: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, inner in value.items():
        if isinstance(inner, Mapping):
            yield from _leaves(inner, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", inner


class EvaluationResult(Result):
    """What ``algo.evaluate()`` returns: herdrl's ``evaluation/...`` keys, also read as RLlib's ``evaluate()``
    nests them, without the prefix: ``["env_runners"]["episode_return_mean"]``, ``["episode_reward_mean"]``."""

    def __missing__(self, key: Any) -> Any:
        if isinstance(key, str) and not key.startswith("evaluation"):
            inner = Result(self._group("evaluation/"))
            if key in inner:
                return inner[key]
        return super().__missing__(key)
