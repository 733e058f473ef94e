"""Modules that register envs: the user's ``--import`` list, ``module:EnvId`` ids, well-known env packages.

Registration code (``gymnasium.register`` or ``herdrl.register_env`` calls) runs when its module is imported;
the command line imports it with ``herd train --import myenvs ...`` (or the ``imports:`` list of a ``-f`` file),
Python with :func:`import_envs`. What was imported is recorded (``params.json``, checkpoints) and imported
again in every Ray runner and Tune trial. A file never decides what is imported: a checkpoint whose env needs
a module gets an error naming the flag to add. Only the well-known packages of :data:`KNOWN_ENV_PACKAGES`
are imported without being asked, when an env id carries their prefix (``ALE/Pong-v5`` imports ``ale_py``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterable
from types import ModuleType

from herdrl.errors import EnvError

#: ``team:<env>``: the PettingZoo env ``<env>`` with its agents as one team (``herdrl.env.team``; QMIX, VDN). Not a
#: module to import: the env named after it is what is checked and made.
TEAM_PREFIX = "team:"


def plain_env(env: object) -> object:
    """``env`` without the team prefix (the env the user named)."""
    return env.removeprefix(TEAM_PREFIX) if isinstance(env, str) else env

#: Env id prefix -> the package whose import registers those ids (imported on demand).
KNOWN_ENV_PACKAGES: dict[str, str] = {
    "ALE/": "ale_py",
    "MinAtar/": "minatar",
    "MiniGrid-": "minigrid",
    "BabyAI-": "minigrid",
    "highway-": "highway_env",
    "merge-": "highway_env",
    "roundabout-": "highway_env",
    "parking-": "highway_env",
    "Fetch": "gymnasium_robotics",
    "HandManipulate": "gymnasium_robotics",
    "HandReach": "gymnasium_robotics",
    "AdroitHand": "gymnasium_robotics",
    "AntMaze_": "gymnasium_robotics",
    "PointMaze_": "gymnasium_robotics",
    "FrankaKitchen": "gymnasium_robotics",
    "procgen-": "procgen",
    "dm_control/": "shimmy",
}

OLD_ATARI_ID = re.compile(r"^(?P<game>[A-Z][A-Za-z]*?)(-ram)?(NoFrameskip|Deterministic)?-v[04]$")
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

#: Modules imported for envs in this process, in order (shipped to runners and trials, recorded in checkpoints).
IMPORTED: list[str] = []


def import_user_module(module: str) -> ModuleType:
    """Import one of the user's own modules: from the current folder (as ``python -m`` would) or installed.
    The folder is on the path only for this import, so nothing else herdrl imports can be shadowed by a file
    that happens to sit there."""
    added = os.getcwd() not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module)
    finally:
        if added and os.getcwd() in sys.path:
            sys.path.remove(os.getcwd())


def _import_installed(package: str) -> ModuleType:
    """Import a well-known package from the installed ones only (never a same-named file in this folder)."""
    here = {"", ".", os.getcwd()}
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if p not in here]
    try:
        return importlib.import_module(package)
    finally:
        sys.path[:] = saved


def _load(module: str) -> ModuleType:
    """Import an env module: a well-known package from the installed ones only, the user's own also from the
    current folder."""
    return _import_installed(module) if module in KNOWN_ENV_PACKAGES.values() else import_user_module(module)


def _remember(module: str) -> None:
    if module not in IMPORTED:
        IMPORTED.append(module)


def import_envs(*modules: str) -> None:
    """Import modules that register envs, here and (recorded) in every Ray runner and Tune trial started later.

    Example: ``herdrl.import_envs("myenvs")`` before ``PPOConfig().environment("Corridor-v0")``.
    """
    for module in modules:
        if not isinstance(module, str) or not _MODULE_NAME.match(module):
            raise EnvError(f"--import expects a module name such as myenvs or mypkg.envs, got {module!r}")
        try:
            _load(module)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's module is one line
            raise EnvError(f"--import {module}: the module cannot be imported "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
        _remember(module)


def import_for_env_id(env_id: str) -> str:
    """``MODULE:ID`` (as ``gymnasium.make`` takes it): import MODULE, which registers ID, and return ID."""
    module, _, name = env_id.partition(":")
    try:
        _load(module)
    except ImportError as exc:
        raise EnvError(f"cannot make env '{env_id}': module '{module}' cannot be imported ({exc})") from None
    _remember(module)  # runners and trials import it too
    return name


def adopt_driver_envs(modules: Iterable[str], creators: dict) -> None:
    """In a runner or trial process: import the driver's env modules and take its ``register_env`` creators."""
    from herdrl.registry import ENV_CREATORS

    import_envs(*modules)
    ENV_CREATORS.update(creators)


def known_package(env_id: str) -> str | None:
    """The well-known package that registers ``env_id`` (by its prefix), or None. Ids shaped like the old Atari
    ones (``Pong-v4``, ``Pong-ram-v0``) name ale_py when it is installed."""
    package = next((package for prefix, package in KNOWN_ENV_PACKAGES.items() if env_id.startswith(prefix)), None)
    if package is None and _is_old_atari_id(env_id):
        package = "ale_py"
    return package


def _is_old_atari_id(env_id: str) -> bool:
    """``Pong-v4``, ``SpaceInvadersNoFrameskip-v4``, ``Pong-ram-v0``: an old Atari id whose game ale-py (installed)
    has a ROM for; found without importing ale-py (``Corridor-v0`` is not one)."""
    match = OLD_ATARI_ID.match(env_id)
    spec = importlib.util.find_spec("ale_py") if match else None
    if spec is None or not spec.submodule_search_locations:
        return False
    game = re.sub(r"(?<!^)(?=[A-Z])", "_", match["game"]).lower()  # SpaceInvaders -> space_invaders
    folders = spec.submodule_search_locations
    return any(os.path.exists(os.path.join(folder, "roms", f"{game}.bin")) for folder in folders)


def import_known_package(env_id: str) -> None:
    """Import the well-known package an env id's prefix names; an error says how to install it."""
    package = known_package(env_id)
    if package is None:
        return
    if package not in IMPORTED:
        try:
            _load(package)
        except ImportError:
            raise EnvError(f"env '{env_id}' comes from the package '{package}', which is not installed: "
                           f"pip install {package.replace('_', '-')}") from None
        _remember(package)
    if package == "minatar":  # also where a runner imported it first, as the driver's module list says
        register_minatar()


#: MinAtar games have no time limit of their own; episodes stop here (far beyond a good Breakout game).
MINATAR_MAX_STEPS = 10_000
MINATAR_GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")


def register_minatar() -> None:
    """Register MinAtar's Gymnasium ids (``MinAtar/Breakout-v1``: minimal action set; ``-v0``: all 6 actions),
    which minatar does only when asked, with a time limit of :data:`MINATAR_MAX_STEPS` steps."""
    import gymnasium as gym

    for game in MINATAR_GAMES:
        name = game.title().replace("_", "")
        for version, minimal in (("v0", False), ("v1", True)):
            if f"MinAtar/{name}-{version}" not in gym.registry:
                gym.register(f"MinAtar/{name}-{version}", entry_point="minatar.gym:BaseEnv",
                             kwargs={"game": game, "use_minimal_action_set": minimal},
                             max_episode_steps=MINATAR_MAX_STEPS)


def modules_needed(recorded: Iterable[str]) -> list[str]:
    """Of the modules a checkpoint records, those the user has not imported (well-known packages excepted)."""
    known = set(KNOWN_ENV_PACKAGES.values())
    return [m for m in recorded if m not in IMPORTED and m not in known]


def import_flags(modules: Iterable[str]) -> str:
    """``--import a --import b (Python: herdrl.import_envs('a', 'b'))``: how to import ``modules``."""
    modules = list(modules)
    return (" ".join(f"--import {m}" for m in modules)
            + f" (Python: herdrl.import_envs({', '.join(repr(m) for m in modules)}))")


def env_origin(env: object) -> dict[str, object]:
    """What a checkpoint records about where its env comes from: the modules imported for envs, and for a
    ``register_env`` name the module of its creator (for the error a loader without it gets)."""
    from herdrl.registry import ENV_CREATORS

    origin: dict[str, object] = {"imports": list(IMPORTED)}
    if isinstance(env, str) and env in ENV_CREATORS:
        origin["env_module"] = getattr(ENV_CREATORS[env], "__module__", None)
    return origin


def check_env_importable(env: str | None, meta: dict, source: str) -> None:
    """Fail with the flag to add when the env of a checkpoint (``meta``, read from ``source``) needs a module
    the user has not imported; a file never imports anything itself (well-known packages excepted)."""
    import gymnasium as gym

    from herdrl.registry import ENV_CREATORS

    if not isinstance(env, str):
        return
    env = env.removeprefix(TEAM_PREFIX)  # a team of a PettingZoo env's agents (QMIX): the env itself is checked
    env_shown = "".join(c if c.isprintable() else "?" for c in env)  # a file's text reaches the terminal
    module, sep, name = env.partition(":")
    if sep and not _MODULE_NAME.match(module):
        raise EnvError(f"{source} is damaged: its env '{env_shown}' names no valid module")
    recorded = meta.get("imports", [])
    if not (isinstance(recorded, list) and all(isinstance(m, str) and _MODULE_NAME.match(m) for m in recorded)):
        raise EnvError(f"{source} is damaged: its 'imports' is not a list of module names")
    missing = modules_needed(recorded)
    if sep:
        if module not in IMPORTED:
            raise EnvError(f"{source} trained on '{env_shown}', which imports module '{module}' to make it; a file "
                           f"never decides what is imported: if you trust it, add {import_flags([module])}")
        return
    if env in ENV_CREATORS or env in gym.registry or known_package(env):
        return
    if missing:
        raise EnvError(f"{source} trained on env '{env_shown}', registered by module(s) {', '.join(missing)}, which "
                       f"are not imported; a file never decides what is imported: if you trust them, add "
                       f"{import_flags(missing)}")
    creator_module = meta.get("env_module")
    if isinstance(creator_module, str) and _MODULE_NAME.match(creator_module):
        hint = (import_flags([creator_module]) if creator_module != "__main__"
                else "--import MODULE with the module that registers it (it was registered by the training script)")
        raise EnvError(f"{source} trained on env '{env_shown}', which no imported module registers: add {hint}")
