"""Name lookups: algorithm names -> config classes, env names -> creators, encoder names -> factories.

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
    "IMPALA": "herdrl.algorithms.impala:IMPALAConfig",
    "APPO": "herdrl.algorithms.appo:APPOConfig",
    "A2C": "herdrl.algorithms.a2c:A2CConfig",
    "TRPO": "herdrl.algorithms.trpo:TRPOConfig",
    "DQN": "herdrl.algorithms.dqn:DQNConfig",
    "SAC": "herdrl.algorithms.sac:SACConfig",
    "TD3": "herdrl.algorithms.td3:TD3Config",
    "DDPG": "herdrl.algorithms.td3:DDPGConfig",
    "QMIX": "herdrl.algorithms.qmix:QMIXConfig",
    "BC": "herdrl.algorithms.bc:BCConfig",
    "MARWIL": "herdrl.algorithms.marwil:MARWILConfig",
    "CQL": "herdrl.algorithms.cql:CQLConfig",
    "IQL": "herdrl.algorithms.iql:IQLConfig",
}

class EnvContext(dict):
    """The ``env_config`` a registered creator receives: the dict itself, plus where it runs (RLlib's EnvContext):
    ``worker_index`` (0 in the driver, 1.. for Ray runners) and ``vector_index`` (the copy within the runner), so
    a creator can vary its envs per runner (``lambda cfg: MyEnv(seed=cfg.worker_index)``)."""

    def __init__(self, env_config: dict, worker_index: int = 0, vector_index: int = 0) -> None:
        super().__init__(env_config)
        self.worker_index, self.vector_index = worker_index, vector_index


# Names given to register_env -> creator(env_config) -> gymnasium.Env
ENV_CREATORS: dict[str, Callable[[dict], Any]] = {}


def judged_metric(algorithm: str | None) -> str:
    """The result key ``algorithm`` is judged by (its config's ``stop_metric``); ``episode_return_mean`` for an
    unknown or missing name."""
    if not algorithm or algorithm.upper() not in ALGORITHMS:
        return "episode_return_mean"
    return get_config_class(algorithm).stop_metric


def get_config_class(name: str) -> type:
    """Return the config class of an algorithm by name (case-insensitive: ``ppo``, ``PPO``)."""
    path = ALGORITHMS.get(name.upper())
    if path is None:
        raise AlgorithmNotFound(
            f"unknown algorithm '{name}'{did_you_mean(name, ALGORITHMS)}; known: {', '.join(ALGORITHMS)}")
    module, cls = path.split(":")
    return getattr(importlib.import_module(module), cls)


def algorithms_with_key(key: str) -> list[str]:
    """The algorithms whose configs have ``key`` (or an alias of it), e.g. ``input_`` -> BC, MARWIL, CQL, IQL."""
    names = []
    for name in ALGORITHMS:
        config_class = get_config_class(name)
        if config_class.aliases().get(key, key) in config_class.fields():
            names.append(name)
    return names


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


#: Names given to :func:`register_encoder` -> factory(observation_space, config) -> nn.Module with ``out_dim``.
ENCODERS: dict[str, Callable[[Any, dict], Any]] = {}


def register_encoder(name: str, factory: Callable[[Any, dict], Any]) -> None:
    """Make your own encoder available as ``model={"custom_encoder": name, "custom_encoder_config": {...}}``.

    ``factory(observation_space, custom_encoder_config)`` returns a ``torch.nn.Module`` with an int attribute
    ``out_dim``; its ``forward`` gets a batch of observations in the space's own structure (dicts and tuples
    of tensors) and dtypes (uint8 frames as uint8, Discrete leaves as int64 indices) and returns
    ``(batch, out_dim)`` float features. The algorithm's heads go on top. Register it in a module you pass to
    ``--import`` so that runners, resumed runs and ``herd evaluate`` can build it too. Example::

        class Tiny(nn.Module):
            def __init__(self, space, config):
                super().__init__()
                self.out_dim = config.get("width", 32)
                self.net = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(space.shape)), self.out_dim), nn.ReLU())
            def forward(self, obs):
                return self.net(obs.float())

        herdrl.register_encoder("tiny", Tiny)
    """
    if not isinstance(name, str) or not name:
        raise TypeError("register_encoder(name, factory): name must be a non-empty string")
    if not callable(factory):
        raise TypeError(f"register_encoder('{name}', factory): factory must be callable, got {factory!r}")
    ENCODERS[name] = factory
