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
`Field` table: ``AlgorithmConfig.FIELDS`` holds the keys every algorithm shares,
each algorithm file adds its own. The older spellings users have in RLlib
scripts (``num_workers``, ``.rollouts(num_rollout_workers=...)``,
``sgd_minibatch_size``, ...) are aliases that map onto the same keys.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from herdrl.errors import ConfigError, did_you_mean
from herdrl.site_keys import MASKED, SITE_KEYS, mask_site_values  # noqa: F401 (this module's names too)


@dataclass(frozen=True)
class Field:
    """One config key: default, accepted types, allowed range and the builder group it belongs to."""

    default: Any
    types: tuple[type, ...]
    group: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # True: value must be > low, not >= low
    choices: tuple | None = None
    allow_none: bool = False
    doc: str = ""
    schedule: bool = False  # also takes a schedule (herdrl.schedules): [[env_step, value], ...] or a named decay

    def check(self, key: str, value: Any) -> Any:
        """Return ``value`` (ints widened to float where a float is expected) or raise ConfigError."""
        if self.schedule and not isinstance(value, str) and value is not None:
            from herdrl.schedules import check_schedule, is_schedule

            if is_schedule(value):
                return check_schedule(key, value, lambda v: dataclasses.replace(self, schedule=False).check(key, v))
        if value is None:
            if self.allow_none:
                return None
            raise ConfigError(f"config key '{key}' must not be None ({self.describe()})")
        if isinstance(value, bool) and bool not in self.types:
            raise ConfigError(f"config key '{key}' got {value!r}; expected {self.describe()}")
        if float in self.types and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.types):
            raise ConfigError(
                f"config key '{key}' got {type(value).__name__} {value!r}; expected {self.describe()}"
            )
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"config key '{key}' got {value!r}; expected one of {list(self.choices)}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"config key '{key}' got {value!r}; expected a finite number")
            too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
            too_high = self.high is not None and value > self.high
            if too_low or too_high:
                raise ConfigError(f"config key '{key}' got {value!r}; expected {self.describe()}")
        return value

    def describe(self) -> str:
        """Human-readable type and range, e.g. ``float > 0`` or ``int in [1, 100]``."""
        names = " or ".join(t.__name__ for t in self.types)
        if self.choices is not None:
            return f"one of {list(self.choices)}"
        if self.low is not None and self.high is not None:
            left = "(" if self.low_open else "["
            text = f"{names} in {left}{self.low:g}, {self.high:g}]"
        elif self.low is not None:
            text = f"{names} {'>' if self.low_open else '>='} {self.low:g}"
        else:
            text = names
        return text + (" or None" if self.allow_none else "") + (", or a schedule" if self.schedule else "")


#: RLlib's ``EpsilonGreedy`` defaults: what keys left out take when a changed ``type`` replaces the whole dict.
_EPSILON_GREEDY_DEFAULTS = {"initial_epsilon": 1.0, "final_epsilon": 0.05, "warmup_timesteps": 0,
                           "epsilon_timesteps": 100_000}
#: RLlib's DQN ``exploration_config`` (its old stack's default), for an ``epsilon`` of no EpsilonGreedy shape.
_DQN_EXPLORATION = {"initial_epsilon": 1.0, "final_epsilon": 0.02, "warmup_timesteps": 0, "epsilon_timesteps": 10_000}


def _epsilon_greedy_settings(schedule: Any) -> dict[str, Any] | None:
    """RLlib's EpsilonGreedy keys read back from an ``epsilon`` schedule of the shape they make
    (``[[0, initial], [timesteps, final]]`` or ``[[0, initial], [warmup, initial], [warmup + timesteps, final]]``);
    None for any other value (a constant, a named decay, more points)."""
    if not isinstance(schedule, (list, tuple)) or not schedule or schedule[0][0] != 0:
        return None  # (a tuple of tuples is the same schedule as a list of lists)
    if len(schedule) == 2:
        (_, start), (steps, end) = schedule
        return {"initial_epsilon": start, "final_epsilon": end, "warmup_timesteps": 0, "epsilon_timesteps": steps}
    if len(schedule) == 3 and schedule[1][1] == schedule[0][1]:
        (_, start), (warmup, _), (stop, end) = schedule
        return {"initial_epsilon": start, "final_epsilon": end, "warmup_timesteps": warmup,
                "epsilon_timesteps": stop - warmup}
    return None


def _epsilon_greedy(base: Mapping[str, Any], config: dict[str, Any]) -> list[list[float]]:
    """RLlib's EpsilonGreedy settings (popped from ``config``) merged over ``base`` (the settings in force), as an
    ``epsilon`` schedule: ``[[0, initial], [warmup, initial], [warmup + timesteps, final]]`` (RLlib's
    ``PiecewiseSchedule``), two points when there is no warmup."""
    merged = {key: config.pop(key, value) for key, value in base.items()}
    start, end = merged["initial_epsilon"], merged["final_epsilon"]
    warmup, steps = merged["warmup_timesteps"], merged["epsilon_timesteps"]
    if warmup:
        return [[0, start], [warmup, start], [warmup + steps, end]]
    return [[0, start], [steps, end]]


def _note(call: str, why: str) -> None:
    """One warning line per call site kind: an RLlib setting accepted that changes nothing (or less) here."""
    if call not in _NOTED:
        _NOTED.add(call)
        logging.getLogger("herdrl").warning("herdrl: %s has no effect: %s", call, why)


_NOTED: set[str] = set()
#: RLlib's ``.debugging()`` keys with nothing to set here.
_RLLIB_DEBUGGING = frozenset({"log_level", "log_sys_usage", "fake_sampler", "logger_config", "logger_creator"})


#: PPO's, A2C's and TRPO's ``value_normalization`` (``herdrl.models.actor_critic.ValueNormalizer``).
VALUE_NORMALIZATION = Field(
    False, (bool,), "training",
    doc="the value head learns targets standardised by their running mean and std (MAPPO's value normalisation); "
        "values are de-standardised for GAE and bootstrapping")


def shared_field(key: str, default: Any, base: type | None = None) -> Field:
    """A key declared by ``base`` (default: the keys every algorithm has), with an algorithm's own default."""
    return dataclasses.replace((base or AlgorithmConfig).fields()[key], default=default)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# Keys of the ``model`` dict (RLlib's names where RLlib has one) and their defaults.
MODEL_DEFAULTS: dict[str, Any] = {
    "fcnet_hiddens": [64, 64],
    "fcnet_activation": "tanh",
    "vf_share_layers": None,  # None: shared for image observations (one CNN), separate otherwise
    "free_log_std": True,  # diagonal Gaussian: state-independent log std (a learned vector)
    "log_std_init": 0.0,  # its initial value (SB3's log_std_init; the zoo's MuJoCo PPO uses -2)
    # Recurrent policies (herdrl.models.recurrent): an LSTM between the encoder and the heads.
    "use_lstm": False,
    "lstm_cell_size": 256,
    "max_seq_len": 20,  # steps per training sequence (truncated backpropagation through time)
    "lstm_use_prev_action": False,  # the previous action and reward as observation leaves (herdrl.env.previous)
    "lstm_use_prev_reward": False,
    # Image observations (herdrl.models.encoders): None picks the Nature-DQN stack (or a small one below 36 px).
    "conv_filters": None,  # [[out_channels, kernel, stride(, padding)], ...]
    "conv_activation": "relu",
    "conv_type": "default",  # or "impala": the IMPALA ResNet
    "post_fcnet_hiddens": None,  # dense layers after the CNN; None: 512 Nature, 256 IMPALA, 128 small
    "custom_encoder": None,  # a herdrl.register_encoder name
    "custom_encoder_config": {},
    "obs_encoding": "auto",  # "flat": every observation flattened as it is, no CNN (checkpoints of format <= 2)
    # SAC, TD3/DDPG, CQL and IQL: critics see actions mapped from the Box bounds into [-1, 1] (as SB3's do);
    # False: in the env's units (checkpoints written before this key).
    "critic_unit_actions": True,
    # Initial weights of the layers herdrl builds: "orthogonal" (gain sqrt 2, policy heads 0.01, zero biases: as
    # CleanRL and SB3) or "pytorch" (each layer's PyTorch default, Kaiming-uniform: as d3rlpy). New runs only: a
    # checkpoint brings its weights.
    "init": "orthogonal",
}
ACTIVATIONS = ("tanh", "relu", "elu", "gelu", "silu", "swish", "linear")


class AlgorithmConfig:
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
    #: Whether it reads a recorded dataset (``.offline_data(input_=...)``): offline algorithms, and IQL online.
    reads_datasets: bool = False
    #: The result key the algorithm is judged by: its "solved" and default stop criterion, what ``herd plot`` draws
    #: and what keeps the best checkpoint. The training return, or for algorithms that explore while they train
    #: (DQN, SAC, TD3) the greedy evaluation return.
    stop_metric: str = "episode_return_mean"

    FIELDS: dict[str, Field] = {
        "env": Field(None, (str,), "environment", allow_none=True,
                     doc="Gymnasium id or a name given to herdrl.register_env"),
        "env_config": Field({}, (dict,), "environment", doc="passed to the env creator / gymnasium.make"),
        "gym_env_vectorize_mode": Field(
            "auto", (str,), "env_runners", choices=("auto", "vector_entry_point", "sync", "async"),
            doc="auto: the env's own numpy-vectorised version if it has one, else sync"),
        "num_env_runners": Field(0, (int,), "env_runners", low=0,
                                 doc="0: sample in the driver process, no Ray"),
        "num_envs_per_env_runner": Field(1, (int,), "env_runners", low=1),
        "num_cpus_per_env_runner": Field(1.0, (float,), "env_runners", low=0, low_open=True,
                                         doc="CPUs each Ray runner actor reserves"),
        "num_gpus_per_env_runner": Field(0.0, (float,), "env_runners", low=0,
                                         doc="GPUs each runner's policy runs on (fractions share one; 0: CPU "
                                             "inference); with num_env_runners=0: the driver's runner"),
        "rollout_fragment_length": Field(
            "auto", (int, str), "env_runners", low=1,
            doc="steps per env per sample() call; auto: train_batch_size / total envs"),
        "sample_timeout_s": Field(600.0, (float,), "env_runners", low=0, low_open=True, allow_none=True,
                                  doc="a Ray runner that has not returned its fragment by then counts as failed"),
        "observation_filter": Field("NoFilter", (str,), "env_runners", choices=("NoFilter", "MeanStdFilter"),
                                    doc="MeanStdFilter: observations normalised by running mean/std merged across "
                                        "runners (Box leaves that are not images)"),
        "clip_obs": Field(10.0, (float,), "env_runners", low=0, low_open=True,
                          doc="normalised observations are clipped to [-clip_obs, clip_obs]"),
        "norm_reward": Field(False, (bool,), "env_runners",
                             doc="divide rewards by the running std of the discounted return (SB3's VecNormalize)"),
        "clip_reward": Field(10.0, (float,), "env_runners", low=0, low_open=True,
                             doc="scaled rewards are clipped to [-clip_reward, clip_reward]"),
        "num_gpus": Field(0.0, (float,), "resources", low=0, doc="GPUs for the learner in the driver"),
        "num_learners": Field(0, (int,), "learners", low=0,
                              doc="0: learn in the driver; N: N data-parallel learner actors on Ray"),
        "num_cpus_per_learner": Field(1.0, (float,), "learners", low=0, low_open=True,
                                      doc="CPUs each learner actor reserves (and its torch threads)"),
        "num_gpus_per_learner": Field(0.0, (float,), "learners", low=0,
                                      doc="GPUs per learner (fractions share one); with num_learners=0: the "
                                          "driver's learner"),
        "mixed_precision": Field(None, (str,), "learners", choices=("bf16",), allow_none=True,
                                 doc="bf16: losses computed under torch.autocast in bfloat16 (weights, gradients "
                                     "and optimizer state stay float32; no loss scaling needed)"),
        "num_aggregator_actors_per_learner": Field(
            0, (int,), "learners", low=0,
            doc="actors on each learner's node that fetch its fragments (unpacking frames) and hand it one object "
                "per actor (RLlib's name); 0: learners fetch fragments themselves"),
        "shard_fragments": Field(
            False, (bool,), "learners",
            doc="PPO, A2C, IMPALA and APPO on N learner actors: each fetches and learns on its own share of the "
                "fragments (1/N of the bytes each) instead of every learner fetching all of them; the update is one "
                "learner's on the batch in share order"),
        "learner_timeout_s": Field(600.0, (float,), "learners", low=0, low_open=True,
                                   doc="a learner call (an update, a collective) that takes longer has failed"),
        "num_cpus_for_main_process": Field(
            1, (int,), "resources", low=1,
            doc="torch threads of the learner's process: 1 suits RL's small networks and never oversubscribes "
                "cores shared with runners or other runs (spinning OpenMP threads then slow down ~100x)"),
        "address": Field(None, (str,), "resources", allow_none=True,
                         doc="Ray cluster to join (HOST:PORT or auto); None: a private Ray in this process"),
        "node_ip_address": Field(None, (str,), "resources", allow_none=True,
                                 doc="this driver's own address when joining a cluster"),
        "ray_connect_timeout_s": Field(30.0, (float,), "resources", low=0, low_open=True,
                                       doc="how long to wait for a cluster's head to answer"),
        "include_dashboard": Field(False, (bool,), "resources", doc="start Ray's dashboard (embedded Ray)"),
        "runtime_env": Field(None, (dict,), "resources", allow_none=True,
                             doc="Ray runtime_env for the job, e.g. {'working_dir': '.'} to ship data files"),
        "restart_failed_env_runners": Field(True, (bool,), "fault_tolerance",
                                            doc="replace a failed runner with a fresh actor"),
        "ignore_env_runner_failures": Field(False, (bool,), "fault_tolerance",
                                            doc="without restarts: go on with the runners left"),
        "max_num_env_runner_restarts": Field(1000, (int,), "fault_tolerance", low=0),
        "keep_train_batch_size": Field(
            True, (bool,), "fault_tolerance",
            doc="while runners are missing (lost, or waiting for room on the cluster), the others sample more "
                "fragments so each train batch keeps its size; False: train on the smaller batch"),
        "restart_failed_learners": Field(True, (bool,), "fault_tolerance",
                                         doc="a learner actor (or aggregator) that dies: restart the whole learner "
                                             "group from the newest kept learner state and go on"),
        "max_num_learner_restarts": Field(10, (int,), "fault_tolerance", low=0),
        "learner_state_interval": Field(
            10, (int,), "fault_tolerance", low=0,
            doc="iterations between copies of the learner state kept (in the object store) for a learner restart: "
                "a restart loses at most their updates; 0: only the state at start or restore"),
        "framework": Field("torch", (str,), "framework", choices=("torch",)),
        "lr": Field(5e-5, (float,), "training", low=0, schedule=True,
                    doc="the learning rate of every optimizer; or a schedule over env steps sampled: "
                        "[[step, lr], ...] or {schedule: linear|cosine, start, end, steps}"),
        "gamma": Field(0.99, (float,), "training", low=0, high=1),
        "train_batch_size": Field(4000, (int,), "training", low=1),
        "train_batch_size_per_learner": Field(
            None, (int,), "training", low=1, allow_none=True,
            doc="RLlib's new-stack spelling: train_batch_size becomes this times max(num_learners, 1)"),
        "grad_clip": Field(None, (float,), "training", low=0, low_open=True, allow_none=True),
        "model": Field(MODEL_DEFAULTS, (dict,), "training"),
        "seed": Field(None, (int,), "debugging", low=0, allow_none=True),
        "output": Field(None, (str,), "offline_data", allow_none=True,
                        doc="record every training episode the env runners play into this dataset folder "
                            "(Minari's format, herdrl.offline.recorder)"),
        "init_from": Field(None, (str,), "training", allow_none=True,
                           doc="a checkpoint (or trial folder) whose matching weights this run starts from: BC -> PPO "
                               "(herdrl.init_from)"),
        "init_value_warmup_iters": Field(
            5, (int,), "training", low=0,
            doc="with init_from and a fresh value head: iterations in which only the value head learns"),
        "policies": Field(None, (dict, list, tuple, set, frozenset), "multi_agent", allow_none=True,
                          doc="multi-agent: policy ids, or id -> None / {'observation_space', 'action_space'}"),
        "policy_mapping_fn": Field(None, (str, dict), "multi_agent", allow_none=True,
                                   doc="(agent_id, episode, **kw) -> policy id; or 'shared', 'per_agent', a dict"),
        "policies_to_train": Field(None, (list, tuple, set), "multi_agent", allow_none=True,
                                   doc="policies that learn (None: all but self-play snapshots)"),
        "self_play": Field(None, (dict,), "multi_agent", allow_none=True,
                           doc="{policy: [snapshot, ...]}: copy the policy into its snapshots (newest first)"),
        "self_play_interval": Field(10, (int,), "multi_agent", low=1,
                                    doc="iterations between self-play snapshots"),
        "centralized_critic": Field(
            False, (bool,), "multi_agent",
            doc="MAPPO: each policy's critic sees the global state (the env's state(), else every agent's latest "
                "observation) beside its agent's own observation; actors see their own (PPO, A2C, TRPO)"),
        "random_opponent_interval": Field(
            5, (int,), "multi_agent", low=0,
            doc="turn-based zero-sum games (their returns sum to 0): every N iterations, each trained policy plays "
                "uniformly random legal moves and its mean result (+1 win, 0 draw, -1 loss) is reported as "
                "score_vs_random/<policy>; 0: never"),
        "random_opponent_games": Field(50, (int,), "multi_agent", low=1,
                                       doc="games per score_vs_random (the policy takes each seat in turn)"),
        "evaluation_interval": Field(None, (int,), "evaluation", low=0, allow_none=True,
                                     doc="evaluate every N iterations (None or 0: never, as in RLlib)"),
        "evaluation_duration": Field(10, (int,), "evaluation", low=1,
                                     doc="episodes (or env steps, with evaluation_duration_unit) per evaluation"),
        "evaluation_duration_unit": Field("episodes", (str,), "evaluation", choices=("episodes", "timesteps")),
        "evaluation_num_env_runners": Field(0, (int,), "evaluation", low=0,
                                            doc="Ray actors that evaluate on their own envs; 0: the driver does"),
        "evaluation_parallel_to_training": Field(
            False, (bool,), "evaluation",
            doc="evaluate (on evaluation runners) while the iteration trains, with the weights it started with"),
        "evaluation_sample_timeout_s": Field(
            120.0, (float,), "evaluation", low=0, low_open=True, allow_none=True,
            doc="an evaluation (in the driver or on runners) stops after this long with the episodes finished by "
                "then, and a line saying so; None: no bound"),
        "evaluation_config": Field({}, (dict,), "evaluation",
                                   doc="{'explore': False, 'max_steps': N, 'env_config': {...}} and the env runner "
                                       "keys of EVALUATION_KEYS, for evaluation"),
        "callbacks_class": Field(None, (type, list, tuple, str), "callbacks", allow_none=True,
                                 doc="a herdrl.RLlibCallback subclass (or a list), or 'module:Class' of a module "
                                     "imported with --import (herdrl.callbacks)"),
        "callbacks_hooks": Field({}, (dict,), "callbacks", doc="hook name -> function (or list of functions)"),
    }

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

    def _take_defaults(self, defaults: Mapping[str, Any], active: bool) -> None:
        """Each key of ``defaults`` that the user did not set explicitly takes its value there (``active``) or its
        field's own default (turned off again)."""
        fields = self.fields()
        for key, value in defaults.items():
            if not self.is_explicit(key):
                self._values[key] = copy.deepcopy(value if active else fields[key].default)

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

    # ------------------------------------------- RLlib calls with little or nothing to set here
    def api_stack(self, **kwargs: Any) -> AlgorithmConfig:
        """RLlib's switch between its old and new API stacks: herdrl has one; accepted, with a note."""
        _note(".api_stack(...)", "herdrl has one API stack (EnvRunner / Learner / module, as RLlib's new one)")
        return self

    def reporting(self, **kwargs: Any) -> AlgorithmConfig:
        """RLlib's reporting settings: those the algorithm has (DQN's ``min_sample_timesteps_per_iteration``,
        IMPALA's ``min_time_s_per_iteration``) are set; the others are accepted with a note (an iteration is one
        round of sampling and learning, episode metrics are means over the last 100 episodes)."""
        fields = self.fields()
        own = {key: value for key, value in kwargs.items() if key in fields}  # e.g. DQN's, IMPALA's iteration size
        if own:
            self._set(None, own)
        rest = sorted(set(kwargs) - set(own))
        if rest:
            _note(f".reporting({', '.join(rest)})", "an iteration here is one round of sampling and learning; "
                  "episode metrics are over the last 100 episodes")
        return self

    def checkpointing(self, **kwargs: Any) -> AlgorithmConfig:
        """RLlib's checkpoint options: herdrl checkpoints are always its own pickle-free format (``herd export``
        writes torch.export / ONNX files); accepted, with a note."""
        if kwargs:
            _note(f".checkpointing({', '.join(sorted(kwargs))})", "checkpoints are herdrl's own format; export "
                  "models with `herd export`")
        return self

    def exploration(self, *, explore: bool | None = None, exploration_config: Mapping[str, Any] | None = None,
                    **kwargs: Any) -> AlgorithmConfig:
        """RLlib's exploration settings (RLlib 2.10 on takes them in ``.env_runners()``, which passes them here).
        ``exploration_config={"type": "EpsilonGreedy", "initial_epsilon", "final_epsilon", "epsilon_timesteps",
        "warmup_timesteps"}`` becomes DQN's ``epsilon`` schedule. As RLlib's deep update, a later call merges into
        the settings in force (keys left out keep the current schedule's values: a warmup and final epsilon set
        before stay), and a changed ``type`` replaces the whole dict (keys left out take RLlib's EpsilonGreedy
        defaults: 1.0 to 0.05 over 100,000 steps, no warmup). Stochastic sampling (``StochasticSampling``)
        is what herdrl does anyway; ``explore=False`` while training is refused (training samples explore;
        evaluation is greedy unless ``evaluation_config={"explore": True}``)."""
        if explore is False:
            raise ConfigError(".exploration(explore=False): training samples always explore here; evaluation is "
                              "greedy by default (evaluation_config explore)")
        if exploration_config is None:
            if kwargs:
                _note(f".exploration({', '.join(sorted(kwargs))})", "no effect here")
            return self
        config = dict(exploration_config)
        default = "EpsilonGreedy" if "epsilon" in self.fields() else "StochasticSampling"  # RLlib's defaults
        kind = str(config.pop("type", self._exploration_type or default)).rsplit(".", 1)[-1]
        # RLlib's deep update: the same type merges into the settings in force, a changed type replaces them all.
        replaced = kind != (self._exploration_type or default)
        object.__setattr__(self, "_exploration_type", kind)
        if kind == "EpsilonGreedy" and "epsilon" in self.fields():
            in_force = _epsilon_greedy_settings(self.epsilon) or _DQN_EXPLORATION
            base = _EPSILON_GREEDY_DEFAULTS if replaced else in_force
            self._set("training", {"epsilon": _epsilon_greedy(base, config)})
        elif kind != "StochasticSampling":
            _note(f".exploration(exploration_config={{'type': '{kind}'}})", f"{self.algo_name}'s own exploration "
                  "applies (see its noise or entropy keys)")
            config = {}
        if config or kwargs:
            _note(f".exploration({', '.join(sorted([*config, *kwargs]))})", "no effect here")
        return self

    def rl_module(self, *, model_config: Mapping[str, Any] | None = None, rl_module_spec: Any = None,
                  **kwargs: Any) -> AlgorithmConfig:
        """RLlib's module settings: ``model_config`` keys herdrl's ``model`` has (``fcnet_hiddens``,
        ``fcnet_activation``, ``conv_filters``, ``use_lstm``, ``lstm_cell_size``, ``max_seq_len``,
        ``vf_share_layers``, ...) apply; others are named in a note. A custom ``rl_module_spec`` is refused: bring
        a network with ``herdrl.register_encoder`` instead."""
        if rl_module_spec is not None:
            raise ConfigError(".rl_module(rl_module_spec=...): herdrl builds its own modules; bring your network as "
                              "an encoder (herdrl.register_encoder, model custom_encoder)")
        if dataclasses.is_dataclass(model_config) and not isinstance(model_config, type):  # RLlib's DefaultModelConfig
            model_config = dataclasses.asdict(model_config)
        model_config = dict(model_config or {})
        known = {k: v for k, v in model_config.items() if k in MODEL_DEFAULTS}
        ignored = sorted(set(model_config) - set(known)) + sorted(kwargs)
        if known:
            self._set("training", {"model": known})
        if ignored:
            _note(f".rl_module({', '.join(ignored)})", "no such model key here (see docs/config.md, model)")
        return self

    @property
    def is_multi_agent(self) -> bool:
        """Whether this run trains policies for the agents of a PettingZoo env."""
        from herdrl.env.multi_agent import is_pettingzoo_id

        return self.policies is not None or self.policy_mapping_fn is not None or is_pettingzoo_id(self.env)

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

    # ------------------------------------------------------------ validate
    def validate(self) -> None:
        """Check every value's type and range, then the algorithm's cross-key rules. A recurrent model first takes
        :attr:`LSTM_DEFAULTS` for the keys the user left to their defaults."""
        if self.LSTM_DEFAULTS and isinstance(self.model, Mapping) and not self.is_multi_agent:
            self._take_defaults(self.LSTM_DEFAULTS, self.model.get("use_lstm") is True)
        for key, f in self.fields().items():
            value = self._values[key]
            if key in ("env", "policy_mapping_fn") and callable(value):
                continue
            if key == "rollout_fragment_length" and value == "auto":
                continue
            if key == "rollout_fragment_length" and isinstance(value, str):
                raise ConfigError(f"config key '{key}' got {value!r}; expected 'auto' or int >= 1")
            self._values[key] = f.check(key, value)
        if self.env is None and not self.learns_offline:  # (offline: an env only to evaluate in)
            raise ConfigError("no env set: use .environment('CartPole-v1') or --env ID")
        self.schedules()  # a named decay without steps: one line
        self._validate_model(self.model)
        if self.is_multi_agent:
            from herdrl.multi_agent import DEFAULT_POLICY, agent_ids, validate_multi_agent

            mapping = self.policy_mapping_fn
            if self.policies is None:  # one policy for every agent; 'per_agent': one per agent, named as it
                self._values["policies"] = (agent_ids(self.env, self.env_config) if mapping == "per_agent"
                                            # a dict agent -> policy: the policies it names (ids that are not
                                            # strings are refused by validate_multi_agent, in one line)
                                            else sorted(set(mapping.values())) if isinstance(mapping, dict)
                                            and all(isinstance(pid, str) for pid in mapping.values())
                                            else [DEFAULT_POLICY])
            validate_multi_agent(self)
        elif self.centralized_critic:
            raise ConfigError("centralized_critic=True is for multi-agent runs (.multi_agent(policies=...)): a "
                              "single agent's critic already sees everything its observation holds")
        if self.output and (self.model.get("lstm_use_prev_action") or self.model.get("lstm_use_prev_reward")):
            raise ConfigError("output records the env's own observations, and this model's carry the previous "
                              "action/reward beside them: recording such a run is not supported yet")
        if self.output and (self.is_multi_agent or self.learns_offline):
            why = "multi-agent runs are not recorded yet" if self.is_multi_agent else "an offline run plays none"
            raise ConfigError(f"output={self.output!r} records a single-agent run's training episodes: {why}")
        if self.train_batch_size_per_learner is not None:
            total = self.train_batch_size_per_learner * max(self.num_learners, 1)
            if self.is_explicit("train_batch_size") and self.train_batch_size != total:
                raise ConfigError(f"train_batch_size={self.train_batch_size} and train_batch_size_per_learner="
                                  f"{self.train_batch_size_per_learner} (x {max(self.num_learners, 1)} learners = "
                                  f"{total}) disagree: give one of them")
            self._values["train_batch_size"] = total
        self._validate_evaluation()
        max_steps = self.evaluation_config.get("max_steps")
        if max_steps is not None and not (isinstance(max_steps, int) and max_steps >= 1):
            raise ConfigError(f"evaluation_config max_steps got {max_steps!r}; expected an int >= 1 (steps per "
                              "evaluation, after which unfinished episodes are left out)")
        self._validate_callbacks()
        if self.num_learners > 1 and not self.data_parallel:
            raise ConfigError(f"{self.algo_name} learns on one learner (num_learners 0 or 1), got num_learners="
                              f"{self.num_learners}")
        if self.num_aggregator_actors_per_learner and self.num_learners == 0:
            raise ConfigError(f"num_aggregator_actors_per_learner={self.num_aggregator_actors_per_learner} needs "
                              "learner actors (num_learners >= 1): the learner in the driver fetches its fragments "
                              "itself")
        if self.shard_fragments:
            learner = self.algo_class().learner_class
            why = ("learns from a dataset, not fragments" if self.learns_offline
                   else "learns from replayed batches, not fragments" if self.stores_raw_transitions
                   else "learns on its fragments as one batch"
                   if not getattr(learner, "supports_sharded_fragments", False)
                   else "shards multi-agent fragments not yet" if self.is_multi_agent
                   else "needs learner actors (num_learners >= 2) to shard between" if self.num_learners < 2
                   else self.unshardable_updates())
            if why:
                raise ConfigError(f"shard_fragments=True: {self.algo_name} {why}; leave it off")
        if self.num_aggregator_actors_per_learner and self.stores_raw_transitions:
            raise ConfigError(f"{self.algo_name} learns from a replay buffer in the driver, which sends its learners "
                              "replayed batches, not fragments: num_aggregator_actors_per_learner has nothing to "
                              "fetch (set it to 0)")
        if self.num_learners > 0 and self.num_gpus > 0:
            raise ConfigError(f"num_gpus={self.num_gpus:g} is the GPU of the learner in the driver, and with "
                              f"num_learners={self.num_learners} the learners are actors: set num_gpus_per_learner "
                              "instead")
        if self.model["use_lstm"] and not self.supports_lstm:
            raise ConfigError(f"model use_lstm is not supported by {self.algo_name} yet; use PPO, A2C, IMPALA or APPO")
        minibatch = getattr(self, "minibatch_size", None)
        if self.num_learners > 1 and minibatch is not None and minibatch < 2 * self.num_learners:
            raise ConfigError(f"minibatch_size={minibatch} is too small to split between {self.num_learners} "
                              f"learners: use at least {2 * self.num_learners} (a few rows each is mostly overhead)")
        if self.num_learners > self.train_batch_size:
            raise ConfigError(f"num_learners={self.num_learners} is more than train_batch_size="
                              f"{self.train_batch_size}: every learner needs rows of each batch")
        self.validate_algorithm()

    #: What ``evaluation_config`` may set: evaluation's own keys and the keys an env runner uses.
    EVALUATION_KEYS = ("explore", "max_steps", "env", "env_config", "num_envs_per_env_runner",
                       "gym_env_vectorize_mode", "num_cpus_per_env_runner", "num_gpus_per_env_runner",
                       "rollout_fragment_length", "sample_timeout_s")

    def _validate_evaluation(self) -> None:
        fields = self.fields()
        for key, value in self.evaluation_config.items():
            name = self.aliases().get(key, key)
            if name not in self.EVALUATION_KEYS:
                why = "is not a config key" if name not in fields else "does not apply to evaluation runners"
                raise ConfigError(f"evaluation_config key '{key}' {why}; it takes: {', '.join(self.EVALUATION_KEYS)}")
            if name in fields and not (name == "rollout_fragment_length" and value == "auto"):
                fields[name].check(f"evaluation_config {key}", value)
        if self.evaluation_parallel_to_training and not self.evaluation_num_env_runners:
            raise ConfigError("evaluation_parallel_to_training needs evaluation runners of its own: set "
                              "evaluation_num_env_runners >= 1")
        if (self.evaluation_num_env_runners or self.evaluation_duration_unit != "episodes") and self.is_multi_agent:
            raise ConfigError("multi-agent runs evaluate episodes in the driver: set evaluation_num_env_runners=0 and "
                              "evaluation_duration_unit='episodes'")

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

    def _validate_callbacks(self) -> None:
        from herdrl.callbacks import check_hooks, hooks_of

        check_hooks(self.callbacks_hooks)
        hooks_of(self)  # the classes resolve (no instance is made here: a user's __init__ may open files)

    @staticmethod
    def _validate_model(model: dict) -> None:
        hiddens = model["fcnet_hiddens"]
        if not isinstance(hiddens, (list, tuple)) or not all(
            isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in hiddens
        ):
            raise ConfigError(f"model key 'fcnet_hiddens' got {hiddens!r}; expected a list of ints > 0")
        if model["fcnet_activation"] not in ACTIVATIONS:
            raise ConfigError(f"model key 'fcnet_activation' got {model['fcnet_activation']!r}; "
                              f"expected one of {list(ACTIVATIONS)}")
        if isinstance(model["log_std_init"], bool) or not isinstance(model["log_std_init"], (int, float)):
            raise ConfigError(f"model key 'log_std_init' got {model['log_std_init']!r}; expected a number")
        for key in ("use_lstm", "lstm_use_prev_action", "lstm_use_prev_reward"):
            if not isinstance(model[key], bool):
                raise ConfigError(f"model key '{key}' got {model[key]!r}; expected bool")
        for key in ("lstm_cell_size", "max_seq_len"):
            if not _positive_int(model[key]):
                raise ConfigError(f"model key '{key}' got {model[key]!r}; expected an int > 0")
        if (model["lstm_use_prev_action"] or model["lstm_use_prev_reward"]) and not model["use_lstm"]:
            raise ConfigError("model keys lstm_use_prev_action/lstm_use_prev_reward need use_lstm=True")
        for key in ("free_log_std", "critic_unit_actions"):
            if not isinstance(model[key], bool):
                raise ConfigError(f"model key '{key}' got {model[key]!r}; expected bool")
        if model["vf_share_layers"] is not None and not isinstance(model["vf_share_layers"], bool):
            raise ConfigError(f"model key 'vf_share_layers' got {model['vf_share_layers']!r}; expected bool or None "
                              "(None: shared for image observations)")
        filters = model["conv_filters"]
        if filters is not None and not (isinstance(filters, (list, tuple)) and filters and all(
                isinstance(f, (list, tuple)) and len(f) in (3, 4) and all(_positive_int(v) for v in f[:3])
                and (len(f) == 3 or (isinstance(f[3], int) and f[3] >= 0)) for f in filters)):
            raise ConfigError(f"model key 'conv_filters' got {filters!r}; expected [[out_channels, kernel, stride], "
                              "...] of ints > 0 (an optional 4th: padding), or None for the default stack")
        if model["conv_activation"] not in ACTIVATIONS:
            raise ConfigError(f"model key 'conv_activation' got {model['conv_activation']!r}; "
                              f"expected one of {list(ACTIVATIONS)}")
        if model["conv_type"] not in ("default", "impala"):
            raise ConfigError(f"model key 'conv_type' got {model['conv_type']!r}; expected 'default' or 'impala'")
        post = model["post_fcnet_hiddens"]
        if post is not None and not (isinstance(post, (list, tuple)) and all(_positive_int(h) for h in post)):
            raise ConfigError(f"model key 'post_fcnet_hiddens' got {post!r}; expected a list of ints > 0 or None")
        if model["custom_encoder"] is not None and not (isinstance(model["custom_encoder"], str)
                                                        and model["custom_encoder"]):
            raise ConfigError(f"model key 'custom_encoder' got {model['custom_encoder']!r}; expected the name "
                              "given to herdrl.register_encoder")
        if model["obs_encoding"] not in ("auto", "flat"):
            raise ConfigError(f"model key 'obs_encoding' got {model['obs_encoding']!r}; expected 'auto' (encoders "
                              "chosen from the observation space) or 'flat'")
        if not isinstance(model["custom_encoder_config"], dict):
            raise ConfigError(f"model key 'custom_encoder_config' got {model['custom_encoder_config']!r}; "
                              "expected a dict")
        if model["init"] not in ("orthogonal", "pytorch"):
            raise ConfigError(f"model key 'init' got {model['init']!r}; expected 'orthogonal' (herdrl's) or "
                              "'pytorch' (each layer's PyTorch default)")

    def validate_algorithm(self) -> None:
        """Cross-key rules of one algorithm; subclasses override."""

    def check_minibatch_fits(self) -> None:
        """``minibatch_size`` (where the algorithm has one) no larger than ``train_batch_size``, in single-agent runs: a
        multi-agent batch of ``train_batch_size`` env steps holds a row per agent decision, more than that for a
        shared policy, and a minibatch as large as its rows, or larger, is the whole batch, one step per epoch."""
        minibatch = getattr(self, "minibatch_size", None)
        if minibatch is not None and minibatch > self.train_batch_size and not self.is_multi_agent:
            raise ConfigError(f"config key 'minibatch_size' got {minibatch}; expected <= train_batch_size "
                              f"({self.train_batch_size})")

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
