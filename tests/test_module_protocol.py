"""The module protocol (``herdrl.models.protocol``) changed no result: the reference runs of
``tests/golden/module_protocol.py``, written by the code before it, end in bit-equal weights."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "golden"))
import module_protocol as golden  # noqa: E402


@pytest.mark.parametrize("name", ["ppo_mlp", "ppo_lstm", "ppo_cnn", "impala_lstm", "mappo_lstm", "ma_ppo_lstm",
                                  "qmix_rnn"])
def test_a_few_seeded_updates_end_in_the_weights_written_before_the_protocol(name):
    expected = np.load(golden.GOLDEN)
    weights = golden.run(name)
    assert sorted(weights) == sorted(k for k in expected.files if k.startswith(f"{name}/"))  # same state_dict keys
    differ = [key for key, value in weights.items() if not np.array_equal(value, expected[key])]
    assert not differ, differ
