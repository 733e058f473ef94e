"""Light runners: Ray runner processes that never import torch when their policy runs in numpy.

A Ray runner holding torch takes ~320 MB of memory; without it ~130 MB (about an idle Ray worker's 125 MB),
which is what lets dozens of runners share a node. Two things would pull torch into a runner: the algorithm's
config class (it lives beside the algorithm's torch code) and the policy network. So a runner is sent a
:class:`RunnerConfig` (the config's values, plain data; the config object itself travels as bytes, unpickled
only if the runner turns out to need torch) and starts without a policy. Once the first runner reports the
env's spaces, the driver builds the network, reads its numpy twin's :class:`~herdrl.models.numpy_policy.
MLPBlueprint` off it (an MLP on a vector observation; see ``numpy_blueprint``) and sends it to every runner:
those runners act in numpy on arrays of their own and load the learner's weights by name (every algorithm:
the actor-critic's distribution, DQN's epsilon-greedy, SAC's squashed Gaussian, TD3's noisy actor). Any other
network (CNNs, LSTMs, Dict observations, action masks, custom encoders, a runner GPU) and multi-agent runs: the
runner builds the torch network as before. Nothing to configure.
"""

from __future__ import annotations

import pickle
from typing import Any

#: The policy a runner was told to use: a blueprint (numpy), TORCH, or PENDING (not told yet).
TORCH = "torch"
PENDING = "pending"


class RunnerConfig:
    """What a runner reads of an algorithm's config, shippable to a process without the algorithm's module.

    Attributes read as on the config: its values (``config.env``, ``config.seed``, ...) and its class's constants
    (``algo_name``, ``behaviour_logp``, ``stores_raw_transitions``, ...); ``fragment_length()`` is resolved on the
    driver; :meth:`full` is the config object itself (imports the algorithm's module, hence torch). ``policy``: a
    blueprint, :data:`TORCH` or :data:`PENDING`.
    """

    def __init__(self, config: Any, packed: bytes, policy: Any = PENDING) -> None:
        """``packed``: ``config`` pickled by the driver (Ray's cloudpickle: env creators and callbacks classes
        defined in a script travel by value)."""
        self._values = config.to_dict()
        # The config class's constants runners read (behaviour_logp, stores_raw_transitions, ...): plain data.
        self._constants = {name: value for name, value in vars_of_class(type(config)).items()
                           if isinstance(value, (bool, int, float, str))}
        self._fragment_length = config.fragment_length()
        self.is_multi_agent = bool(config.is_multi_agent)
        self._packed = packed
        self._full: Any = None
        self.policy = policy

    def __getattr__(self, name: str) -> Any:
        for found in (self.__dict__.get("_values"), self.__dict__.get("_constants")):
            if found is not None and name in found:
                return found[name]
        raise AttributeError(f"a Ray runner's config has no '{name}' (it holds the config's values and its class's "
                             "constants; config.full() is the config object, which imports torch)")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_full": None}  # (the bytes travel; the object is rebuilt where needed)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def fragment_length(self) -> int:
        """Steps per env per ``sample()`` call (resolved on the driver)."""
        return self._fragment_length

    def full(self) -> Any:
        """The algorithm's config object (bytes from the driver that made this runner, never from disk)."""
        if self._full is None:
            self._full = pickle.loads(self._packed)  # noqa: S301 - our own driver's pickle, sent over Ray
        return self._full

    def with_policy(self, policy: Any) -> RunnerConfig:
        """A copy told which policy to use (for runners started later: restarts)."""
        clone = object.__new__(RunnerConfig)
        clone.__dict__.update({**self.__dict__, "policy": policy})
        return clone


def vars_of_class(cls: type) -> dict[str, Any]:
    """Every attribute a class defines or inherits (the nearest definition wins), callables included."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        found.update({k: v for k, v in vars(klass).items() if not k.startswith("_")})
    return found


def may_run_light(config: Any) -> bool:
    """Whether runners of ``config`` may act without torch, known before the env's spaces are: a single-agent
    run, no runner GPU, no LSTM, no custom encoder."""
    return (not config.is_multi_agent and not config.num_gpus_per_env_runner
            and not config.model.get("use_lstm") and not config.model.get("custom_encoder"))


def runner_policy_for(config: Any, observation_space: Any, action_space: Any) -> Any:
    """The driver's choice for runners of ``config``: the numpy twin's blueprint of the network it builds for
    these spaces, or :data:`TORCH` where there is none."""
    import torch

    from herdrl.filters import model_observation_space

    with torch.random.fork_rng(devices=[]):  # the learner's initial weights stay those of the seed
        module = config.build_module(model_observation_space(observation_space, config), action_space)
    return config.runner_blueprint(module) or TORCH
