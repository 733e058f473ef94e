"""Sampling: EnvRunner (a vector env + the policy -> a Fragment) and advantage helpers."""

from herdrl.rollout.advantages import compute_gae
from herdrl.rollout.runner import EnvRunner, Fragment

__all__ = ["EnvRunner", "Fragment", "compute_gae"]
