"""The Ray actor that wraps a MultiAgentEnvRunner (its policies act in torch)."""

from __future__ import annotations

import ray

from herdrl.rollout.multi_agent import MultiAgentEnvRunner
from herdrl.rollout.remote import _Remote


@ray.remote
class RemoteMultiAgentRunner(_Remote, MultiAgentEnvRunner):
    """A MultiAgentEnvRunner in its own process, possibly on another node."""
