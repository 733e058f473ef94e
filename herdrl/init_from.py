"""``init_from``: start a run from the matching weights of another run's checkpoint (offline to online).

Every weight of the source's network whose name and shape the new network has too is copied (target networks
follow); the rest start fresh. A behaviour-cloning source never trained its value head, so it is not copied: a
PPO/A2C run from a BC checkpoint starts with the cloned policy and a fresh value head, and for its first
``init_value_warmup_iters`` iterations only the value head learns (the policy's weights get no gradient), so the
advantages the policy first learns from come from a value that has seen its returns, not from random outputs.
The observation filter's statistics come along when both runs filter observations; a source that filtered and a
run that does not (or the other way round) is refused, as is a network whose policy weights do not all find their
match (a different model config), and, on Box actions, an actor that squashes its actions with tanh (SAC, CQL,
IQL, TD3, DDPG) started from one that does not, or the other way round. Critics that saw actions in the env's
units (checkpoints written before model ``critic_unit_actions``) start a run whose critics see them in [-1, 1]
(or the other way round) with their first layer rewritten to read the new units: the same Q values.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from herdrl.checkpoint import (
    BOX_CRITICS,
    CheckpointError,
    critic_units_clash,
    read_meta,
    read_tensors,
    space_from_json,
)

logger = logging.getLogger("herdrl")

#: Algorithms whose checkpoints hold a value head they never trained.
UNTRAINED_VALUE = ("BC",)
#: Algorithms whose actor, on Box actions, puts its output through tanh into the bounds (the others' Gaussian mean
#: is the action itself): weights of the same names and shapes mean different actions across the two groups.
SQUASHING_ACTORS = BOX_CRITICS


def _names_of(module: torch.nn.Module, params: Any) -> set[str]:
    """The names of ``params`` (parameters of ``module``) in its state dict."""
    ids = {id(p) for p in params}
    return {name for name, p in module.named_parameters() if id(p) in ids}


def value_names(module: torch.nn.Module) -> set[str]:
    """The names of the module's value-function parameters (none for modules without a value head)."""
    return _names_of(module, module.value_parameters()) if hasattr(module, "value_parameters") else set()


def policy_names(module: torch.nn.Module) -> set[str]:
    """The names of the module's policy (actor) parameters; empty when it has no separate policy (a Q-network)."""
    getter = getattr(module, "policy_parameters", None) or getattr(module, "actor_parameters", None)
    return set() if getter is None else _names_of(module, getter())


def critics_in_our_units(weights: dict[str, torch.Tensor], module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``weights`` with the critics' made to read ``module``'s action input, where theirs saw actions in the other
    units (the env's, or [-1, 1]: model ``critic_unit_actions``). A critic's first layer reads the action in its
    last columns, and an action in one unit is an affine function of the same action in the other, so the change
    folds into that layer exactly: the same Q value for the same action."""
    scale, bias = module.action_scale.double().cpu(), module.action_bias.double().cpu()
    if module.critic_unit_actions:  # theirs read ours * scale + bias
        factor, shift = scale, bias
    else:  # theirs read (ours - bias) / scale (a dimension with low == high: 0)
        factor = torch.where(scale > 0, 1 / scale.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
        shift = -bias * factor
    converted, dim = dict(weights), module.action_dim
    for critic in ("q1", "q2"):
        layer = f"{critic}.mlp.0" if f"{critic}.mlp.0.weight" in weights else f"{critic}.head"
        if f"{layer}.weight" not in weights or f"{layer}.bias" not in weights:
            continue
        weight, layer_bias = weights[f"{layer}.weight"], weights[f"{layer}.bias"]
        reads_action = weight.double()[:, -dim:]
        converted[f"{layer}.weight"] = torch.cat([weight.double()[:, :-dim], reads_action * factor], dim=1).to(
            weight.dtype)
        converted[f"{layer}.bias"] = (layer_bias.double() + reads_action @ shift).to(layer_bias.dtype)
    return converted


def load_initial_weights(algo: Any) -> int:
    """Copy the matching weights of ``algo.config.init_from`` into ``algo``'s learners; return how many iterations
    the policy stays frozen while a fresh value head learns (0: none)."""
    config = algo.config
    meta = read_meta(Path(config.init_from))
    where = meta["path"]
    if algo.multi_agent or meta["config"].get("policies") is not None:
        raise CheckpointError("init_from is for single-agent runs (and checkpoints) only, for now")
    for kind, space in (("observation", algo.observation_space), ("action", algo.action_space)):
        theirs = space_from_json(meta["spaces"][kind])
        if theirs != space:
            raise CheckpointError(f"init_from: checkpoint '{where}' has {kind} space {theirs}; this run has {space}")
    theirs, ours = meta["algorithm"] in SQUASHING_ACTORS, config.algo_name in SQUASHING_ACTORS
    if isinstance(algo.action_space, gym.spaces.Box) and theirs != ours:
        raise CheckpointError(f"init_from: checkpoint '{where}' is a {meta['algorithm']} actor, which "
                              f"{'squashes' if theirs else 'does not squash'} its actions with tanh, and this "
                              f"{config.algo_name} run's {'does' if ours else 'does not'}: start from a checkpoint "
                              f"of an actor that {'does' if ours else 'does not'} ({', '.join(SQUASHING_ACTORS)} do)")
    tensors = read_tensors(where)
    source = tensors["learner"].get("module", {})
    target = algo.module.state_dict()
    values = value_names(algo.module)
    skip = values if meta["algorithm"] in UNTRAINED_VALUE else set()
    matched = {key: value for key, value in source.items()
               if key in target and key not in skip and tuple(value.shape) == tuple(target[key].shape)}
    if critic_units_clash(meta, config.algo_name, config.model, algo.action_space):
        matched = critics_in_our_units(matched, algo.module)
    policy = policy_names(algo.module) or set(target)
    missing = sorted(policy - set(matched))
    if missing:
        raise CheckpointError(f"init_from: {len(missing)} of this {config.algo_name} policy's {len(policy)} weights "
                              f"have no match in checkpoint '{where}' ({meta['algorithm']}), e.g. {missing[0]}: give "
                              "this run the model config the checkpoint was trained with (fcnet_hiddens, ...)")
    filters = tensors.get("filters") or {}
    if filters and not algo.normalizer.active:
        raise CheckpointError(f"init_from: checkpoint '{where}' normalised its observations: set "
                              "observation_filter='MeanStdFilter' (its statistics come along)")
    if algo.normalizer.active and not filters:
        raise CheckpointError(f"init_from: checkpoint '{where}' learned on raw observations: leave this run's "
                              "observation_filter at NoFilter (its policy would see filtered ones)")
    if filters:
        algo.normalizer.load_state(filters)
    algo.learners.apply("load_matching_weights", matched)
    algo.learners.sync()
    fresh = sorted(set(target) - set(matched))
    logger.info("herdrl: init_from %s: %d of %d weights copied%s", where, len(matched), len(target),
                f"; fresh: {', '.join(fresh[:6])}{' ...' if len(fresh) > 6 else ''}" if fresh else "")
    value_fresh = bool(values) and not (values & set(matched))
    return config.init_value_warmup_iters if value_fresh else 0
