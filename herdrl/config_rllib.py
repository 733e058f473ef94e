"""RLlib's calls that have no herdrl section of their own, translated into herdrl's keys (or a note).

``.exploration()`` (EpsilonGreedy settings -> DQN's ``epsilon`` schedule), ``.rl_module()`` (``model_config`` ->
``model``), ``.reporting()``, ``.checkpointing()`` and ``.api_stack()``: :class:`RLlibCalls` holds them, and
:class:`~herdrl.config.AlgorithmConfig` inherits it. An RLlib setting accepted that changes nothing here says so
once per kind, in one warning line (:func:`_note`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from herdrl.config_fields import MODEL_DEFAULTS
from herdrl.errors import ConfigError

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


class RLlibCalls:
    """RLlib's builder calls with little or nothing to set here: each sets the herdrl keys it maps to (through the
    config's ``_set``) and names what it leaves out in a note."""

    def api_stack(self, **kwargs: Any) -> RLlibCalls:
        """RLlib's switch between its old and new API stacks: herdrl has one; accepted, with a note."""
        _note(".api_stack(...)", "herdrl has one API stack (EnvRunner / Learner / module, as RLlib's new one)")
        return self

    def reporting(self, **kwargs: Any) -> RLlibCalls:
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

    def checkpointing(self, **kwargs: Any) -> RLlibCalls:
        """RLlib's checkpoint options: herdrl checkpoints are always its own pickle-free format (``herd export``
        writes torch.export / ONNX files); accepted, with a note."""
        if kwargs:
            _note(f".checkpointing({', '.join(sorted(kwargs))})", "checkpoints are herdrl's own format; export "
                  "models with `herd export`")
        return self

    def exploration(self, *, explore: bool | None = None, exploration_config: Mapping[str, Any] | None = None,
                    **kwargs: Any) -> RLlibCalls:
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
                  **kwargs: Any) -> RLlibCalls:
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
