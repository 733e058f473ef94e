"""The checks ``validate()`` runs (``build()`` calls it): each value's type and range, then the rules across keys.

:class:`ConfigChecks` holds them and :class:`~herdrl.config.AlgorithmConfig` inherits it; an algorithm adds its
own cross-key rules by overriding :meth:`ConfigChecks.validate_algorithm`. :func:`check_model` checks the ``model``
dict.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from herdrl.config_fields import ACTIVATIONS
from herdrl.errors import ConfigError


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_model(model: dict) -> None:
    """Raise ConfigError for the first key of the ``model`` dict whose value has the wrong type or range."""
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


class ConfigChecks:
    """``validate()`` and the checks it runs, for :class:`~herdrl.config.AlgorithmConfig`."""

    #: What ``evaluation_config`` may set: evaluation's own keys and the keys an env runner uses.
    EVALUATION_KEYS = ("explore", "max_steps", "env", "env_config", "num_envs_per_env_runner",
                       "gym_env_vectorize_mode", "num_cpus_per_env_runner", "num_gpus_per_env_runner",
                       "rollout_fragment_length", "sample_timeout_s")

    def validate(self) -> None:
        """Check every value's type and range, then the algorithm's cross-key rules. A recurrent model first takes
        :attr:`LSTM_DEFAULTS` for the keys the user left to their defaults. ``num_env_runners`` and
        ``num_envs_per_env_runner`` may be ``"auto"`` (:mod:`herdrl.auto_size`, at build): the rules are checked
        with the fewest runners and envs it may choose, and again on its choice."""
        auto = [key for key in ("num_env_runners", "num_envs_per_env_runner") if self._values[key] == "auto"]
        if not auto:
            return self._validate()
        from herdrl.sizing import fewest_runners

        least = fewest_runners(self._values)
        self._values.update({key: least if key == "num_env_runners" else 1 for key in auto})
        try:
            self._validate()
        finally:
            self._values.update({key: "auto" for key in auto})

    def _validate(self) -> None:
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
        check_model(self.model)
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
        if self.max_env_runners is not None:
            why = ("multi-agent runs do not add runners yet" if self.is_multi_agent
                   else "it adds Ray runners beside Ray runners: set num_env_runners >= 1 (or 'auto')"
                   if self.num_env_runners == 0 else f"it is less than num_env_runners={self.num_env_runners}"
                   if self.max_env_runners < self.num_env_runners else None)
            if why:
                raise ConfigError(f"max_env_runners={self.max_env_runners}: {why}")
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

    def _validate_callbacks(self) -> None:
        from herdrl.callbacks import check_hooks, hooks_of

        check_hooks(self.callbacks_hooks)
        hooks_of(self)  # the classes resolve (no instance is made here: a user's __init__ may open files)

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

    def _take_defaults(self, defaults: Mapping[str, Any], active: bool) -> None:
        """Each key of ``defaults`` that the user did not set explicitly takes its value there (``active``) or its
        field's own default (turned off again)."""
        fields = self.fields()
        for key, value in defaults.items():
            if not self.is_explicit(key):
                self._values[key] = copy.deepcopy(value if active else fields[key].default)
