"""herdrl: distributed deep reinforcement learning on Ray, PyTorch and Gymnasium.

    from herdrl import PPOConfig
    algo = PPOConfig().environment("CartPole-v1").build()
    for _ in range(20):
        print(algo.train()["episode_return_mean"])

``import herdrl`` never imports Ray; in-process runs (``num_env_runners=0``,
the default) start no Ray at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from herdrl.errors import AlgorithmNotFound, ConfigError, EnvError, HerdError
from herdrl.registry import register_encoder, register_env

__version__ = "0.4.0"

# Heavy names (torch) load on first use, so `herd --help` and `import herdrl` stay fast.
_LAZY = {
    "AlgorithmConfig": "herdrl.config",
    "Algorithm": "herdrl.algorithms.base",
    "PPO": "herdrl.algorithms.ppo",
    "PPOConfig": "herdrl.algorithms.ppo",
    "Policy": "herdrl.policy",
    "A2C": "herdrl.algorithms.a2c",
    "A2CConfig": "herdrl.algorithms.a2c",
    "TRPO": "herdrl.algorithms.trpo",
    "TRPOConfig": "herdrl.algorithms.trpo",
    "DQN": "herdrl.algorithms.dqn",
    "DQNConfig": "herdrl.algorithms.dqn",
    "SAC": "herdrl.algorithms.sac",
    "SACConfig": "herdrl.algorithms.sac",
    "TD3": "herdrl.algorithms.td3",
    "TD3Config": "herdrl.algorithms.td3",
    "DDPG": "herdrl.algorithms.td3",
    "DDPGConfig": "herdrl.algorithms.td3",
    "IMPALA": "herdrl.algorithms.impala",
    "IMPALAConfig": "herdrl.algorithms.impala",
    "APPO": "herdrl.algorithms.appo",
    "APPOConfig": "herdrl.algorithms.appo",
    "QMIX": "herdrl.algorithms.qmix",
    "QMIXConfig": "herdrl.algorithms.qmix",
    "import_envs": "herdrl.env.imports",
    "RLlibCallback": "herdrl.callbacks",
    "DefaultCallbacks": "herdrl.callbacks",
    "MetricsLogger": "herdrl.callbacks",
    "PolicySpec": "herdrl.multi_agent",
}

if TYPE_CHECKING:
    from herdrl.algorithms.a2c import A2C, A2CConfig
    from herdrl.algorithms.appo import APPO, APPOConfig
    from herdrl.algorithms.base import Algorithm
    from herdrl.algorithms.dqn import DQN, DQNConfig
    from herdrl.algorithms.impala import IMPALA, IMPALAConfig
    from herdrl.algorithms.ppo import PPO, PPOConfig
    from herdrl.algorithms.qmix import QMIX, QMIXConfig
    from herdrl.algorithms.sac import SAC, SACConfig
    from herdrl.algorithms.td3 import DDPG, TD3, DDPGConfig, TD3Config
    from herdrl.algorithms.trpo import TRPO, TRPOConfig
    from herdrl.callbacks import DefaultCallbacks, MetricsLogger, RLlibCallback
    from herdrl.config import AlgorithmConfig
    from herdrl.env.imports import import_envs
    from herdrl.multi_agent import PolicySpec
    from herdrl.policy import Policy


def __getattr__(name: str) -> Any:
    import importlib

    if name == "tune":  # Ray Tune helpers; the module imports Ray only when used
        return importlib.import_module("herdrl.tune")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'herdrl' has no attribute '{name}'")


__all__ = ["A2C", "A2CConfig", "APPO", "APPOConfig", "Algorithm", "AlgorithmConfig", "AlgorithmNotFound",
           "ConfigError", "DDPG", "DDPGConfig", "DefaultCallbacks", "DQN", "DQNConfig", "EnvError", "HerdError",
           "IMPALA", "IMPALAConfig", "MetricsLogger", "PPO", "PPOConfig", "Policy", "PolicySpec", "QMIX", "QMIXConfig",
           "RLlibCallback",
           "SAC", "SACConfig", "TD3", "TD3Config", "TRPO", "TRPOConfig", "import_envs", "register_encoder",
           "register_env", "tune", "__version__"]
