"""Recording during training (``.offline_data(output=DIR)``): every episode the env runners play, as a dataset.

Each runner writes the episodes its envs finish into ``DIR`` itself (the arrays never travel to the driver for
this): raw observations as the env gave them (before any filter), the actions the env received, the rewards
before clipping or scaling, the env's own terminations and truncations (an Atari life loss is not an episode
end here). Episode ids are unique per runner while training (``(runner * 1000 + restart) * 10**6 + k``); when the
run stops, :func:`finish_recording` numbers them 0..N-1 (Minari's readers expect that) and writes the dataset's
metadata. A run killed before it stopped leaves its episodes complete but unnumbered: ``herd data finish DIR``
numbers them. Infos are not recorded during training (``herd record`` records them). One run records into a
folder at a time (runs one after another add to it).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.obs import ObsSpec, nest
from herdrl.offline.dataset import (
    DatasetError,
    DatasetWriter,
    Episode,
    space_from_minari,
    space_to_minari,
    stack_rows,
    write_metadata,
)

logger = logging.getLogger("herdrl")

#: Episode ids each (runner, restart) may use while recording.
ID_BLOCK = 10**6
#: The prefix of episode folders while :func:`finish_recording` numbers them.
RENAMED = "renumber-"
#: Written beside the episodes while recording: the spaces, so a folder left by a killed run can be finished.
SPACES_FILE = "recording.json"


class EpisodeRecorder:
    """One runner's recorder: assembles each env's episode across fragments and writes it when it ends."""

    def __init__(self, path: str | os.PathLike, observation_space: gym.Space, action_space: gym.Space,
                 num_envs: int, worker_index: int, incarnation: int) -> None:
        base = (worker_index * 1000 + incarnation) * ID_BLOCK
        data = Path(path) / "data"
        # After the ids this runner's block already holds: a resumed run's runners start again at incarnation 0
        # (and the in-process runner's block begins at 0, where a finished recording's episodes are numbered).
        taken = [int(p.name) for p in data.glob("*") if p.name.isdigit() and base <= int(p.name) < base + ID_BLOCK] \
            if data.exists() else []
        self.writer = DatasetWriter(path, observation_space, action_space, first_id=max(taken, default=base - 1) + 1)
        spaces = Path(path) / "data" / SPACES_FILE
        if not spaces.exists():
            spaces.write_text(json.dumps({"observation_space": space_to_minari(observation_space),
                                          "action_space": space_to_minari(action_space)}))
        self.observation_space, self.action_space = observation_space, action_space
        self.spec = ObsSpec(observation_space)
        self._open: list[dict[str, list] | None] = [None] * num_envs

    def restart(self) -> None:
        """The envs were reset (a reseed): the episodes they were in are dropped unfinished."""
        self._open = [None] * len(self._open)

    def add(self, obs: Any, env_actions: list[Any], rewards: np.ndarray, terminateds: np.ndarray,
            truncateds: np.ndarray, valid: np.ndarray) -> None:
        """One fragment: ``obs`` (T+1, B) in stored form, ``env_actions[t]`` the batch of env actions of step t,
        rewards, terminations, truncations and ``valid`` (T, B) as the runner recorded them."""
        steps, envs = rewards.shape
        for b in range(envs):
            for t in range(steps):
                if not valid[t, b]:  # a reset-only step: the next observation begins a new episode
                    self._open[b] = None
                    continue
                episode = self._open[b]
                if episode is None:
                    episode = self._open[b] = {"obs": [self._row(obs, t, b)], "actions": [], "rewards": [],
                                               "terminated": False, "truncated": False}
                episode["actions"].append(_row_of(env_actions[t], b))
                episode["rewards"].append(float(rewards[t, b]))
                episode["obs"].append(self._row(obs, t + 1, b))
                if terminateds[t, b] or truncateds[t, b]:
                    episode["terminated"], episode["truncated"] = bool(terminateds[t, b]), bool(truncateds[t, b])
                    self._write(episode)
                    self._open[b] = None

    def _row(self, obs: Any, t: int, b: int) -> Any:
        """Observation (t, b) nested as the env's space."""
        if self.spec.single:
            return obs[t, b].copy()
        return nest(self.observation_space, {name: leaf[t, b].copy() for name, leaf in obs.items()})

    def _write(self, episode: dict[str, Any]) -> None:
        steps = len(episode["rewards"])
        ends = np.arange(steps) == steps - 1
        self.writer.write(Episode(stack_rows(episode["obs"]), stack_rows(episode["actions"]),
                                  np.array(episode["rewards"]), ends & episode["terminated"],
                                  ends & episode["truncated"]))


def _row_of(batch: Any, b: int) -> Any:
    """Element ``b`` of a batch of env actions (tuples part by part)."""
    if isinstance(batch, tuple):
        return tuple(_row_of(part, b) for part in batch)
    return np.asarray(batch[b]).copy()


def finish_recording(path: str | os.PathLike, **metadata: Any) -> dict[str, Any]:
    """Number a recorded folder's complete episodes 0..N-1 (in runner, then recording order) and write its metadata.

    An episode folder without its file or its ``metadata.json`` (a runner killed while writing it) is removed;
    folders an interrupted earlier finish left renamed are picked up again.
    """
    import shutil

    data = Path(path) / "data"
    spaces_file = data / SPACES_FILE
    if not spaces_file.exists():
        raise DatasetError(f"{path}: not a folder recorded during training (no data/{SPACES_FILE})")
    spaces = json.loads(spaces_file.read_text())
    observation_space = space_from_minari(spaces["observation_space"], "observation_space")
    action_space = space_from_minari(spaces["action_space"], "action_space")
    folders = []
    for folder in data.iterdir():
        name = folder.name
        renamed = name.startswith(RENAMED)
        if not folder.is_dir() or not (name.isdigit() or renamed):
            continue
        if not ((folder / "metadata.json").exists() and any(folder.glob("part-0.*"))):
            logger.warning("herdrl: %s is an episode a run did not finish writing: removed", folder)
            shutil.rmtree(folder)
            continue
        # An interrupted earlier finish's folders come first, in the order it gave them; then runner order.
        folders.append(((0, int(name[len(RENAMED):])) if renamed else (1, int(name)), folder))
    folders.sort()
    staged = []
    for new, (_, folder) in enumerate(folders):  # two passes: no new name collides with an old one not yet moved
        target = data / f"{RENAMED}{new}"
        if folder != target:
            folder.rename(target)
        staged.append(target)
    for new, folder in enumerate(staged):
        meta_file = folder / "metadata.json"
        meta = json.loads(meta_file.read_text())
        meta_file.write_text(json.dumps({**meta, "id": new}))
        folder.rename(data / str(new))
    return write_metadata(path, observation_space, action_space, **metadata)
