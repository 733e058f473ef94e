"""Package attributes loaded on first use (PEP 562), so importing a package pulls in only what is used: ``import
herdrl`` stays fast, and a light runner imports the numpy halves of ``herdrl.models`` without torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_attributes(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``names`` maps an attribute to the module that defines it."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module '{package}' has no attribute '{name}'")

    return __getattr__
