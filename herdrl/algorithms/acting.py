"""Acting with an algorithm's trained policies, and its weights: ``compute_single_action``, ``compute_actions``,
``get_policy``, ``get_module``, ``get_weights`` / ``set_weights`` (RLlib's calls, flat or nested by module id).

:class:`Acting` is mixed into :class:`~herdrl.algorithms.base.Algorithm`; it acts with the policies and loads
weights into the learners that ``Algorithm.__init__`` builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from herdrl.errors import ConfigError
from herdrl.policy import Policy
from herdrl.results import DEFAULT_MODULE_ID


class Acting:
    """The trained policies and their weights, as scripts and RLlib's calls use them between iterations."""

    def get_policy(self, policy_id: str | None = None) -> Policy:
        """The trained policy (RLlib's ``algo.get_policy``); a multi-agent run's by ``policy_id``."""
        if not self.multi_agent:
            return self.policy
        if policy_id not in self.policies:
            raise ConfigError(f"policy_id {policy_id!r} is not a policy of this run; policies: {sorted(self.policies)}")
        return self.policies[policy_id]

    def get_weights(self, policies: list[str] | None = None) -> dict[str, Any]:
        """The learner module's weights as numpy arrays (copies: safe to ship while learning goes on), by name
        (a multi-agent run's ``<policy id>.<name>``). ``policies`` (RLlib's): module ids, and the weights nested
        by module as RLlib's ``get_weights`` gives them (a single-agent run's module: ``default_policy``); the flat
        dict answers ``["default_policy"]`` (and a multi-agent run's ``[policy_id]``) as well."""
        weights = ModuleWeights(self.learners.get_weights())
        if policies is None:
            return weights
        return {pid: weights[pid] for pid in policies}

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        """Load weights into the learner's module (the runners sample with them from the next iteration, and
        ``compute_single_action`` acts with them at once): what :meth:`get_weights` returns, flat or nested by
        module id as RLlib's ``{"default_policy": {...}}``. Every weight of each module given must be there."""
        flat = _flat_weights(weights, self.multi_agent)
        current = self.learners.get_weights()
        unknown = sorted(set(flat) - set(current))
        modules = {k.split(".", 1)[0] for k in flat} if self.multi_agent else None
        missing = sorted(k for k in current if k not in flat and (modules is None or k.split(".", 1)[0] in modules))
        problems = [f"{what} weights {', '.join(names[:3])}" for what, names in (("unknown", unknown),
                                                                              ("missing", missing)) if names]
        if problems:
            raise ConfigError(f"set_weights: {'; '.join(problems)} (give what get_weights() returns)")
        try:
            self.learners.apply("load_matching_weights", {k: torch.as_tensor(np.array(v)) for k, v in flat.items()})
        except RuntimeError as exc:  # a shape that differs
            raise ConfigError(f"set_weights: {str(exc).splitlines()[-1].strip()}") from None
        self.learners.sync()

    def get_module(self, module_id: str | None = None) -> torch.nn.Module | None:
        """RLlib's ``get_module``: the policy's torch module (the driver's copy; a multi-agent run's by
        ``module_id``, a policy id); None for a module id the run does not have, as in RLlib. herdrl's modules
        take observations (``module.dist_inputs(obs)``, ``module.act(obs, explore)``), not RLlib's batch dicts."""
        if not self.multi_agent:
            return self.module if module_id in (None, DEFAULT_MODULE_ID) else None
        return self.module[module_id] if module_id in self.policies else None

    def compute_single_action(self, obs: Any, explore: bool = False, policy_id: str | None = None) -> Any:
        """The action for one observation: an int (Discrete) or an array clipped to the Box bounds (``policy_id``:
        which policy of a multi-agent run)."""
        return self.get_policy(policy_id).compute_single_action(obs, explore=explore)

    def compute_actions(self, observations: Mapping[Any, Any], explore: bool = False,
                        policy_id: str | None = None) -> dict[Any, Any]:
        """RLlib's older call: an action for each entry of ``observations`` (agent id, or any key -> one
        observation). A single-agent run acts with its policy; a multi-agent run with ``policy_id``, else with each
        agent's policy where ``policy_mapping_fn`` names it without an episode ('shared', 'per_agent', a dict)."""
        if not isinstance(observations, Mapping):
            raise ConfigError("compute_actions takes a dict {agent or key: observation}; for one observation use "
                              "compute_single_action(obs)")
        actions = {}
        for key, obs in observations.items():
            pid = policy_id
            if self.multi_agent and pid is None:
                mapping = self.config.policy_mapping_fn
                if mapping == "shared" or (mapping is None and len(self.policies) == 1):
                    pid = next(iter(self.policies))
                elif mapping == "per_agent" or (mapping is None and key in self.policies):
                    pid = key
                elif isinstance(mapping, Mapping):
                    pid = mapping.get(key)
                else:
                    raise ConfigError("compute_actions: this run's policy_mapping_fn needs an episode: give "
                                      "policy_id=...")
            actions[key] = self.compute_single_action(obs, explore=explore, policy_id=pid)
        return actions


class ModuleWeights(dict):
    """``get_weights()``'s flat dict, name -> array, that also answers RLlib's module ids: ``["default_policy"]``
    (a single-agent run's whole module), ``[policy_id]`` (a multi-agent run's ``<policy id>.<name>`` weights)."""

    def __missing__(self, key: Any) -> Any:
        prefix = f"{key}."
        own = {k[len(prefix):]: v for k, v in self.items() if k.startswith(prefix)}
        if own:
            return own
        if key == DEFAULT_MODULE_ID and self:
            return dict(self)
        raise KeyError(key)


def _flat_weights(weights: Mapping[str, Any], multi_agent: bool) -> dict[str, Any]:
    """Weights flat by name, from a flat dict or one nested by module id (RLlib's ``get_weights()``)."""
    if not isinstance(weights, Mapping):
        raise ConfigError(f"set_weights takes a dict of weights (what get_weights() returns), got "
                          f"{type(weights).__name__}")
    if not weights or not all(isinstance(v, Mapping) for v in weights.values()):
        return dict(weights)
    if multi_agent:
        return {f"{pid}.{name}": value for pid, inner in weights.items() for name, value in inner.items()}
    if len(weights) != 1:
        raise ConfigError(f"set_weights: this run has one module; got weights of {sorted(weights)}")
    return dict(next(iter(weights.values())))


