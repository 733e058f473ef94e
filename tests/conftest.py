import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _restore_env_registry():
    """Tests may register envs; drop them afterwards so tests stay independent."""
    from herdrl.registry import ENV_CREATORS

    before = dict(ENV_CREATORS)
    yield
    ENV_CREATORS.clear()
    ENV_CREATORS.update(before)
