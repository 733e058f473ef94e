"""Algorithms: the shared train loop (base.py) and one file per algorithm."""

from herdrl.algorithms.base import Algorithm

__all__ = ["Algorithm"]
