"""How an offline algorithm gets its batches: from memory, or streamed by Ray Data.

Both readers give ``draw(rows)``: a dict of numpy arrays (``obs``, ``next_obs`` nested as the observation space's
stored form, ``actions`` in stored form, ``rewards``, ``discounts``, ``returns``; with ``tails``, ``tail_obs`` and
``tail_discounts``: :func:`herdrl.offline.dataset.to_transitions`).

- :class:`MemoryReader` loads every transition once and draws uniformly with replacement (small datasets: the
  default while they take less than ``offline_memory_limit_mb``; no Ray).
- :class:`RayDataReader` streams: a Ray Data pipeline whose tasks each read a few episode files (Parquet or Arrow,
  in a new random order every pass over the data), turn them into transitions and shuffle them; batches come
  from a local shuffle buffer over those blocks. Memory stays bounded by the pipeline's blocks in flight and the
  shuffle buffer, whatever the dataset's size; a dataset is passed over epoch after epoch.

With learner actors (``num_learners >= 1``) a streamed dataset never passes through the driver: each learner rank
opens its own :class:`RayDataReader` on its own share of the episode files (:class:`StreamSpec`, rank ``r`` of
``N`` reads files ``r, r+N, ...``), and each update call carries only :class:`StreamRows` — how many rows each
rank reads for how many gradient steps. Each rank reads a share of every batch in proportion to the transitions
its files hold, and the gradients are summed weighted by those shares, so a gradient step is the step on the
union of the ranks' rows. As with :class:`~herdrl.rollout.transport.FragmentInput`, the data is read where the
learner runs; here Ray Data fetches the blocks instead of the learner fetching runners' fragments.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.obs import ObsSpec, obs_map
from herdrl.offline.dataset import DatasetError, Episode, OfflineDataset, episode_steps, to_transitions
from herdrl.rollout.transport import LearnerInput

#: Episodes each Ray Data task reads into one block of transitions (shuffled inside the block).
EPISODES_PER_BLOCK = 8


def episode_transitions(episodes: list[Episode], observation_space: gym.Space, action_space: gym.Space,
                        gamma: float, tails: bool = False) -> dict[str, Any]:
    """The episodes' transitions with actions in stored form (what learners read)."""
    from herdrl.models.distributions import ActionDistribution

    transitions = to_transitions(episodes, observation_space, action_space, gamma, tails)
    transitions["actions"] = ActionDistribution(action_space).from_env(transitions["actions"])
    return transitions


def fit_observation_filter(normalizer: Any, episodes: Iterable[Episode], observation_space: gym.Space) -> int:
    """The observation filter's statistics (``observation_filter="MeanStdFilter"``) of every observation the
    ``episodes`` hold, final ones included (an episode at a time: pass ``dataset.episodes()`` to stream a dataset
    once, or the episodes already read), unless the statistics already count some (a checkpoint's, or another
    run's by ``init_from``). Returns the observations counted."""
    if not normalizer.observations or any(normalizer.stats[key].count for key in normalizer.stats if
                                          key.startswith("obs")):
        return 0
    spec, counted = ObsSpec(observation_space), 0
    for episode in episodes:
        normalizer.observe(spec.batch(episode.observations))
        counted += len(episode) + 1
    return counted


#: The batch keys holding observations (what the observation filter normalises).
OBSERVATION_KEYS = ("obs", "next_obs", "tail_obs")


def normalized_rows(batch: dict[str, Any], normalizer: Any) -> dict[str, Any]:
    """``batch`` with its observations normalised by ``normalizer`` (a :class:`herdrl.filters.Normalizer`; None:
    as it is)."""
    if normalizer is None or not normalizer.observations:
        return batch
    return {key: normalizer.normalize(value) if key in OBSERVATION_KEYS else value for key, value in batch.items()}


def stored_row_bytes(observation_space: gym.Space, action_space: gym.Space, tails: bool = False) -> int:
    """Bytes one transition takes in memory (two observations, the action, four float32 scalars; with ``tails``
    a third observation and a fifth scalar)."""
    from herdrl.models.action_layout import ActionLayout

    spec = ObsSpec(observation_space)
    obs = sum(int(np.prod(shape)) * np.dtype(spec.dtypes[name]).itemsize for name, shape in spec.shapes.items())
    layout = ActionLayout(action_space)
    return (3 if tails else 2) * obs + layout.action_width * layout.action_dtype.itemsize + (20 if tails else 16)


class MemoryReader:
    """Every transition of the dataset in memory; uniform draws with replacement."""

    def __init__(self, dataset: OfflineDataset, gamma: float, rng: np.random.Generator, tails: bool = False,
                 normalizer: Any = None, episodes: list[Episode] | None = None) -> None:
        """``normalizer``: observations are drawn normalised by it (its statistics as they are at each draw);
        ``episodes``: the dataset's, if already read."""
        episodes = list(dataset.episodes()) if episodes is None else episodes
        if not episodes:
            raise DatasetError(f"{dataset.path} holds no episodes")
        self.transitions = episode_transitions(episodes, dataset.observation_space, dataset.action_space, gamma,
                                               tails)
        self.size = len(self.transitions["rewards"])
        self.rng, self.normalizer = rng, normalizer
        self.episodes = len(episodes)
        self.return_mean = float(np.mean([e.total_return for e in episodes]))

    def draw(self, rows: int) -> dict[str, Any]:
        """``rows`` transitions drawn uniformly (with replacement)."""
        index = self.rng.integers(0, self.size, rows)
        return normalized_rows({key: obs_map(lambda array: array[index], value)
                                for key, value in self.transitions.items()}, self.normalizer)

    def stop(self) -> None:
        """Nothing to release."""


def _columns(transitions: dict[str, Any]) -> dict[str, np.ndarray]:
    """Nested observations as flat columns: ``obs`` for a one-leaf space, else ``obs/<leaf>`` (Ray Data's columns
    are flat)."""
    out = {}
    for key, value in transitions.items():
        if isinstance(value, dict):
            out.update({f"{key}/{leaf}": array for leaf, array in value.items()})
        else:
            out[key] = value
    return out


def _nested(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """Inverse of :func:`_columns`."""
    out: dict[str, Any] = {}
    for column, array in batch.items():
        key, _, leaf = column.partition("/")
        if leaf:
            out.setdefault(key, {})[leaf] = array
        else:
            out[key] = array
    return out


class _EpisodesToTransitions:
    """A Ray Data map function: a batch of episode file paths -> their transitions as columns, shuffled."""

    def __init__(self, path: str, gamma: float, seed: int, tails: bool = False) -> None:
        self.path, self.gamma, self.seed, self.tails = path, gamma, seed, tails

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from pathlib import Path

        dataset = OfflineDataset(self.path)
        episodes = [dataset.read_file(Path(str(p)), int(i)) for p, i in zip(batch["path"], batch["id"], strict=True)]
        transitions = episode_transitions(episodes, dataset.observation_space, dataset.action_space, self.gamma,
                                          self.tails)
        rng = np.random.default_rng([self.seed, *(int(i) for i in batch["id"])])
        order = rng.permutation(len(transitions["rewards"]))
        return _columns({key: obs_map(lambda array: array[order], value) for key, value in transitions.items()})


class RayDataReader:
    """Transitions streamed by Ray Data, epoch after epoch, each pass over the episode files (``files``: these
    ``(path, episode id)`` only; default all) in a new order. ``task_cpus``: the CPUs each Ray Data task asks for
    (None: Ray Data's default, one), ``concurrency``: at most this many tasks at once (None: Ray Data decides),
    ``node_id``: the node they run on where it can (None: anywhere); ``tails``: rows carry their episode's tail;
    ``normalizer``: observations come normalised by it."""

    def __init__(self, dataset: OfflineDataset, gamma: float, rng: np.random.Generator, batch_rows: int,
                 shuffle_buffer_rows: int, files: list[tuple[str, int]] | None = None,
                 task_cpus: float | None = None, concurrency: int | None = None, node_id: str | None = None,
                 tails: bool = False, normalizer: Any = None) -> None:
        require_episode_files(dataset)
        quiet_ray_data()
        self.dataset, self.gamma, self.rng, self.tails = dataset, gamma, rng, tails
        self.normalizer = normalizer
        self.batch_rows, self.shuffle_buffer_rows = batch_rows, shuffle_buffer_rows
        self.files = episode_files(dataset) if files is None else files
        self._task_cpus, self._concurrency, self._node_id = task_cpus, concurrency, node_id
        if not self.files:
            raise DatasetError(f"{dataset.path} holds no episodes")
        self.epochs = 0
        self._batches: Any = None
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0

    def _epoch(self) -> Any:
        """A new pass over the data: the files in a new random order, read, turned into transitions, shuffled
        (a generator: the pipeline starts on the first batch asked for)."""
        import ray

        order = self.rng.permutation(len(self.files))
        items = [{"path": self.files[i][0], "id": self.files[i][1]} for i in order]
        seed = int(self.rng.integers(2**31))
        pipeline = ray.data.from_items(items).map_batches(
            _EpisodesToTransitions(str(self.dataset.path), self.gamma, seed, self.tails), batch_size=EPISODES_PER_BLOCK,
            batch_format="numpy", **self._task_options())
        self.epochs += 1
        batches = pipeline.iter_batches(batch_size=self.batch_rows, batch_format="numpy", drop_last=False,
                                        local_shuffle_buffer_size=self.shuffle_buffer_rows, local_shuffle_seed=seed)
        yield from batches  # (a generator of our own: stop() closes it, which ends Ray Data's executor)

    def _task_options(self) -> dict[str, Any]:
        import ray

        options: dict[str, Any] = {}
        if self._task_cpus is not None:
            options["num_cpus"] = self._task_cpus
        if self._concurrency is not None:
            options["compute"] = ray.data.TaskPoolStrategy(size=self._concurrency)
        if self._node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self._node_id, soft=True)
        return options

    def draw(self, rows: int) -> dict[str, Any]:
        """The next ``rows`` transitions of the stream (the next epoch begun when one ends)."""
        while self._pending_rows < rows:
            if self._batches is None:
                self._batches = self._epoch()
            try:
                batch = next(self._batches)
            except StopIteration:
                self._batches = None
                continue
            except Exception as exc:  # a Ray task's error: the dataset's own one line, if that is what it was
                cause = exc
                while cause is not None and not isinstance(cause, DatasetError):
                    cause = getattr(cause, "cause", None) or cause.__cause__
                if cause is None:
                    raise
                raise DatasetError(str(cause).strip().splitlines()[-1]) from None
            self._pending.append(batch)
            self._pending_rows += len(batch["rewards"])
        joined = {key: np.concatenate([b[key] for b in self._pending]) for key in self._pending[0]}
        taken = {key: array[:rows] for key, array in joined.items()}
        rest = {key: array[rows:] for key, array in joined.items()}
        self._pending_rows -= rows
        self._pending = [rest] if self._pending_rows else []
        return normalized_rows(_nested(taken), self.normalizer)

    def stop(self) -> None:
        """End the stream: its executor shut down before Ray may be (closing the generator runs its cleanup)."""
        if self._batches is not None:
            self._batches.close()
            _join_ray_data_threads()
        self._batches = None


def require_episode_files(dataset: OfflineDataset) -> None:
    """Refuse (one line) a dataset Ray Data cannot stream: an HDF5 file."""
    if dataset.data_format == "hdf5":
        raise DatasetError(f"{dataset.path} is one HDF5 file: Ray Data streams Parquet or Arrow episode files "
                           "(set offline_read_method='memory', or re-record it with herd record)")


def episode_files(dataset: OfflineDataset) -> list[tuple[str, int]]:
    """The dataset's episode files and their episode ids, in id order."""
    return [(str(path), int(path.parent.name)) for path in dataset.episode_files()]


#: Ray Data tasks a learner rank's stream runs at once.
STREAM_TASKS = 2


@dataclass(frozen=True)
class StreamSpec:
    """What a learner rank needs to open its own stream of the dataset (sent once; again after a restart, with
    ``restarts`` counted so the restarted streams draw new orders)."""

    path: str
    gamma: float
    seed: int
    batch_rows: int
    shuffle_buffer_rows: int
    restarts: int = 0
    tails: bool = False
    #: The observation filter's statistics (a :class:`herdrl.filters.Normalizer` state; None: raw observations)
    #: and its clip.
    filter_state: dict[str, np.ndarray] | None = None
    clip_obs: float = 10.0

    def open(self, rank: int, world_size: int) -> tuple[RayDataReader, int]:
        """Rank ``rank``'s reader (files ``rank, rank + world_size, ...`` in id order, its own random stream, its
        share of the shuffle buffer; its Ray Data tasks on this node where they fit, asking for no CPU: the
        learner's reading, at most :data:`STREAM_TASKS` at once) and the transitions its files hold."""
        import ray

        dataset = OfflineDataset(self.path)
        require_episode_files(dataset)
        normalizer = None
        if self.filter_state is not None:
            from types import SimpleNamespace

            from herdrl.filters import Normalizer

            normalizer = Normalizer(dataset.observation_space, SimpleNamespace(
                observation_filter="MeanStdFilter", norm_reward=False, clip_obs=self.clip_obs, clip_reward=10.0))
            normalizer.load_state(self.filter_state)
        share = episode_files(dataset)[rank::world_size]
        steps = sum(episode_steps(Path(path)) for path, _ in share)
        reader = RayDataReader(dataset, self.gamma, np.random.default_rng([self.seed, rank, self.restarts]),
                               max(1, self.batch_rows // world_size),
                               max(1, self.shuffle_buffer_rows // world_size), files=share, task_cpus=0,
                               concurrency=STREAM_TASKS, node_id=ray.get_runtime_context().get_node_id(),
                               tails=self.tails, normalizer=normalizer)
        return reader, steps


@dataclass(frozen=True)
class StreamRows(LearnerInput):
    """An update's input when learner ranks stream their own shares: ``steps`` gradient steps, rank ``r`` reading
    ``rows[r]`` rows of each step from its own stream (:func:`share_rows`)."""

    rows: tuple[int, ...]
    steps: int

    def read(self, reader: Any) -> tuple[dict[str, Any], list[int], int]:
        """This rank's rows, drawn from its own stream (nothing can be lost: Ray Data retries its reads); the
        learner weighs its gradients by its share of each step's rows (``batch_share``)."""
        rows = self.rows[reader.rank]
        reader.learner.batch_share = rows / sum(self.rows)
        return reader.stream.draw(rows * self.steps), [], 0


def share_rows(batch_rows: int, transitions: list[int]) -> tuple[int, ...]:
    """``batch_rows`` split between ranks in proportion to the transitions their shares hold (largest remainders;
    at least one row each), so each transition is about as likely to be drawn as from one stream over them all."""
    total = sum(transitions)
    exact = [batch_rows * count / total for count in transitions]
    rows = [max(1, int(x)) for x in exact]
    by_remainder = sorted(range(len(rows)), key=lambda r: exact[r] - int(exact[r]), reverse=True)
    for r in by_remainder[:max(0, batch_rows - sum(rows))]:
        rows[r] += 1
    while sum(rows) > batch_rows:  # (the floors of one lifted above the share of a tiny one)
        rows[max(range(len(rows)), key=lambda r: rows[r])] -= 1
    return tuple(rows)


#: Ray Data's threads that still fetch blocks for a closed iterator for a moment (Ray must outlive them: its core
#: worker, shut down under them, ends the process).
_RAY_DATA_THREADS = ("iter_threaded", "StreamingExecutor")


def _join_ray_data_threads(timeout_s: float = 30.0) -> None:
    """Wait (up to ``timeout_s``) for the threads of a closed Ray Data iterator to end."""
    import threading
    import time

    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and thread.name.startswith(_RAY_DATA_THREADS):
            thread.join(max(0.0, deadline - time.monotonic()))


def quiet_ray_data() -> None:
    """Ray Data's progress bars and per-dataset log lines off (a run's console shows herdrl's own progress)."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # ("progress bars disabled": we know)
