import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


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


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray for the whole pytest process (tests that need another cluster use a subprocess)."""
    import logging

    import ray

    ray.init(address="local", include_dashboard=False, num_cpus=4, object_store_memory=150_000_000,
             logging_level=logging.WARNING)
    yield ray
    ray.shutdown()
