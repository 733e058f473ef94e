"""Asynchronous sampling for IMPALA/APPO: fragments as they arrive, never a barrier.

``AsyncSampler`` keeps up to ``max_requests_in_flight_per_env_runner`` sample calls outstanding on every Ray
runner. Each call carries the newest broadcast weights (one object-store reference, shared by every call until
the next broadcast) and its version; a runner loads weights only when the version changed, and stamps the
version on its fragment, so the learner can measure the policy lag and V-trace can correct for it.
:meth:`fetch` returns whatever fragments are ready (waiting for the first one only). Memory is bounded: the
caller passes how much room its queue has, and no new call is made beyond it, so runners wait when the learner
falls behind (backpressure) instead of piling fragments up.

``LocalSampler`` is the in-process form (``num_env_runners=0``): one fragment per fetch, sampled with the
current weights (lag 0), so the same algorithm runs without Ray.
"""

from __future__ import annotations

import time
from typing import Any

from herdrl.rollout.group import LocalRunnerGroup, RayRunnerGroup, RunnerFailure, _one_line
from herdrl.rollout.runner import Fragment


class LocalSampler:
    """Synchronous sampling in the driver, with the same interface as :class:`AsyncSampler`."""

    num_in_flight = 0
    num_dropped = 0

    def __init__(self, group: LocalRunnerGroup) -> None:
        self.runner = group.runner

    def set_weights(self, weights: dict[str, Any], version: int) -> None:
        """Sample with these weights from now on."""
        self.runner.set_weights(weights, version)

    def fetch(self, room: int) -> list[Fragment]:
        """One fragment (none when there is no room)."""
        return [self.runner.sample()] if room > 0 else []


class AsyncSampler:
    """Sample calls kept in flight on every healthy runner of a :class:`RayRunnerGroup`."""

    def __init__(self, group: RayRunnerGroup, max_in_flight: int) -> None:
        self.group = group
        self.max_in_flight = max_in_flight
        self._calls: dict[Any, tuple[int, Any, float]] = {}  # ref -> (runner index, actor, submit time)
        self._weights_ref: Any = None
        self._version = 0
        self._last_call: dict[int, float] = {}  # runner index -> when it was last given a call
        self.num_dropped = 0  # fragments lost with a failed runner (its in-flight calls)

    @property
    def num_in_flight(self) -> int:
        """Sample calls submitted and not yet fetched."""
        return len(self._calls)

    def set_weights(self, weights: dict[str, Any], version: int) -> None:
        """Calls made from now on carry these weights (one object-store copy for all of them)."""
        import ray

        self._weights_ref, self._version = ray.put(weights), version

    def fetch(self, room: int) -> list[Fragment]:
        """Top the calls up (at most ``room`` more fragments in flight), wait for the first to finish, and return
        every fragment that is ready. A runner that failed is handled as in synchronous sampling (restarted,
        or dropped if the config says so); only its in-flight fragments are lost."""
        import ray

        self._top_up(room)
        if not self._calls:
            return []
        timeout = self.group.config.sample_timeout_s
        ready, pending = ray.wait(list(self._calls), num_returns=1, timeout=timeout)
        if pending:
            ready += ray.wait(pending, num_returns=len(pending), timeout=0)[0]
        if not ready:
            self._fail_stuck(timeout)
            return []
        fragments = []
        for ref in ready:
            if ref not in self._calls:
                continue  # a call of a runner that failed earlier in this loop: already counted as dropped
            index, actor, _ = self._calls.pop(ref)
            try:
                fragments.append(ray.get(ref))
            except ray.exceptions.RayError as exc:
                self._runner_failed(index, actor, exc)
        return fragments

    def _top_up(self, room: int) -> None:
        """Spend ``room`` on new calls, each to the runner holding the fewest (the longest-waiting first), so a
        buffer smaller than runners x requests still keeps every runner busy."""
        counts = [0] * len(self.group.actors)
        for index, _, _ in self._calls.values():
            counts[index] += 1
        while room > 0:
            open_runners = [i for i, actor in enumerate(self.group.actors)
                            if actor is not None and counts[i] < self.max_in_flight]
            if not open_runners:
                return
            index = min(open_runners, key=lambda i: (counts[i], self._last_call.get(i, 0.0)))
            actor = self.group.actors[index]
            ref = actor.sample_with.remote(self._weights_ref, None, self._version)
            self._calls[ref] = (index, actor, time.monotonic())
            self._last_call[index] = time.monotonic()
            counts[index] += 1
            room -= 1

    def _runner_failed(self, index: int, actor: Any, exc: BaseException) -> None:
        if self.group.actors[index] is not actor:
            self.num_dropped += 1  # an earlier call of the same failed runner: already replaced
            return
        lost = [ref for ref, (i, a, _) in self._calls.items() if i == index and a is actor]
        for ref in lost:
            del self._calls[ref]
        self.num_dropped += 1 + len(lost)
        self.group._handle_failure(index, exc)
        if self.group.num_healthy == 0:
            raise RunnerFailure(f"every env runner has failed (last: runner {index + 1}: {_one_line(exc)})")

    def _fail_stuck(self, timeout: float | None) -> None:
        """Nothing finished within ``sample_timeout_s``: the runners with the oldest calls count as failed."""
        now = time.monotonic()
        stuck = {(i, a) for i, a, submitted in self._calls.values() if now - submitted >= (timeout or 0)}
        for index, actor in stuck:
            self._runner_failed(index, actor, TimeoutError(
                f"no fragment within sample_timeout_s={timeout:g} s"))
