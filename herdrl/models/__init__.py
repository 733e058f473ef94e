"""Torch networks and their fast numpy inference twin."""

from herdrl.models.actor_critic import ActorCritic, TorchPolicy
from herdrl.models.numpy_policy import NumpyPolicy

__all__ = ["ActorCritic", "NumpyPolicy", "TorchPolicy"]
