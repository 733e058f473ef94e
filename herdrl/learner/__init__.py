"""Learners: an algorithm's module, optimizers and update, in the driver or as N data-parallel Ray actors."""

from herdrl.learner.learner import Learner, learner_device

__all__ = ["Learner", "learner_device"]
