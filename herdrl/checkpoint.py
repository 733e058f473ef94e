"""Checkpoints: written atomically, read without running any code from disk.

A checkpoint is a directory::

    checkpoint_000040/
      checkpoint.json   format version, algorithm, config, counters, episode stats, spaces, numpy RNG state
      learner.pt        module and optimizer tensors, torch RNG state (torch.save of tensors/numbers only)

Writing goes to a hidden temporary sibling, every file is fsync'ed, then the directory is renamed into place
(and the parent fsync'ed): a crash or a full disk mid-write leaves the previous checkpoints untouched and at
worst a ``.checkpoint_*.tmp-*`` directory that readers ignore and the next save removes.

Reading never unpickles: JSON for everything but tensors, and ``torch.load(weights_only=True)``, whose
restricted loader accepts tensors, numbers, strings and containers and refuses any other object.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from herdrl.errors import HerdError

FORMAT_VERSION = 1
PREFIX = "checkpoint_"
META_FILE = "checkpoint.json"
TENSOR_FILE = "learner.pt"


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


def write_checkpoint(path: Path, meta: dict[str, Any], tensors: dict[str, Any]) -> Path:
    """Write a checkpoint directory at ``path`` atomically (replacing one that is there)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{PREFIX}*.tmp-*"):  # left by a crash mid-write
        shutil.rmtree(stale, ignore_errors=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        with open(tmp / TENSOR_FILE, "wb") as f:
            torch.save(tensors, f)
            f.flush()
            os.fsync(f.fileno())
        with open(tmp / META_FILE, "w") as f:
            json.dump({"format_version": FORMAT_VERSION, **meta}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            os.rename(path, old)
        os.rename(tmp, path)
        _fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def read_meta(path: Path) -> dict[str, Any]:
    """The JSON part of a checkpoint, checked for presence and format version."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' not found")
    if path.is_dir() and not (path / META_FILE).exists():
        newest = newest_valid_checkpoint(path)
        if newest is None:
            raise CheckpointError(f"'{path}' is not a checkpoint and holds no valid checkpoint_* directory")
        path = newest
    try:
        meta = json.loads((path / META_FILE).read_text())
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


def read_tensors(path: Path) -> dict[str, Any]:
    """The tensor part of a checkpoint, loaded with ``weights_only=True`` (no code from disk runs)."""
    file = Path(path) / TENSOR_FILE
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint '{path}' is damaged: {TENSOR_FILE} is missing") from None
    except Exception as exc:  # UnpicklingError (a pickle payload), RuntimeError (truncated zip), EOFError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint '{path}': {TENSOR_FILE} is not a valid weights file, refusing to load "
                              f"it ({type(exc).__name__}: {first[:160]})") from None


def list_checkpoints(trial_dir: Path) -> list[Path]:
    """``checkpoint_*`` directories in a trial, oldest first."""
    return sorted(p for p in Path(trial_dir).glob(f"{PREFIX}*") if p.is_dir())


def newest_valid_checkpoint(trial_dir: Path) -> Path | None:
    """The newest checkpoint in ``trial_dir`` whose files load; damaged ones are skipped."""
    for path in reversed(list_checkpoints(trial_dir)):
        try:
            read_meta(path)
            read_tensors(path)
            return path
        except CheckpointError:
            continue
    return None


def prune(trial_dir: Path, keep: int, score_attr: str | None = "episode_return_mean") -> None:
    """Delete all but the ``keep`` newest checkpoints and the best one by ``score_attr``."""
    paths = list_checkpoints(trial_dir)
    keep_set = set(paths[-keep:]) if keep > 0 else set()
    if score_attr:
        scored = []
        for p in paths:
            try:
                score = json.loads((p / META_FILE).read_text()).get("metrics", {}).get(score_attr)
            except (OSError, ValueError):
                continue
            if isinstance(score, (int, float)) and np.isfinite(score):
                scored.append((score, p))
        if scored:
            keep_set.add(max(scored)[1])
    for p in paths:
        if p not in keep_set:
            shutil.rmtree(p, ignore_errors=True)


# ------------------------------------------------------------------- spaces as JSON
def space_to_json(space: gym.Space) -> dict[str, Any]:
    """Describe a Box or Discrete space in JSON (no pickling)."""
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": space.low.tolist(), "high": space.high.tolist()}
    raise CheckpointError(f"cannot store space {space} in a checkpoint")


def space_from_json(data: dict[str, Any]) -> gym.Space:
    """Inverse of :func:`space_to_json`."""
    if data.get("type") == "Discrete":
        return gym.spaces.Discrete(data["n"], start=data.get("start", 0))
    if data.get("type") == "Box":
        dtype = np.dtype(data["dtype"])
        return gym.spaces.Box(np.array(data["low"], dtype=dtype), np.array(data["high"], dtype=dtype),
                              tuple(data["shape"]), dtype)
    raise CheckpointError(f"unknown space description {data!r} in checkpoint")
