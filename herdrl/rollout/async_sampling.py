"""Asynchronous sampling for IMPALA/APPO: fragments as they arrive, never a barrier.

``AsyncSampler`` keeps up to ``max_requests_in_flight_per_env_runner`` sample calls outstanding on every Ray
runner. Each call carries the newest broadcast weights (one object-store reference, shared by every call until
the next broadcast) and its version; a runner copies them into its policy only when a new broadcast came (Ray
still hands the arguments to every call, from the node's shared memory), and stamps the version on its fragment,
so the learner can measure the policy lag and V-trace can correct for it.
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
from herdrl.rollout.transport import Sampled, info_of, sampled


class LocalSampler:
    """Synchronous sampling in the driver, with the same interface as :class:`AsyncSampler`."""

    num_in_flight = 0
    num_dropped = 0

    def __init__(self, group: LocalRunnerGroup) -> None:
        self.runner = group.runner

    def set_weights(self, weights: dict[str, Any], version: int | dict[str, int]) -> None:
        """Sample with these weights from now on."""
        self.runner.set_weights(weights, version)

    def fetch(self, room: int) -> list[Sampled]:
        """One fragment (none when there is no room)."""
        if room <= 0:
            return []
        fragment = self.runner.sample()
        return [Sampled(info_of(fragment), fragment)]

    def forget_in_flight(self) -> None:
        """Nothing is in flight in-process."""


class AsyncSampler:
    """Sample calls kept in flight on every healthy runner of a :class:`RayRunnerGroup`."""

    def __init__(self, group: RayRunnerGroup, max_in_flight: int) -> None:
        self.group = group
        self.max_in_flight = max_in_flight
        # info reference -> (runner index, actor, fragment reference): only infos are fetched here
        self._calls: dict[Any, tuple[int, Any, Any]] = {}
        # info reference -> (runner index, actor): calls a restore dropped, which their runners still run (an actor
        # runs its calls in order; ray.cancel does not stop a synchronous actor's call once begun, and in Ray 2.60
        # the queued ones ran too): counted on their runner until they finish, so new calls do not queue behind
        # them past max_in_flight, and a runner that finishes one is heard from
        self._dropped_calls: dict[Any, tuple[int, Any]] = {}
        self._weights_ref: Any = None
        self._version = 0  # stamped on fragments: the learner's update count (policy lag)
        self._broadcast = 0  # which broadcast: never repeats, so runners reload exactly when it changes
        self._last_call: dict[int, float] = {}  # runner index -> when it was last given a call
        # A runner must deliver within sample_timeout_s of its last fragment or first call (a replacement gets the
        # start-up grace synchronous sampling gives); one that does not counts as failed, the others go on.
        self._heard: dict[int, tuple[Any, float]] = {}  # runner index -> (actor, last fragment or start time)
        self.num_dropped = 0  # fragments lost: with a failed runner, or sampled before a restore

    @property
    def num_in_flight(self) -> int:
        """Sample calls submitted and not yet fetched."""
        return len(self._calls)

    def set_weights(self, weights: dict[str, Any], version: int | dict[str, int]) -> None:
        """Calls made from now on carry these weights (one object-store copy for all of them) and their version
        (multi-agent runs: each trained policy's)."""
        import ray

        self._weights_ref, self._version = ray.put(weights), version
        self._broadcast += 1

    def forget_in_flight(self) -> None:
        """Drop the calls in flight (a restore: they sample the old timeline); their fragments count as dropped.
        Their runners still run them: until they finish, they count among their runners' calls in flight."""
        self.num_dropped += len(self._calls)
        self._dropped_calls.update({ref: (index, actor) for ref, (index, actor, _) in self._calls.items()})
        self._calls.clear()

    def fetch(self, room: int) -> list[Sampled]:
        """Top the calls up (at most ``room`` more fragments in flight), wait for the first to finish, and return
        every fragment that is ready. A runner that failed or went silent for ``sample_timeout_s`` is handled as
        in synchronous sampling (restarted, or dropped if the config says so); only its in-flight fragments are
        lost. The fragments themselves stay in the object store (``herdrl.rollout.transport``)."""
        import ray

        self.group.admit()
        self.group.follow_cluster()  # (max_env_runners: runners added where the cluster has room)
        self._dropped_calls = {ref: (index, actor) for ref, (index, actor) in self._dropped_calls.items()
                               if self.group.actors[index] is actor}  # (a runner replaced since: nothing to wait for)
        if room > 0 and not self._calls:
            self.group.wait_for_runner()  # none in service: the replacements must be placed first
        self._top_up(room)
        if not self._calls and not self._dropped_calls:
            return []
        ready, pending = ray.wait([*self._calls, *self._dropped_calls], num_returns=1,
                                  timeout=self._time_to_deadline())
        if pending:
            ready += ray.wait(pending, num_returns=len(pending), timeout=0)[0]
        fragments = []
        for ref in ready:
            if ref in self._dropped_calls:
                self._drop_finished(ref)
                continue
            if ref not in self._calls:
                continue  # a call of a runner that failed earlier in this loop: already counted as dropped
            index, actor, data = self._calls.pop(ref)
            try:
                fragments.append(sampled(ray.get(ref), data))
                self._heard[index] = (actor, time.monotonic())
            except ray.exceptions.RayError as exc:
                self._runner_failed(index, actor, exc, uncounted=1)
        self._fail_silent()
        return fragments

    def _drop_finished(self, ref: Any) -> None:
        """A dropped call finished: its fragment is let go (counted as dropped already), its runner was heard from."""
        import ray

        index, actor = self._dropped_calls.pop(ref)
        try:
            ray.get(ref)  # (the info only)
        except ray.exceptions.RayError as exc:
            self._runner_failed(index, actor, exc)
            return
        if self.group.actors[index] is actor:
            self._heard[index] = (actor, time.monotonic())

    def _outstanding(self) -> list[tuple[int, Any]]:
        """(runner index, actor) of every call a runner has yet to finish, the dropped ones included."""
        return [*((index, actor) for index, actor, _ in self._calls.values()), *self._dropped_calls.values()]

    def _top_up(self, room: int) -> None:
        """Spend ``room`` on new calls, each to the runner holding the fewest (the longest-waiting first), so a
        buffer smaller than runners x requests still keeps every runner busy."""
        counts = [0] * len(self.group.actors)
        for index, _ in self._outstanding():
            counts[index] += 1
        while room > 0:
            open_runners = [i for i, actor in enumerate(self.group.actors)
                            if actor is not None and counts[i] < self.max_in_flight]
            if not open_runners:
                return
            index = min(open_runners, key=lambda i: (counts[i], self._last_call.get(i, 0.0)))
            actor = self.group.actors[index]
            if self._heard.get(index, (None,))[0] is not actor:  # first call: a replacement gets the start-up grace
                replaced = index in self._heard and self._timeout() != float("inf")
                self._heard[index] = (actor, time.monotonic() + (self._grace() - self._timeout() if replaced else 0.0))
            ref, data = actor.sample_with.options(num_returns=2).remote(self._weights_ref, None, self._version,
                                                                         self._broadcast)
            self._calls[ref] = (index, actor, data)
            self._last_call[index] = time.monotonic()
            counts[index] += 1
            room -= 1

    def _timeout(self) -> float:
        timeout = self.group.config.sample_timeout_s
        return float("inf") if timeout is None else timeout

    def _grace(self) -> float:
        return max(120.0, self._timeout())

    def _silent(self) -> list[tuple[int, Any]]:
        """Runners with calls in flight that have not delivered within their time."""
        now, busy = time.monotonic(), dict(self._outstanding())
        return [(index, actor) for index, actor in busy.items()
                if now - self._heard.get(index, (actor, now))[1] >= self._timeout()]

    def _time_to_deadline(self) -> float | None:
        if self._timeout() == float("inf"):
            return None
        now = time.monotonic()
        deadlines = [self._heard.get(index, (actor, now))[1] + self._timeout() - now
                     for index, actor in self._outstanding()]
        return max(0.0, min(deadlines)) if deadlines else None

    def _fail_silent(self) -> None:
        for index, actor in self._silent():
            self._runner_failed(index, actor, TimeoutError(
                f"no fragment within sample_timeout_s={self._timeout():g} s"))

    def _runner_failed(self, index: int, actor: Any, exc: BaseException, uncounted: int = 0) -> None:
        """Runner ``index`` failed: its calls are dropped (and counted, with ``uncounted`` more: the failed call
        taken out of the calls in flight) and the group handles it, unless it was replaced already."""
        if self.group.actors[index] is not actor:
            self.num_dropped += uncounted  # an earlier call of the same failed runner: already replaced
            return
        lost = [ref for ref, (i, a, _) in self._calls.items() if i == index and a is actor]
        for ref in lost:
            del self._calls[ref]
        for ref in [ref for ref, (i, a) in self._dropped_calls.items() if i == index and a is actor]:
            del self._dropped_calls[ref]  # (counted when they were dropped)
        self.num_dropped += uncounted + len(lost)
        self.group._handle_failure(index, exc)
        if self.group.num_healthy == 0 and not self.group.waiting:
            raise RunnerFailure(f"every env runner has failed (last: runner {index + 1}: {_one_line(exc)})")
