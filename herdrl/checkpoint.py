"""Checkpoints: written atomically, read without running any code from disk.

A checkpoint is a directory::

    checkpoint_000040/
      checkpoint.json     format version, algorithm, config, counters, episode stats, spaces, numpy RNG state
      learner.pt          module and optimizer tensors, torch RNG state (torch.save of tensors/numbers only)
      replay_buffer.npz   off-policy algorithms with store_buffer_in_checkpoints, newest checkpoint only

Writing goes to a hidden temporary sibling, every file is fsync'ed, then the directory is renamed into place
(and the parent fsync'ed): a crash or a full disk mid-write leaves the previous checkpoints untouched and at
worst a ``.checkpoint_*.tmp-*`` directory that readers ignore and a later save removes once its writer is gone.
Replacing an existing checkpoint moves the old one aside first (``.checkpoint_*.old-*``); a crash between the
two renames is repaired by the next reader or writer, which puts the old checkpoint back.

Reading never unpickles: JSON for everything but tensors, ``torch.load(weights_only=True)`` (torch >= 2.6:
older versions can be tricked into unpickling, CVE-2025-32434), whose restricted loader accepts tensors,
numbers, strings and containers and refuses any other object, and ``numpy.load(allow_pickle=False)``. The config
a checkpoint holds never says where a run executes, what it installs or which cluster it joins: those keys
(:data:`~herdrl.site_keys.SITE_KEYS`) are written blank and dropped on loading (:func:`checkpoint_config`).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import secrets
import shutil
import socket
import stat
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from herdrl.errors import ConfigError, HerdError
from herdrl.site_keys import SITE_KEYS

#: 2: PPO/A2C ``vf_loss_coeff`` weighs the plain mean squared error (RLlib's formula; 1 weighed half of it).
FORMAT_VERSION = 3
PREFIX = "checkpoint_"
META_FILE = "checkpoint.json"
TUNE_SUBDIR = "herd"  # a Tune trial's checkpoint_N/ holds herdrl's checkpoint here
TENSOR_FILE = "learner.pt"

#: Keys that name code to run (callbacks): never saved (written empty) and never read back from a checkpoint.
CODE_KEYS = ("callbacks_class", "callbacks_hooks")

logger = logging.getLogger("herdrl")


class CheckpointError(HerdError):
    """A checkpoint is missing, damaged, from a newer herdrl, or does not fit the algorithm."""


def checkpoint_name(iteration: int) -> str:
    """``checkpoint_000040`` for iteration 40."""
    return f"{PREFIX}{iteration:06d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _writer_tag() -> str:
    """``<host>~<pid>~<random>``: who writes a temporary directory (so nobody else removes it while it does)."""
    host = socket.gethostname().replace("~", "-").replace("/", "-")
    return f"{host}~{os.getpid()}~{secrets.token_hex(3)}"


def _side_dirs(parent: Path, kind: str) -> list[tuple[Path, str]]:
    """``(directory, target name)`` of the ``.<name>.<kind>-<tag>`` directories writers leave beside checkpoints
    (kind ``tmp``: a new checkpoint being written; ``old``: one moved aside while being replaced)."""
    found = []
    for side in parent.glob(f".*.{kind}-*"):
        name, _, tag = side.name[1:].rpartition(f".{kind}-")
        ours = tag.count("~") == 2 or (kind == "tmp" and tag.isdigit() and name.startswith(PREFIX))  # 0.1: PID
        if name and ours and side.is_dir():
            found.append((side, name))
    return found


def _writer_gone(name: str) -> bool:
    """Whether the process that made the side directory ``name`` (``.X.tmp-<tag>`` / ``.X.old-<tag>``) has ended.

    Only a writer on this host can be checked; another host's (a shared file system) counts as alive.
    """
    marker = ".tmp-" if ".tmp-" in name else ".old-"
    tag = name.rpartition(marker)[2]
    if tag.isdigit():  # herdrl 0.1's ".tmp-PID"
        tag = f"{_writer_tag().split('~')[0]}~{tag}~"
    try:
        host, pid, _ = tag.split("~")
        pid_number = int(pid)
    except ValueError:
        return False  # not a name herdrl writes: leave it alone
    if host != _writer_tag().split("~")[0]:
        return False
    if pid_number == os.getpid():
        return False  # another save of this process (a thread) may be in flight
    from herdrl.cluster.nodes import process_alive

    return not process_alive(pid_number)


def recover(parent: Path) -> None:
    """Repair what crashed writers left in ``parent``: a checkpoint moved aside (``.NAME.old-*``) whose
    replacement never arrived goes back to NAME; leftover temporary and moved-aside directories of writers
    that are gone are removed. In-flight directories of live writers are left alone."""
    for old, name in _side_dirs(parent, "old"):
        if not _writer_gone(old.name):
            continue
        if not (parent / name).exists():
            try:
                os.rename(old, parent / name)
                continue
            except OSError:
                pass
        shutil.rmtree(old, ignore_errors=True)
    for tmp, _ in _side_dirs(parent, "tmp"):
        if _writer_gone(tmp.name):
            shutil.rmtree(tmp, ignore_errors=True)


def _write_synced(path: Path, write: Any, mode: str = "wb") -> None:
    with open(path, mode) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def write_checkpoint(path: Path, meta: dict[str, Any], tensors: dict[str, Any],
                     arrays: dict[str, dict[str, np.ndarray]] | None = None) -> Path:
    """Write a checkpoint directory at ``path`` atomically (replacing one that is there).

    ``arrays``: extra plain-array files, ``{"replay_buffer": {name: array}}`` -> ``replay_buffer.npz``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover(path.parent)
    tag = _writer_tag()
    tmp = path.parent / f".{path.name}.tmp-{tag}"
    tmp.mkdir()
    old = None
    try:
        _write_synced(tmp / TENSOR_FILE, lambda f: torch.save(tensors, f))
        for name, data in (arrays or {}).items():
            _write_synced(tmp / f"{name}.npz", lambda f, data=data: np.savez(f, **data))
        _write_synced(tmp / META_FILE, lambda f: json.dump({"format_version": FORMAT_VERSION, **meta}, f, indent=1),
                      "w")
        _fsync_dir(tmp)
        if path.exists():
            old = path.parent / f".{path.name}.old-{tag}"
            os.rename(path, old)
        os.rename(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not path.exists():
            os.rename(old, path)  # the replacement failed: the old checkpoint stays where it was
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


#: Largest checkpoint.json read (a crafted file cannot make a loader read without end).
MAX_META_BYTES = 16 * 1024 * 1024


def _open_regular(file: Path, max_bytes: int | None = None) -> Any:
    """``file`` opened for reading: a regular file only (not a FIFO, which would block, nor a device), never
    through a symbolic link, and at most ``max_bytes`` long. CheckpointError otherwise."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CheckpointError(f"'{file}' cannot be read as a checkpoint file ({exc.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (max_bytes is not None and info.st_size > max_bytes):
        os.close(fd)
        raise CheckpointError(f"'{file}' is not a plain checkpoint file (a link, a device or too large); refusing it")
    return os.fdopen(fd, "rb")


def read_arrays(path: Path, name: str) -> dict[str, np.ndarray] | None:
    """The plain arrays of ``<checkpoint>/<name>.npz`` (None if the checkpoint has none), never unpickled."""
    file = Path(path) / f"{name}.npz"
    if not file.exists():
        return None
    try:
        with _open_regular(file) as f, np.load(f, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except CheckpointError:
        raise
    except Exception as exc:  # ValueError (object arrays refused), BadZipFile, OSError
        raise CheckpointError(f"checkpoint '{path}': {file.name} is damaged or not plain arrays, refusing to load "
                              f"it ({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})"
                              ) from None


def env_to_make(meta: dict[str, Any], given: str | None = None) -> str | None:
    """The env a loader of this checkpoint makes: ``given`` (the user's own choice) if any, else the one the
    checkpoint names, provided every module it needs was imported by the user (``--import``): a file never
    decides what is imported, so a missing one is an error naming the flag to add."""
    from herdrl.env.imports import TEAM_PREFIX, check_env_importable

    stored = meta["config"].get("env")
    if given is not None and isinstance(stored, str) and stored.startswith(TEAM_PREFIX):
        given = TEAM_PREFIX + given.removeprefix(TEAM_PREFIX)  # a team's checkpoint (QMIX) plays as a team
    if given is not None and (given != stored or ":" in given.removeprefix(TEAM_PREFIX)):
        return given
    check_env_importable(stored, meta, f"checkpoint '{meta.get('path')}'")
    return stored


#: Algorithms whose critics take a Box action as input (model ``critic_unit_actions``); their actors squash Box
#: actions with tanh into the bounds.
BOX_CRITICS = ("SAC", "TD3", "DDPG", "CQL", "IQL")


def checkpoint_config(meta: dict[str, Any], env: str | None = None, makes_env: bool = True) -> dict[str, Any]:
    """The config a checkpoint was trained with, ready for ``from_dict``: site keys (:data:`SITE_KEYS`) dropped
    (a warning names any a file set), older formats migrated to today's meaning of each key.

    ``env``: the env the caller gives (it replaces the checkpoint's); ``makes_env=False`` for loaders that build
    no env (``Policy``), which may keep a ``module:EnvId`` the checkpoint names (see :func:`env_to_make`).
    """
    config = dict(meta["config"])
    stored = config.get("env")
    if stored is not None and not (isinstance(stored, str) and stored.isprintable()):
        raise CheckpointError(f"checkpoint '{meta.get('path')}' is damaged: its env is not a printable name")
    config["env"] = env_to_make(meta, env) if makes_env else (env or stored)
    for key in SITE_KEYS:
        value = config.pop(key, None)
        if value not in (None, False, {}, ""):
            logger.warning("herdrl: checkpoint '%s' sets %s=%r; ignored: where a run executes and which cluster "
                           "it joins come from your command, never from a file", meta.get("path"), key, value)
    evaluation = config.get("evaluation_config")
    if isinstance(evaluation, dict) and "env" in evaluation and not (
            isinstance(evaluation["env"], str) and ":" not in evaluation["env"] and evaluation["env"].isprintable()):
        logger.warning("herdrl: checkpoint '%s' sets evaluation_config env=%r; ignored: which modules are imported "
                       "comes from your command, never from a file", meta.get("path"), evaluation["env"])
        config["evaluation_config"] = {k: v for k, v in evaluation.items() if k != "env"}
    for key in CODE_KEYS:
        value = config.pop(key, None)
        if value not in (None, {}, [], ""):
            logger.warning("herdrl: checkpoint '%s' sets %s=%r; ignored: code to run (callbacks) comes from your "
                           "command, never from a file", meta.get("path"), key, value)
    from herdrl.registry import get_config_class

    version = meta.get("format_version", 1)
    model = config.get("model", {})
    if version < 3 and isinstance(model, dict) and "conv_filters" not in model:
        # Before encoders (format 3), every observation was flattened and cast as it was: keep that network. (A
        # config that names conv_filters was written by the encoder code already, still stamped format 2.)
        config["model"] = {**model, "obs_encoding": "flat"}
    if (meta.get("algorithm") in BOX_CRITICS and isinstance(config.get("model"), dict)
            and "critic_unit_actions" not in config["model"]):
        # Before the key, these critics saw actions in the env's units: keep them so.
        config["model"] = {**config["model"], "critic_unit_actions": False}
    return get_config_class(meta["algorithm"]).migrate_checkpoint_config(config, version, meta["spaces"])


def critic_units_clash(meta: dict[str, Any], algo_name: str, model: dict[str, Any], action_space: gym.Space
                       ) -> str | None:
    """Why the critics of checkpoint ``meta`` would misread the actions of a run of ``algo_name`` with ``model`` on
    ``action_space`` (a mapping: each policy's): they saw actions in other units (``critic_unit_actions``, absent
    from checkpoints written before the key: the env's units). None when they read them alike (or the bounds are
    [-1, 1] already)."""
    if meta.get("algorithm") not in BOX_CRITICS or algo_name not in BOX_CRITICS:
        return None
    spaces = action_space.values() if isinstance(action_space, Mapping) else [action_space]  # (per policy)
    if not any(isinstance(space, gym.spaces.Box) and not ((space.low == -1).all() and (space.high == 1).all())
               for space in spaces):
        return None
    theirs = meta["config"].get("model") if isinstance(meta.get("config"), dict) else None
    theirs = isinstance(theirs, dict) and bool(theirs.get("critic_unit_actions"))
    ours = bool(model.get("critic_unit_actions"))
    if theirs == ours:
        return None
    units = {True: "in [-1, 1]", False: "in the env's units"}
    return (f"its critics saw actions {units[theirs]}, this run's see them {units[ours]}: set model "
            f"critic_unit_actions={theirs}")


def read_meta(path: Path) -> dict[str, Any]:
    """The JSON part of a checkpoint, checked for presence and format version."""
    path = Path(path)
    if not path.exists() and path.parent.is_dir():
        recover(path.parent)  # a writer may have crashed while replacing this very checkpoint
        moved = [old for old, name in _side_dirs(path.parent, "old")
                 if name == path.name and (old / META_FILE).exists()]
        if not path.exists() and moved:  # its writer runs elsewhere (or is still replacing it): read it where it is
            path = moved[0]
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' not found")
    path = _in_tune_layout(path) if path.is_dir() else path
    if path.is_dir() and not (path / META_FILE).exists():
        newest = newest_valid_checkpoint(path)
        if newest is None:
            trials = sorted(p for p in path.iterdir() if (p / "params.json").exists()) if path.is_dir() else []
            if trials:
                raise CheckpointError(f"'{path}' is an experiment folder with {len(trials)} trial(s): give one of "
                                      f"them, e.g. {trials[-1]}")
            raise CheckpointError(f"'{path}' is not a checkpoint and holds no valid checkpoint_* directory")
        path = newest
    try:
        with _open_regular(path / META_FILE, MAX_META_BYTES) as f:
            meta = json.loads(f.read())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint '{path}' is damaged: {META_FILE} unreadable ({exc})") from None
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if not isinstance(version, int):
        raise CheckpointError(f"checkpoint '{path}' is damaged: {META_FILE} has no format_version")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint '{path}' has format version {version}; this herdrl reads up to "
                              f"{FORMAT_VERSION}: upgrade herdrl")
    meta["path"] = str(path)
    return meta


def _torch_loads_safely() -> bool:
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 6)


def read_tensors(path: Path) -> dict[str, Any]:
    """The tensor part of a checkpoint, loaded with ``weights_only=True`` (no code from disk runs)."""
    if not _torch_loads_safely():
        raise CheckpointError(f"torch {torch.__version__} can be tricked into running code while loading weights "
                              "(CVE-2025-32434); herdrl loads checkpoints with torch >= 2.6: pip install -U torch")
    file = Path(path) / TENSOR_FILE
    try:
        with _open_regular(file) as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own advice on a refused file is not ours to print
            return torch.load(f, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint '{path}' is damaged: {TENSOR_FILE} is missing") from None
    except CheckpointError:
        raise
    except pickle.UnpicklingError:  # the weights-only loader met something other than tensors and numbers
        raise CheckpointError(f"checkpoint '{path}': {TENSOR_FILE} holds Python objects besides tensors (it was not "
                              "written by herdrl, or was tampered with); refusing to load it") from None
    except Exception:  # RuntimeError (truncated or corrupt zip), EOFError, ...
        raise CheckpointError(f"checkpoint '{path}' is damaged: {TENSOR_FILE} is truncated or corrupt (a write cut "
                              "short?); refusing to load it") from None


class CheckpointPath(type(Path())):
    """The folder ``Algorithm.save()`` wrote, a :class:`~pathlib.Path`, that also reads as what RLlib's ``save()``
    returns: ``.checkpoint.path`` (a str, as Ray's ``Checkpoint``), ``.metrics`` (the algorithm's last row)."""

    metrics: Any = None  # (set on the path save() returns; paths derived from it have none)

    @property
    def checkpoint(self) -> CheckpointPath:
        """Itself: RLlib's ``result.checkpoint``, whose ``.path`` is the folder."""
        return self

    @property
    def path(self) -> str:
        """The folder, as a str (Ray's ``Checkpoint.path``)."""
        return str(self)


def as_checkpoint_path(value: Any) -> Path:
    """A checkpoint's folder from a path (str, Path), or from what RLlib and Ray Tune hand scripts: a
    ``Checkpoint`` (its ``.path``) or a training result (its ``.checkpoint.path``)."""
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    value = getattr(value, "checkpoint", value)
    if isinstance(getattr(value, "path", None), (str, os.PathLike)):
        return Path(value.path)
    raise ConfigError(f"expected a checkpoint path (or an object with .path), got {type(value).__name__}")


def _in_tune_layout(path: Path) -> Path:
    """A Tune trial's checkpoint folder holds herdrl's checkpoint in ``herd/``: that one; other paths as given."""
    inner = path / TUNE_SUBDIR
    return inner if not (path / META_FILE).exists() and (inner / META_FILE).exists() else path


def list_checkpoints(trial_dir: Path) -> list[Path]:
    """``checkpoint_*`` directories in a trial, oldest first (after repairing a crashed replacement)."""
    if Path(trial_dir).is_dir():
        recover(Path(trial_dir))
    return sorted(p for p in Path(trial_dir).glob(f"{PREFIX}*") if p.is_dir() and not p.is_symlink())


def newest_valid_checkpoint(trial_dir: Path) -> Path | None:
    """The newest checkpoint in ``trial_dir`` whose files load; each damaged one skipped is named in a warning
    with the reason (a run resumed or evaluated from an older checkpoint than the user expects must say so)."""
    for path in map(_in_tune_layout, reversed(list_checkpoints(trial_dir))):
        try:
            read_meta(path)
            read_tensors(path)
            return path
        except CheckpointError as exc:
            logger.warning("herdrl: skipping %s, the newest checkpoint that loads comes before it: %s", path.name,
                           exc)
            continue
    return None


def prune(trial_dir: Path, keep: int, score_attr: str | None = "episode_return_mean") -> None:
    """Delete all but the ``keep`` newest checkpoints (``keep >= 1``: the newest is never deleted) and the best one
    by ``score_attr`` (checkpoints whose score is missing or not finite are never the best)."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ConfigError(f"keep_checkpoints_num got {keep!r}; expected an int >= 1 (the newest checkpoint is "
                          "always kept)")
    paths = list_checkpoints(trial_dir)
    keep_set = set(paths[-keep:])
    if score_attr:
        scored = []
        for p in paths:
            try:
                with _open_regular(_in_tune_layout(p) / META_FILE, MAX_META_BYTES) as f:
                    metrics = json.load(f).get("metrics", {})
                score = metrics.get(score_attr)
            except (OSError, ValueError, AttributeError, CheckpointError):  # unreadable or not a checkpoint's JSON
                continue
            if isinstance(score, (int, float)) and np.isfinite(score):
                scored.append((score, p))
        if scored:
            keep_set.add(max(scored)[1])
    for p in paths:
        if p not in keep_set:
            shutil.rmtree(p, ignore_errors=True)


# ------------------------------------------------------------------- spaces as JSON
#: Elements a stored Box may have (a crafted shape must not make the loader allocate gigabytes).
MAX_SPACE_ELEMENTS = 1 << 24


def _bound_json(values: np.ndarray) -> Any:
    flat = values.reshape(-1)
    return flat[0].item() if flat.size and (flat == flat[0]).all() else values.tolist()  # one number if uniform


def space_to_json(space: gym.Space) -> dict[str, Any]:
    """Describe an observation or action space in JSON (no pickling): Box, Discrete, MultiDiscrete, MultiBinary,
    and Dict/Tuple of them."""
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": _bound_json(space.low), "high": _bound_json(space.high)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist(),
                "start": np.asarray(space.start).tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": [[key, space_to_json(sub)] for key, sub in space.spaces.items()]}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_json(sub) for sub in space.spaces]}
    raise CheckpointError(f"cannot store space {space} in a checkpoint")


def space_from_json(data: dict[str, Any]) -> gym.Space:
    """Inverse of :func:`space_to_json`; a space larger than any herdrl takes is refused (a crafted file must not
    make the loader build a network of billions of inputs)."""
    space = _space_from_json(data, 0)
    if _space_size(space) > MAX_SPACE_ELEMENTS:
        raise CheckpointError(f"checkpoint space {str(space)[:120]} is larger than any observation or action "
                              "herdrl takes: the file is damaged")
    return space


def _space_from_json(data: dict[str, Any], depth: int) -> gym.Space:
    kind = data.get("type") if isinstance(data, dict) and depth < 32 else None
    try:
        if kind == "Discrete":
            return gym.spaces.Discrete(int(data["n"]), start=int(data.get("start", 0)))
        if kind == "Box":
            dtype = np.dtype(data["dtype"])
            if dtype.kind not in "biuf":
                raise ValueError(f"dtype {dtype}")
            shape = tuple(int(n) for n in data["shape"])
            if len(shape) > 8 or int(np.prod(shape, dtype=np.float64)) > MAX_SPACE_ELEMENTS:
                raise ValueError(f"shape {shape} is larger than any observation herdrl takes")
            low, high = (np.broadcast_to(np.array(data[k], dtype=dtype), shape) for k in ("low", "high"))
            return gym.spaces.Box(low.copy(), high.copy(), shape, dtype)
        if kind == "MultiDiscrete":
            return gym.spaces.MultiDiscrete(np.array(data["nvec"], np.int64), start=np.array(data["start"], np.int64))
        if kind == "MultiBinary":
            return gym.spaces.MultiBinary(data["n"])
        if kind == "Dict":
            return gym.spaces.Dict({str(key): _space_from_json(sub, depth + 1) for key, sub in data["spaces"]})
        if kind == "Tuple":
            return gym.spaces.Tuple([_space_from_json(sub, depth + 1) for sub in data["spaces"]])
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CheckpointError(f"damaged {kind} space description in checkpoint ({exc})") from None
    raise CheckpointError(f"unknown space description {str(data)[:200]} in checkpoint")


def _space_size(space: gym.Space) -> int:
    """Numbers a network's input takes for ``space`` (one-hot widths counted)."""
    if isinstance(space, gym.spaces.Dict):
        return sum(_space_size(sub) for sub in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return sum(_space_size(sub) for sub in space.spaces)
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec, dtype=np.float64))
    return int(np.prod(space.shape, dtype=np.float64))
