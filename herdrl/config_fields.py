"""The keys every algorithm shares: one :class:`Field` each (default, type, range, builder group).

``SHARED_FIELDS`` is ``AlgorithmConfig.FIELDS``; each algorithm file adds its own keys, declared the same way
(:func:`shared_field` gives a shared key an algorithm's own default). ``MODEL_DEFAULTS`` holds the keys of the
``model`` dict (RLlib's names where RLlib has one).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from herdrl.errors import ConfigError


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


#: PPO's, A2C's and TRPO's ``value_normalization`` (``herdrl.models.actor_critic.ValueNormalizer``).
VALUE_NORMALIZATION = Field(
    False, (bool,), "training",
    doc="the value head learns targets standardised by their running mean and std (MAPPO's value normalisation); "
        "values are de-standardised for GAE and bootstrapping")


def shared_field(key: str, default: Any, base: type | None = None) -> Field:
    """A key declared by ``base`` (a config class; default: the keys every algorithm has), with an algorithm's own
    default."""
    return dataclasses.replace((base.fields() if base is not None else SHARED_FIELDS)[key], default=default)


#: The keys every algorithm has (``AlgorithmConfig.FIELDS``), by builder group.
SHARED_FIELDS: dict[str, Field] = {
    "env": Field(None, (str,), "environment", allow_none=True,
                 doc="Gymnasium id or a name given to herdrl.register_env"),
    "env_config": Field({}, (dict,), "environment", doc="passed to the env creator / gymnasium.make"),
    "gym_env_vectorize_mode": Field(
        "auto", (str,), "env_runners", choices=("auto", "vector_entry_point", "sync", "async"),
        doc="auto: the env's own numpy-vectorised version if it has one, else sync"),
    "num_env_runners": Field(0, (int,), "env_runners", low=0,
                             doc="0: sample in the driver process, no Ray"),
    "num_envs_per_env_runner": Field(1, (int,), "env_runners", low=1),
    "max_env_runners": Field(None, (int,), "env_runners", low=1, allow_none=True,
                             doc="start more Ray runners, up to this many, as the cluster gets room for them (nodes "
                                 "joining); None: num_env_runners only (num_env_runners='auto' sets it)"),
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
