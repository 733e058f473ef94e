"""Algorithm configs with RLlib's builder methods and key names.

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=16)
        .training(lr=1e-3, minibatch_size=256)
        .debugging(seed=1)
    )
    algo = config.build()

Every key is declared once, with its default, type and allowed range, in a
`Field` table: ``AlgorithmConfig.FIELDS`` holds the keys every algorithm shares
(:mod:`herdrl.config_fields`), each algorithm file adds its own. The older
spellings users have in RLlib scripts (``num_workers``,
``.rollouts(num_rollout_workers=...)``, ``sgd_minibatch_size``, ...) are aliases
that map onto the same keys.

Here: the keys and RLlib's builder sections that set them, copying, schedules
and what a config builds. RLlib's other calls (``.exploration()``,
``.rl_module()``, ``.reporting()``, ...) are translated in
:mod:`herdrl.config_rllib`; ``validate()`` and its checks are in
:mod:`herdrl.config_checks`.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

# The field table, RLlib's other calls and the checks live in modules of their own; their names stay importable from
# here, where algorithm files and older code import them (the set of notes said, _NOTED, is replaced in config_rllib).
from herdrl.config_checks import ConfigChecks, _positive_int, check_model  # noqa: F401
from herdrl.config_fields import (  # noqa: F401
    ACTIVATIONS,
    MODEL_DEFAULTS,
    SHARED_FIELDS,
    VALUE_NORMALIZATION,
    Field,
    shared_field,
)
from herdrl.config_rllib import (  # noqa: F401
    _DQN_EXPLORATION,
    _EPSILON_GREEDY_DEFAULTS,
    _NOTED,
    _RLLIB_DEBUGGING,
    RLlibCalls,
    _epsilon_greedy,
    _epsilon_greedy_settings,
    _note,
)
from herdrl.errors import ConfigError, did_you_mean
from herdrl.site_keys import MASKED, SITE_KEYS, mask_site_values  # noqa: F401 (this module's names too)


class AlgorithmConfig(RLlibCalls, ConfigChecks):
    """Settings of one experiment, shared by every algorithm.

    Values are read and written as attributes (``config.lr``); the builder
    methods (``.environment()``, ``.env_runners()``, ``.training()``, ...)
    set several at once and return the config so calls chain. Values are
    checked by ``validate()``, which ``build()`` calls.
    """

    #: The algorithm name (``"PPO"``); set by each subclass.
    algo_name: str = ""
    #: Whether N learners can split its updates (TRPO: no, see its learner).
    data_parallel: bool = True
    #: Whether ``model={"use_lstm": True}`` is supported (on-policy algorithms that unroll sequences).
    supports_lstm: bool = False
    #: Whether runners of a recurrent policy ship the state entering each training sequence
    #: (``Fragment.state_in``, ``state_last``): on-policy LSTMs unroll from them; QMIX's windows start from zeros.
    reads_sequence_states: bool = True
    #: Whether fragments carry raw observations and rewards (replay buffers normalise each replayed batch).
    stores_raw_transitions: bool = False
    #: Whether ``.multi_agent()`` runs can use it (its learner trains one policy per id).
    supports_multi_agent: bool = False
    #: Whether its multi-agent runs can have critics that see the global state (``centralized_critic``, MAPPO).
    supports_centralized_critic: bool = False
    #: Whether it learns from a recorded dataset (``.offline_data(input_=...)``) instead of sampling an env.
    learns_offline: bool = False
    #: Whether its runners sample while its learner learns (IMPALA, APPO): the slower of the two bounds a run
    #: (:mod:`herdrl.sizing`), not their sum.
    samples_while_learning: bool = False
    #: Whether it reads a recorded dataset (``.offline_data(input_=...)``): offline algorithms, and IQL online.
    reads_datasets: bool = False
    #: The result key the algorithm is judged by: its "solved" and default stop criterion, what ``herd plot`` draws
    #: and what keeps the best checkpoint. The training return, or for algorithms that explore while they train
    #: (DQN, SAC, TD3) the greedy evaluation return.
    stop_metric: str = "episode_return_mean"

    #: The keys every algorithm shares (:mod:`herdrl.config_fields`); each algorithm's class adds its own.
    FIELDS: dict[str, Field] = SHARED_FIELDS

    #: Older or RLlib-specific spellings -> the key they mean.
    ALIASES: dict[str, str] = {
        "num_workers": "num_env_runners",
        "num_rollout_workers": "num_env_runners",
        "num_envs_per_worker": "num_envs_per_env_runner",
        "num_cpus_per_worker": "num_cpus_per_env_runner",
        "num_cpus_per_rollout_worker": "num_cpus_per_env_runner",
        "num_gpus_per_worker": "num_gpus_per_env_runner",
        "num_gpus_per_rollout_worker": "num_gpus_per_env_runner",
        "ignore_worker_failures": "ignore_env_runner_failures",
        "recreate_failed_workers": "restart_failed_env_runners",
        "recreate_failed_env_runners": "restart_failed_env_runners",
        "max_num_worker_restarts": "max_num_env_runner_restarts",
        "callbacks": "callbacks_class",  # RLlib's config dict key
        "evaluation_num_workers": "evaluation_num_env_runners",
    }

    #: Defaults a recurrent run (``model={"use_lstm": True}``) takes for the keys the user did not set: what the
    #: algorithm's ordinary defaults are tuned for is not what an LSTM needs.
    LSTM_DEFAULTS: dict[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "build_module" in cls.__dict__:  # it would skip the per-policy networks of multi-agent runs
            raise TypeError(f"{cls.__name__} overrides build_module: override build_policy_module (one policy's "
                            "network) instead; build_module builds one per policy in multi-agent runs")

    def __init__(self) -> None:
        values = {key: copy.deepcopy(f.default) for key, f in self.fields().items()}
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_explicit", set())  # keys the user set
        object.__setattr__(self, "_by_schedule_key", set())  # keys set by lr_schedule / entropy_coeff_schedule
        object.__setattr__(self, "_exploration_type", None)  # the last exploration_config type (None: the default)

    # ----------------------------------------------------------------- keys
    @classmethod
    def fields(cls) -> dict[str, Field]:
        """All keys of this config class: the shared ones plus the algorithm's own."""
        merged: dict[str, Field] = {}
        for klass in reversed(cls.__mro__):
            merged.update(klass.__dict__.get("FIELDS", {}))
        return merged

    @classmethod
    def aliases(cls) -> dict[str, str]:
        """All accepted alternative spellings of this config class's keys."""
        merged: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            merged.update(klass.__dict__.get("ALIASES", {}))
        return merged

    @classmethod
    def canonical_key(cls, key: str) -> str:
        """Map an alias to its key; raise ConfigError naming the nearest key for unknown ones."""
        given, key = key, cls.aliases().get(key, cls.SCHEDULE_ALIASES.get(key, key))
        if key not in cls.fields():
            known = list(cls.fields()) + list(cls.aliases())
            hint = did_you_mean(given, known)
            if not hint:  # another algorithm's key (`input` given to PPO): say whose
                from herdrl.registry import algorithms_with_key

                owners = [name for name in algorithms_with_key(given) if name != cls.algo_name]
                hint = f" (a key of {', '.join(owners)})" if owners else ""
            where = f" for {cls.algo_name}" if cls.algo_name else ""
            raise ConfigError(f"unknown config key '{given}'{where}{hint}")
        return key

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in type(self).SCHEDULE_ALIASES:  # RLlib's lr_schedule: the schedule, or None for a plain value
            from herdrl.schedules import is_schedule

            value = values.get(type(self).SCHEDULE_ALIASES[name])
            return value if is_schedule(value) else None
        key = type(self).aliases().get(name, name)
        if key in values:
            return values[key]
        raise AttributeError(f"{type(self).__name__} has no attribute '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        key = self.canonical_key(name)
        if name in self.SCHEDULE_ALIASES or key in self._by_schedule_key:
            self._set(None, {name: value})  # the schedule keys' precedence (see _set)
            return
        self._explicit.add(key)
        self._values[key] = value

    def is_explicit(self, key: str) -> bool:
        """Whether the user set ``key``, rather than leaving it to a default."""
        return key in self._explicit

    #: RLlib's older schedule keys -> the key they schedule (``lr_schedule=[[0, 1e-3], ...]`` sets ``lr``; None:
    #: no schedule, as RLlib's default).
    SCHEDULE_ALIASES: dict[str, str] = {"lr_schedule": "lr", "entropy_coeff_schedule": "entropy_coeff"}

    def _set(self, group: str | None, kwargs: Mapping[str, Any]) -> AlgorithmConfig:
        fields = self.fields()
        scheduled = {self.SCHEDULE_ALIASES[k]: v for k, v in kwargs.items() if k in self.SCHEDULE_ALIASES}
        for alias in (k for k in kwargs if k in self.SCHEDULE_ALIASES):
            if self.SCHEDULE_ALIASES[alias] not in fields:
                raise ConfigError(f"unknown config key '{alias}' for {self.algo_name}: it has no "
                                  f"'{self.SCHEDULE_ALIASES[alias]}' to schedule")
        kwargs = {k: v for k, v in kwargs.items() if k not in self.SCHEDULE_ALIASES}
        # A schedule set by RLlib's lr_schedule / entropy_coeff_schedule wins over a plain lr / entropy_coeff, in the
        # same call or a later one (as in RLlib).
        from herdrl.schedules import is_schedule

        for key, value in scheduled.items():
            if value is not None:
                kwargs[key] = value
                self._by_schedule_key.add(key)
        for name, value in kwargs.items():
            key = self.canonical_key(name)
            if key in self._by_schedule_key and key not in scheduled and not is_schedule(value):
                _note(f"{key}={value!r} after {key}_schedule", f"the {key}_schedule set before wins, as in RLlib")
                continue
            if group is not None and fields[key].group != group:
                raise ConfigError(
                    f"'{name}' is set with .{fields[key].group}(), not .{group}()")
            self._explicit.add(key)
            if key == "model":
                value = self._merged_model(value)
            self._values[key] = value
        return self

    def _merged_model(self, model: Any) -> Any:
        if not isinstance(model, Mapping):
            return model  # validate() names the type error
        for key in model:
            if key not in MODEL_DEFAULTS:
                raise ConfigError(
                    f"unknown model key '{key}'{did_you_mean(key, MODEL_DEFAULTS)}; "
                    f"known: {sorted(MODEL_DEFAULTS)}")
        return {**self._values["model"], **copy.deepcopy(dict(model))}

    # ------------------------------------------------------------- builders
    def environment(self, env: str | Callable | None = None, *, env_config: dict | None = None,
                    **kwargs: Any) -> AlgorithmConfig:
        """Set the env: a Gymnasium id or a ``register_env`` name, and its ``env_config``."""
        if env is not None:
            self._set("environment", {"env": env})
        if env_config is not None:
            self._set("environment", {"env_config": env_config})
        return self._set("environment", kwargs)

    def env_runners(self, **kwargs: Any) -> AlgorithmConfig:
        """Set sampling: ``num_env_runners``, ``num_envs_per_env_runner``, ``rollout_fragment_length``,
        ``num_cpus_per_env_runner``, ``gym_env_vectorize_mode``; RLlib's ``explore`` and ``exploration_config``
        go to :meth:`exploration`."""
        explore = {key: kwargs.pop(key) for key in ("explore", "exploration_config") if key in kwargs}
        if explore:
            self.exploration(**explore)
        return self._set("env_runners", kwargs)

    def rollouts(self, **kwargs: Any) -> AlgorithmConfig:
        """Older name of :meth:`env_runners` (accepts ``num_rollout_workers``, ``num_envs_per_worker``)."""
        return self.env_runners(**kwargs)

    def resources(self, **kwargs: Any) -> AlgorithmConfig:
        """Set resources and where to run: ``num_gpus`` for the learner, ``address`` of a Ray cluster to join
        (``HOST:PORT`` or ``auto``), ``node_ip_address``, ``ray_connect_timeout_s``, ``include_dashboard``,
        ``runtime_env`` (Ray's, for the whole job)."""
        return self._set("resources", kwargs)

    def learners(self, **kwargs: Any) -> AlgorithmConfig:
        """Set where learning runs: ``num_learners`` (0: in the driver; N: N data-parallel learner actors, which
        split every minibatch and all-reduce gradients), ``num_cpus_per_learner``, ``num_gpus_per_learner``
        (fractions allowed), ``num_aggregator_actors_per_learner``, ``shard_fragments`` (each learner its own
        share of the fragments), ``mixed_precision`` (``"bf16"``), ``learner_timeout_s``."""
        return self._set("learners", kwargs)

    def fault_tolerance(self, **kwargs: Any) -> AlgorithmConfig:
        """Set what happens when a runner or learner fails: ``restart_failed_env_runners`` (default True),
        ``ignore_env_runner_failures`` (default False), ``max_num_env_runner_restarts``, ``keep_train_batch_size``
        (default True), ``restart_failed_learners`` (default True), ``max_num_learner_restarts``,
        ``learner_state_interval`` (default 10)."""
        return self._set("fault_tolerance", kwargs)

    def training(self, **kwargs: Any) -> AlgorithmConfig:
        """Set learning keys: ``lr``, ``gamma``, ``train_batch_size``, ``grad_clip``, ``model`` and the
        algorithm's own (see its ``FIELDS``)."""
        if "lambda" in kwargs and "lambda_" in self.fields():  # a Python keyword: only reachable via **{"lambda": ...}
            kwargs = {("lambda_" if k == "lambda" else k): v for k, v in kwargs.items()}
        return self._set("training", kwargs)

    def framework(self, framework: str = "torch", **_ignored: Any) -> AlgorithmConfig:
        """Accepts ``"torch"`` (herdrl's only framework); anything else is a clear error."""
        if framework != "torch":
            raise ConfigError(f"framework '{framework}' is not supported: herdrl runs on PyTorch; "
                              "use .framework('torch') or drop the call")
        return self

    def evaluation(self, **kwargs: Any) -> AlgorithmConfig:
        """Set periodic evaluation: ``evaluation_interval`` (iterations), ``evaluation_duration`` (episodes),
        ``evaluation_config`` (``explore``, default False; ``env_config`` overrides; ``max_steps``: stop an
        evaluation after this many steps, leaving unfinished episodes out — long Atari games). Results appear as
        ``evaluation/episode_return_mean`` etc. in the iterations that evaluate."""
        return self._set("evaluation", kwargs)

    def callbacks(self, callbacks_class: Any = None, **hooks: Any) -> AlgorithmConfig:
        """Set callbacks (``herdrl.callbacks``): a class with RLlib's hooks (``RLlibCallback`` or
        ``DefaultCallbacks`` subclass), a list of them, or ``"module:Class"``; and/or functions per hook, e.g.
        ``.callbacks(on_train_result=fn)`` (added to those set before)."""
        if callbacks_class is not None:
            self._set("callbacks", {"callbacks_class": callbacks_class})
        if hooks:
            from herdrl.callbacks import check_hooks

            check_hooks(hooks)
            self._set("callbacks", {"callbacks_hooks": {**self.callbacks_hooks, **hooks}})
        return self

    def multi_agent(self, **kwargs: Any) -> AlgorithmConfig:
        """Set several agents' policies (PettingZoo envs, ``herdrl.multi_agent``): ``policies``,
        ``policy_mapping_fn``, ``policies_to_train`` (RLlib's names), ``self_play`` and ``self_play_interval``,
        ``random_opponent_interval`` and ``random_opponent_games`` (turn-based zero-sum games: a score against
        random legal moves), ``centralized_critic`` (MAPPO: critics that see the global state)."""
        return self._set("multi_agent", kwargs)

    def offline_data(self, **kwargs: Any) -> AlgorithmConfig:
        """Recorded data (RLlib's names): ``output`` (every algorithm that samples an env: record its training
        episodes into a dataset folder); ``input_`` and its reading keys (offline algorithms: BC, MARWIL, CQL, IQL:
        the dataset they learn from). See :mod:`herdrl.offline`."""
        reading = [key for key in kwargs if key not in ("output",)]
        if not self.reads_datasets and reading:
            raise ConfigError(f"{self.algo_name} learns from an env; .offline_data({', '.join(reading)}=...) is for "
                              "offline algorithms (BC, MARWIL, CQL, IQL); output=DIR records its episodes")
        return self._set("offline_data", kwargs)

    def debugging(self, *, seed: int | None = None, **kwargs: Any) -> AlgorithmConfig:
        """Set ``seed`` (same seed in-process -> identical results). RLlib's ``log_level``, ``log_sys_usage``,
        ``fake_sampler``, ``logger_config`` and ``logger_creator`` are accepted with a note (herdrl logs through
        the ``herdrl`` logger: set its level with :mod:`logging`)."""
        rllib_only = sorted(key for key in kwargs if key in _RLLIB_DEBUGGING)
        if rllib_only:
            _note(f".debugging({', '.join(rllib_only)})", "herdrl logs through the 'herdrl' logger (set its level "
                  "with logging); results go to the trial folder's CSV, JSON and TensorBoard files")
        return self._set("debugging", {"seed": seed, **{k: v for k, v in kwargs.items() if k not in rllib_only}})

    # -------------------------------------------------------- dict, copying
    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every key (JSON-serialisable when ``env`` is a name)."""
        return copy.deepcopy(self._values)

    def update_from_dict(self, config: Mapping[str, Any]) -> AlgorithmConfig:
        """Set keys from a dict that may use aliases (``num_workers``, ``lambda``, ...)."""
        config = dict(config)
        if "framework" in config:
            self.framework(config.pop("framework"))
        if "lambda" in config and "lambda_" in self.fields():  # (elsewhere refused as typed: 'lambda')
            config["lambda_"] = config.pop("lambda")
        return self._set(None, config)

    @classmethod
    def migrate_checkpoint_config(cls, config: dict[str, Any], format_version: int,
                                  spaces: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's config (written in ``format_version``) with each key given today's meaning; algorithms
        whose keys changed meaning override this. ``spaces``: the checkpoint's spaces (JSON form)."""
        return config

    def checkpoint_clash(self, meta: dict[str, Any], action_space: Any) -> str | None:
        """Why a checkpoint (its raw metadata) cannot be restored into a run of this config on ``action_space``
        (a mapping: each policy's), in a phrase; None when it can. Here: critics that read actions in other units
        (:func:`herdrl.checkpoint.critic_units_clash`); algorithms whose keys changed meaning extend this."""
        from herdrl.checkpoint import critic_units_clash

        return critic_units_clash(meta, self.algo_name, self.model, action_space)

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> AlgorithmConfig:
        """Build a config from RLlib's dict form, e.g. ``{"env": "CartPole-v1", "num_workers": 2}``."""
        return cls().update_from_dict(config)

    def copy(self) -> AlgorithmConfig:
        """An independent copy of this config."""
        clone = type(self)()
        object.__setattr__(clone, "_values", copy.deepcopy(self._values))
        object.__setattr__(clone, "_explicit", set(self._explicit))
        object.__setattr__(clone, "_by_schedule_key", set(self._by_schedule_key))
        object.__setattr__(clone, "_exploration_type", self._exploration_type)
        return clone

    def __repr__(self) -> str:
        return f"{type(self).__name__}({json.dumps(mask_site_values(self._values), default=repr)})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._values == self._values

    # ----------------------------------------------------------- evaluation
    def evaluation_runner_config(self) -> AlgorithmConfig:
        """The config of evaluation runners: this one with ``evaluation_config``'s runner keys, as many runners as
        ``evaluation_num_env_runners``, and no callbacks (episode hooks do not run in evaluation)."""
        config = self.copy()
        runner_keys = {self.aliases().get(k, k): v for k, v in self.evaluation_config.items()
                       if k not in ("explore", "max_steps")}
        if "env_config" in runner_keys:  # a partial override of the training env's, as in-process evaluation takes it
            runner_keys["env_config"] = {**self.env_config, **runner_keys["env_config"]}
        config._values.update({**runner_keys, "num_env_runners": self.evaluation_num_env_runners,
                               "callbacks_class": None, "callbacks_hooks": {}, "evaluation_num_env_runners": 0,
                               "output": None})  # (evaluation episodes are not training data)
        return config

    # ------------------------------------------------------------- schedules
    def decay_over(self, steps: int) -> AlgorithmConfig:
        """Give every named schedule (``{schedule: linear, start, end}``) without ``steps`` this many env steps (the
        run's ``--stop-timesteps``)."""
        self._values.update(self.decay_values_over(self._values, steps, multi_agent=self.is_multi_agent))
        return self

    @classmethod
    def decay_values_over(cls, values: Mapping[str, Any], steps: int, *, multi_agent: bool) -> dict[str, Any]:
        """``values`` (config keys, RLlib's names too) with each named schedule lacking ``steps`` given ``steps``
        env steps; a multi-agent run counts in each policy's agent steps, so there it is refused in one line."""
        from herdrl.schedules import with_steps

        fields, aliases = cls.fields(), cls.aliases()
        filled = dict(values)
        for key, value in values.items():
            field = fields.get(aliases.get(key, key))
            if field is None or not field.schedule:
                continue
            given = with_steps(value, steps)
            if given == value:
                continue
            if multi_agent:
                raise ConfigError(f"{key}: a multi-agent run counts schedules in each policy's own agent steps, "
                                  "not env steps: give the decay its steps")
            filled[key] = given
        return filled

    def schedules(self) -> dict[str, Any]:
        """Each key that takes a schedule -> its :class:`~herdrl.schedules.Schedule` (constant ones included)."""
        from herdrl.schedules import schedule_of

        return {key: schedule_of(key, self._values[key]) for key, f in self.fields().items() if f.schedule}

    # --------------------------------------------------------------- derived
    @property
    def is_multi_agent(self) -> bool:
        """Whether this run trains policies for the agents of a PettingZoo env."""
        from herdrl.env.multi_agent import is_pettingzoo_id

        return self.policies is not None or self.policy_mapping_fn is not None or is_pettingzoo_id(self.env)

    @property
    def total_cpus_requested(self) -> float:
        """CPUs the Ray actors of this config reserve (runners, learner actors, evaluation runners): what a private
        Ray offers."""
        evaluation = self.evaluation_num_env_runners and \
            self.evaluation_num_env_runners * self.evaluation_runner_config().num_cpus_per_env_runner
        return (self.num_env_runners * self.num_cpus_per_env_runner + self.num_learners * self.num_cpus_per_learner
                + evaluation)

    @property
    def learner_gpus(self) -> float:
        """GPUs of the learner in the driver (``num_gpus``, or ``num_gpus_per_learner`` with no learner actors)."""
        return self.num_gpus or (self.num_gpus_per_learner if self.num_learners == 0 else 0.0)

    @property
    def total_envs(self) -> int:
        """Envs stepping in parallel across all runners (the driver counts as one runner at 0)."""
        return max(self.num_env_runners, 1) * self.num_envs_per_env_runner

    def unshardable_updates(self) -> str | None:
        """Why ``shard_fragments`` would never shard this run's updates (too few fragments in each to give every
        learner its own), or None. An update samples one fragment from each runner."""
        if self.num_env_runners < self.num_learners:
            return "shards the fragments of Ray runners: set num_env_runners >= num_learners"
        return None

    def fragment_length(self) -> int:
        """Steps per env per ``sample()`` call, resolving ``"auto"`` from ``train_batch_size``."""
        if self.rollout_fragment_length == "auto":
            return max(1, math.ceil(self.train_batch_size / self.total_envs))
        return int(self.rollout_fragment_length)

    def build_module(self, observation_space: Any, action_space: Any) -> Any:
        """The network this algorithm learns; runners build the same. Multi-agent runs (spaces: policy id ->
        space) get one :meth:`build_policy_module` per policy. Algorithms override :meth:`build_policy_module`,
        never this, so every algorithm's networks work in multi-agent runs alike."""
        if isinstance(observation_space, dict):  # multi-agent: policy id -> space
            from herdrl.multi_agent import MultiAgentModule

            module = MultiAgentModule({pid: self.build_policy_module(space, action_space[pid])
                                       for pid, space in observation_space.items()})
        else:
            module = self.build_policy_module(observation_space, action_space)
        if self.model["init"] == "pytorch":
            from herdrl.models.encoders import pytorch_default_init

            pytorch_default_init(module)
        return module

    def build_policy_module(self, observation_space: Any, action_space: Any) -> Any:
        """One policy's network (an actor-critic by default: :meth:`actor_critic`)."""
        return self.actor_critic(observation_space, action_space, self.model)

    def actor_critic(self, observation_space: Any, action_space: Any, model: dict[str, Any]) -> Any:
        """An actor-critic sized by ``model``: recurrent with ``use_lstm``, with a critic that sees the global state
        with ``centralized_critic`` (MAPPO), its values normalised with ``value_normalization`` (PPO, A2C, TRPO)."""
        from herdrl.models import ActorCritic

        model = {**model, "value_normalization": bool(getattr(self, "value_normalization", False))}
        if model["use_lstm"]:
            from herdrl.models.recurrent import RecurrentActorCritic, RecurrentCentralCritic

            cls = RecurrentCentralCritic if self.centralized_critic else RecurrentActorCritic
            return cls(observation_space, action_space, model)
        if self.centralized_critic:
            from herdrl.models.actor_critic import CentralCriticActorCritic

            return CentralCriticActorCritic(observation_space, action_space, model)
        return ActorCritic(observation_space, action_space, model)

    def runner_blueprint(self, module: Any) -> Any:
        """The runner policy's numpy twin as plain data (an ``MLPBlueprint``: light Ray runners build their policy
        from it and never import torch, see :mod:`herdrl.rollout.light`); None: runners act in torch."""
        from herdrl.models.actor_critic import numpy_blueprint

        if type(self).runner_policy is not AlgorithmConfig.runner_policy:
            return None  # a runner policy of the algorithm's own, which a blueprint would not describe
        return numpy_blueprint(module)

    def runner_policy(self, module: Any, rng: Any) -> Any:
        """How runners pick actions with ``module``: its numpy twin where it has one, else torch."""
        from herdrl.models.actor_critic import TorchPolicy, numpy_twin

        return numpy_twin(module, rng) or TorchPolicy(module, rng)

    def recurrent_runner_policy(self, module: Any, rng: Any, num_envs: int) -> Any:
        """How runners pick actions with a recurrent ``module`` (a state per env, carried across fragments)."""
        from herdrl.models.recurrent import RecurrentPolicy

        return RecurrentPolicy(module, rng, num_envs)

    def build(self, logger: Any = None) -> Any:
        """Validate and return the algorithm (e.g. ``PPO``) ready to ``train()``.

        ``logger`` (a :class:`herdrl.logger.Logger`) receives each result row; None writes no files.
        ``num_env_runners="auto"`` / ``num_envs_per_env_runner="auto"`` are chosen as it builds, from measured
        costs (:mod:`herdrl.auto_size`; one line says the choice); this config keeps ``"auto"``.
        """
        self.validate()
        return self.algo_class()(self.copy(), logger=logger)

    # RLlib 2.x renamed build() to build_algo(); accept both.
    build_algo = build

    @classmethod
    def algo_class(cls) -> type:
        """The Algorithm class this config builds; subclasses override."""
        raise ConfigError("AlgorithmConfig is abstract: use PPOConfig() or another algorithm's config")


def migrate_value_loss_coeff(config: dict[str, Any], format_version: int) -> dict[str, Any]:
    """PPO and A2C before checkpoint format 2 weighed the value loss as ``0.5 * vf_loss_coeff * MSE``; today it is
    ``vf_loss_coeff * MSE`` (RLlib's formula): halve the coefficient so the run keeps its effective weight."""
    if format_version < 2 and isinstance(config.get("vf_loss_coeff"), (int, float)):
        config = {**config, "vf_loss_coeff": 0.5 * config["vf_loss_coeff"]}
    return config
