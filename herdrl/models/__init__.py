"""Torch networks and their fast numpy inference twin."""

from herdrl.models.actor_critic import ActorCritic
from herdrl.models.numpy_policy import NumpyPolicy

__all__ = ["ActorCritic", "NumpyPolicy"]
