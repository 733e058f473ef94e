"""Behaviour cloning: the policy learns to take the dataset's actions (maximum likelihood, ``-mean(log pi(a|s))``).

MARWIL with ``beta = 0`` (as in RLlib): the same learner, no advantage weights and no value loss. A warm start for
online training: ``herd train ppo --init-from`` a BC checkpoint (see docs/offline.md).
"""

from __future__ import annotations

from herdrl.algorithms.marwil import MARWIL, MARWILConfig
from herdrl.config import Field
from herdrl.errors import ConfigError


class BCConfig(MARWILConfig):
    """Behaviour cloning settings: MARWIL's, with ``beta`` fixed at 0."""

    algo_name = "BC"
    FIELDS = {"beta": Field(0.0, (float,), "training", low=0, doc="0: behaviour cloning (MARWIL's beta)")}

    def validate_algorithm(self) -> None:
        """beta stays 0 (MARWIL is the algorithm with advantage weights)."""
        if self.beta != 0.0:
            raise ConfigError(f"BC has beta=0; got {self.beta}: use MARWIL for advantage-weighted imitation")
        super().validate_algorithm()

    @classmethod
    def algo_class(cls) -> type:
        """:class:`BC`."""
        return BC


class BC(MARWIL):
    """Behaviour cloning on a recorded dataset."""

    config: BCConfig
