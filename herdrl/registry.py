"""Name lookups: algorithm names -> config classes, env names -> creators.

Algorithms are imported only when asked for, so ``import herdrl`` stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from herdrl.errors import AlgorithmNotFound, did_you_mean

# Upper-case name -> "module:ConfigClass". One line per algorithm.
ALGORITHMS: dict[str, str] = {
    "PPO": "herdrl.algorithms.ppo:PPOConfig",
    "A2C": "herdrl.algorithms.a2c:A2CConfig",
    "TRPO": "herdrl.algorithms.trpo:TRPOConfig",
    "DQN": "herdrl.algorithms.dqn:DQNConfig",
    "SAC": "herdrl.algorithms.sac:SACConfig",
}

# Names given to register_env -> creator(env_config) -> gymnasium.Env
ENV_CREATORS: dict[str, Callable[[dict], Any]] = {}


def get_config_class(name: str) -> type:
    """Return the config class of an algorithm by name (case-insensitive: ``ppo``, ``PPO``)."""
    path = ALGORITHMS.get(name.upper())
    if path is None:
        raise AlgorithmNotFound(
            f"unknown algorithm '{name}'{did_you_mean(name, ALGORITHMS)}; known: {', '.join(ALGORITHMS)}")
    module, cls = path.split(":")
    return getattr(importlib.import_module(module), cls)


def register_env(name: str, creator: Callable[[dict], Any]) -> None:
    """Make ``creator(env_config) -> gymnasium.Env`` available under ``name`` (RLlib's convention).

    Example::

        herdrl.register_env("my_corridor", lambda cfg: Corridor(length=cfg.get("length", 10)))
        PPOConfig().environment("my_corridor", env_config={"length": 20})
    """
    if not isinstance(name, str) or not name:
        raise TypeError("register_env(name, creator): name must be a non-empty string")
    if not callable(creator):
        raise TypeError(f"register_env('{name}', creator): creator must be callable, got {creator!r}")
    ENV_CREATORS[name] = creator
