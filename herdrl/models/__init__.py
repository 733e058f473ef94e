"""Torch networks and their fast numpy inference twin.

Names load on first use: a runner whose policy runs in numpy imports :mod:`herdrl.models.numpy_policy` and
:mod:`herdrl.models.action_layout` without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from herdrl.lazy import lazy_attributes

_LAZY = {"ActorCritic": "herdrl.models.actor_critic", "TorchPolicy": "herdrl.models.actor_critic",
         "NumpyPolicy": "herdrl.models.numpy_policy"}

if TYPE_CHECKING:
    from herdrl.models.actor_critic import ActorCritic, TorchPolicy
    from herdrl.models.numpy_policy import NumpyPolicy


__getattr__ = lazy_attributes(__name__, _LAZY)

__all__ = ["ActorCritic", "NumpyPolicy", "TorchPolicy"]
