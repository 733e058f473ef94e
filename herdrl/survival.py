"""What the run knows about the cluster's nodes coming and going, shared by the runner and learner groups.

Ray notices a dead node by its missed health checks (``RAY_health_check_*``: ~20 s with Ray's defaults, a few
seconds on the clusters herdrl starts, see :data:`HEALTH_CHECK_ENV`); a call to an actor on it then fails. Whoever
sees such a failure asks :func:`node_changes`, which compares the alive nodes with those seen before and says,
once each, which nodes went and which came: one console line per node, and the run's row counts the losses.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger("herdrl")

#: The health-check settings of the clusters herdrl starts (read by the head's GCS): a dead node is noticed in about
#: 5 s instead of about 20 s, while a raylet busy for a few seconds (a loaded node) is not declared dead. Any of them
#: set in the environment wins.
HEALTH_CHECK_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
                    "RAY_health_check_failure_threshold": "5", "RAY_health_check_initial_delay_ms": "2000"}

_seen: dict[str, str] = {}  # node id -> address, alive when last looked
_counts = {"lost": 0}
_lock = threading.Lock()  # training and evaluation runner groups look from two threads


def health_check_env() -> dict[str, str]:
    """:data:`HEALTH_CHECK_ENV`, less what the environment already sets."""
    return {key: value for key, value in HEALTH_CHECK_ENV.items() if key not in os.environ}


def nodes_lost() -> int:
    """Nodes seen dying in this process so far (a run reports the difference since it began)."""
    return _counts["lost"]


def node_changes() -> tuple[list[str], list[str]]:
    """The addresses of the nodes that died and of those that joined since the last look (logged, one line each).
    The first look only takes note; a Ray that cannot be asked changes nothing."""
    import ray

    with _lock:  # (read and compared as one: another thread's older list must not undo a newer one)
        try:
            alive = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")}
        except Exception as exc:  # the GCS itself unreachable: nothing to compare with
            logger.debug("herdrl: cannot list the cluster's nodes: %s", exc)
            return [], []
        if not _seen:
            _seen.update(alive)
            return [], []
        gone = [address for node, address in _seen.items() if node not in alive]
        came = [address for node, address in alive.items() if node not in _seen]
        _seen.clear()
        _seen.update(alive)
        _counts["lost"] += len(gone)
    for address in gone:
        logger.warning("herdrl: node %s is gone (%d node%s left)", address, len(alive), "" if len(alive) == 1 else "s")
    for address in came:
        logger.warning("herdrl: node %s joined (%d nodes)", address, len(alive))
    return gone, came


def forget_nodes() -> None:
    """Start over (a new Ray session): the next look only takes note."""
    with _lock:
        _seen.clear()
