"""Sampling: EnvRunner (a vector env + the policy -> a Fragment) and advantage helpers.

Names load on first use, so a runner process imports only what its policy needs (numpy policies: no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from herdrl.lazy import lazy_attributes

_LAZY = {"EnvRunner": "herdrl.rollout.runner", "Fragment": "herdrl.rollout.runner",
         "compute_gae": "herdrl.rollout.advantages"}

if TYPE_CHECKING:
    from herdrl.rollout.advantages import compute_gae
    from herdrl.rollout.runner import EnvRunner, Fragment


__getattr__ = lazy_attributes(__name__, _LAZY)

__all__ = ["EnvRunner", "Fragment", "compute_gae"]
