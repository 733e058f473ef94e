"""Shared fixtures. `make test` runs the suite on two pytest-xdist workers (``-n 2 --dist loadgroup``;
`make test TEST_WORKERS=0` in one process): each worker is its own process with its own session Ray
(``ray_session``, on ports Ray picks free). Tests that cannot share the host with each other carry
``pytest.mark.xdist_group("cluster")``, so one worker runs them one after another: real Slurm/MPI/sshd services,
multi-node clusters on 127.0.0.x loopback addresses, and checks that scan the host's processes or /tmp for a
launch's leftovers. xdist hands out the largest group first (it has the most tests), the single tests go to
whichever worker is free. Plain ``pytest`` (no ``-n``) runs everything in one process, as before."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """``--dist loadgroup`` on pytest >= 9.2: pytest-xdist 3.8 marks a grouped test by appending ``@group`` to a
    field pytest no longer reads its node id from (pytest-xdist#1386), so the group was spread over both workers
    (two Slurm fixtures, each stopping the munged the other used); append it where pytest 9.2 reads it. Reports
    and ``--lf`` then name grouped tests ``...@cluster``, as they did before pytest 9.2."""
    if not getattr(config.option, "loadgroup", False):
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest < 9.2: xdist's own suffix takes effect
        return
    for item in items:
        groups = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                         for mark in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(groups)
        if groups and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)


@pytest.fixture(autouse=True)
def _restore_env_registry():
    """Tests may register envs or import env modules; drop them afterwards so tests stay independent."""
    from herdrl.env import imports
    from herdrl.registry import ENV_CREATORS

    before, imported = dict(ENV_CREATORS), list(imports.IMPORTED)
    yield
    ENV_CREATORS.clear()
    ENV_CREATORS.update(before)
    imports.IMPORTED[:] = imported


def _start_ray():
    import logging

    import ray

    ray.init(address="local", include_dashboard=False, num_cpus=4, object_store_memory=150_000_000,
             logging_level=logging.WARNING)
    return ray


_SESSION_RAY: list = []  # the session's Ray once ray_session started it (for the fixture below)


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray for the whole pytest process (tests that need another cluster use a subprocess)."""
    ray = _start_ray()
    _SESSION_RAY.append(ray)
    yield ray
    _SESSION_RAY.clear()
    ray.shutdown()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Marks a test whose call failed, for the fixture below."""
    outcome = yield
    if call.when == "call" and outcome.get_result().failed:
        item.herd_failed = True


@pytest.fixture(autouse=True)
def _fresh_ray_after_a_failure(request):
    """A test that fails before its ``algo.stop()`` leaves its actors holding the session Ray's CPUs, and every later
    test of this process that needs them would wait 60 s and fail too: after a failure, a session Ray whose CPUs
    are not all free within 5 s is started afresh (the failure itself is reported as it was)."""
    yield
    if not getattr(request.node, "herd_failed", False) or not _SESSION_RAY or not _SESSION_RAY[0].is_initialized():
        return

    _wait_for_free_cpus(_SESSION_RAY[0], seconds=5)


@pytest.fixture
def whole_ray_cluster(ray_session):
    """The embedded Ray with every CPU free, for a test that reserves them all: waits for earlier tests' actors
    to give theirs back, and starts Ray afresh if they never do. Ray once kept 2 CPUs of removed placement
    groups after Tune's PBT restarted trials (no actor alive, all groups removed), and a 4-CPU trial then
    waited forever."""
    _wait_for_free_cpus(ray_session, seconds=30)
    yield ray_session


def _wait_for_free_cpus(ray, seconds: float) -> None:
    """Wait until every CPU of the embedded Ray is free; start Ray afresh if they are not within ``seconds``."""
    import time

    deadline = time.monotonic() + seconds
    while ray.available_resources().get("CPU", 0.0) < ray.cluster_resources()["CPU"]:
        if time.monotonic() > deadline:
            ray.shutdown()
            _start_ray()
            return
        time.sleep(0.5)
