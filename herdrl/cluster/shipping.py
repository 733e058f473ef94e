"""Ship the user's env code to runner processes that cannot import it.

A creator given to ``register_env`` usually lives in the user's own module (``my_envs.py`` next to their
script), which other nodes do not have. Ray pickles functions and classes *by reference* (the worker
imports the module) unless their module is registered for pickling *by value*. We find the user modules
a creator depends on — its own module, and the modules of the functions, classes and modules it refers
to — and register them, so their code travels with the runner actors. Installed packages (site-packages,
the standard library, herdrl) are left alone: every node has them.

Not shipped this way: data files and compiled extensions. For those, give Ray a runtime_env
(``.resources(runtime_env={"working_dir": "."})`` or ``herd train --working-dir .``).
"""

from __future__ import annotations

import inspect
import os
import sys
import sysconfig
import types
from collections.abc import Iterable
from typing import Any

_INSTALLED_ROOTS = tuple(
    os.path.realpath(p) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)
_HERDRL_ROOT = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def is_user_module(module: types.ModuleType | None) -> bool:
    """A module from a plain file that is neither installed nor part of herdrl."""
    path = getattr(module, "__file__", None)
    if module is None or not path or module.__name__ == "__main__":
        return False
    real = os.path.realpath(path)
    if "site-packages" in real or "dist-packages" in real or real.startswith(_HERDRL_ROOT + os.sep):
        return False
    return not real.startswith(_INSTALLED_ROOTS)


def user_modules(objects: Iterable[Any], max_depth: int = 4) -> list[types.ModuleType]:
    """User modules that ``objects`` (functions, classes, instances) need, following their references."""
    found: dict[str, types.ModuleType] = {}
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if id(obj) in seen or depth > max_depth:
            return
        seen.add(id(obj))
        if isinstance(obj, types.ModuleType):
            if is_user_module(obj):
                found[obj.__name__] = obj
            return
        if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj)):
            obj = type(obj)
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        user = is_user_module(module)
        if user:
            found[module.__name__] = module
        elif module is not None and module.__name__ != "__main__":
            return  # installed code: whatever it uses is installed too
        if inspect.ismethod(obj):
            obj = obj.__func__
        if inspect.isfunction(obj):
            for name in obj.__code__.co_names:
                if name in obj.__globals__:
                    visit(obj.__globals__[name], depth + 1)
            for cell in obj.__closure__ or ():
                try:
                    visit(cell.cell_contents, depth + 1)
                except ValueError:  # an empty cell
                    pass
        elif inspect.isclass(obj):
            for base in obj.__mro__[1:]:
                visit(base, depth + 1)
            for member in vars(obj).values():
                if inspect.isfunction(member):
                    visit(member, depth + 1)

    for obj in objects:
        visit(obj, 0)
    return list(found.values())


def ship_by_value(objects: Iterable[Any]) -> list[str]:
    """Register the user modules ``objects`` need for by-value pickling; return their names."""
    from ray import cloudpickle

    modules = user_modules(objects)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    return [m.__name__ for m in modules]
