"""Generalised advantage estimation over NEXT_STEP-autoreset fragments."""

from __future__ import annotations

import numpy as np


def compute_gae(rewards: np.ndarray, values: np.ndarray, terminateds: np.ndarray,
                truncateds: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and value targets, each (T, B), from a fragment's arrays.

    ``values`` is (T+1, B): V of every observation in the fragment, the last one
    included. After a step that ends an episode, the next observation is that
    episode's final observation (NEXT_STEP autoreset), so ``values[t + 1]`` is
    exactly the bootstrap value a truncated step needs; a terminated step
    bootstraps from 0. The advantage chain is cut at every episode end, so the
    reset-only step that follows (masked out of the batch) never leaks into it.
    """
    num_steps = rewards.shape[0]
    advantages = np.zeros_like(rewards, dtype=np.float32)
    not_terminal = 1.0 - terminateds.astype(np.float32)
    continues = 1.0 - (terminateds | truncateds).astype(np.float32)
    last = np.zeros(rewards.shape[1:], dtype=np.float32)
    for t in reversed(range(num_steps)):
        delta = rewards[t] + gamma * values[t + 1] * not_terminal[t] - values[t]
        last = delta + gamma * lam * continues[t] * last
        advantages[t] = last
    return advantages, advantages + values[:-1]
