"""RLlib's recorded episodes as a herdrl dataset: ``herd data from-rllib SRC --out DIR``.

RLlib (new API stack) records with ``.offline_data(output=DIR)``; by default (``output_write_episodes=True``) each
row of its Parquet files holds one episode: the episode's state packed with msgpack, its arrays encoded by
msgpack-numpy (dtype, shape and raw bytes), its spaces described by RLlib's space dicts. This reads that without
RLlib and without unpickling anything: arrays are rebuilt from their dtype, shape and bytes only, and an array that
would need pickle (an object array) is refused in one line, as is any space this reader does not know. The
episodes are then written as a dataset in Minari's format (:class:`~herdrl.offline.dataset.DatasetWriter`), which
every offline algorithm reads, in memory or streamed.

RLlib's other format (``output_write_episodes=False``: a row per step) carries no spaces and compresses
observations with pickle by default; it is refused: record episodes (RLlib's default) to move them here.
"""

from __future__ import annotations

import base64
import io
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.offline.dataset import DatasetError, DatasetWriter, Episode, stack_rows, write_metadata

#: The array kinds rebuilt from raw bytes (booleans, integers, floats): anything else would need pickle.
PLAIN_KINDS = "biuf"


def _dtype(name: Any, where: str) -> np.dtype:
    try:
        dtype = np.dtype(name.decode() if isinstance(name, bytes) else str(name))
    except TypeError:
        raise DatasetError(f"{where}: an array of dtype {name!r} (only booleans, integers and floats are read)") \
            from None
    if dtype.kind not in PLAIN_KINDS or dtype.hasobject:
        raise DatasetError(f"{where}: an array of dtype {dtype} (only booleans, integers and floats are read: "
                           "anything else would need unpickling)")
    return dtype


def _decoded(where: str) -> Any:
    """A msgpack ``object_hook`` rebuilding msgpack-numpy's arrays and scalars from dtype, shape and bytes."""

    def hook(item: dict) -> Any:
        if b"nd" not in item:
            if b"complex" in item:
                raise DatasetError(f"{where}: a complex number (not read)")
            return item
        dtype = _dtype(item[b"type"], where)
        if item[b"nd"]:
            if item.get(b"kind", b"") not in (b"", ""):
                raise DatasetError(f"{where}: an array of kind {item[b'kind']!r} (not read: it would need unpickling)")
            return np.frombuffer(item[b"data"], dtype).reshape(item[b"shape"]).copy()
        scalar = np.frombuffer(item[b"data"], dtype)
        if scalar.shape != (1,):
            raise DatasetError(f"{where}: a scalar of {len(item[b'data'])} bytes for dtype {dtype}")
        return scalar[0]

    return hook


def _array(text: str) -> np.ndarray:
    """An array RLlib's space dicts hold (``np.save`` bytes, zlib-compressed, base64): never unpickled."""
    return np.load(io.BytesIO(zlib.decompress(base64.b64decode(text))), allow_pickle=False)


def rllib_space(spec: Any, where: str) -> gym.Space:
    """A Gymnasium space from RLlib's description of it (``gym_space_to_dict``): Box, Discrete, MultiDiscrete,
    MultiBinary, and Dicts of them."""
    kind = spec.get("space") if isinstance(spec, dict) else None
    if kind == "box":
        return gym.spaces.Box(_array(spec["low"]), _array(spec["high"]), tuple(spec["shape"]),
                              _dtype(spec["dtype"], where))
    if kind == "discrete":
        return gym.spaces.Discrete(int(spec["n"]), start=int(spec.get("start", 0)))
    if kind == "multi-discrete":
        return gym.spaces.MultiDiscrete(_array(spec["nvec"]))
    if kind == "multi-binary":
        return gym.spaces.MultiBinary(spec["n"])
    if kind == "dict":
        return gym.spaces.Dict({key: rllib_space(sub, where) for key, sub in spec["spaces"].items()})
    raise DatasetError(f"{where}: an RLlib space {kind!r} this reader does not know (Box, Discrete, MultiDiscrete, "
                       "MultiBinary and Dicts of them are read)")


def _buffer(state: Any, name: str, where: str) -> list[Any]:
    """The items of one of an episode's buffers (observations, actions, rewards), its lookback left out."""
    if not isinstance(state, dict) or "data" not in state:
        raise DatasetError(f"{where}: no {name} in the episode (not an RLlib episode?)")
    data, lookback = state["data"], int(state.get("lookback", 0))
    if isinstance(data, (np.ndarray, dict)):  # a finalized buffer: one batched array (or a dict of them)
        data = _rows(data)
    return list(data)[lookback:]


def _rows(batched: Any) -> list[Any]:
    """A finalized buffer's batched array (or nested dict of them) as a list of per-step items."""
    if isinstance(batched, dict):
        parts = {key: _rows(value) for key, value in batched.items()}
        steps = len(next(iter(parts.values()))) if parts else 0
        return [{key: rows[i] for key, rows in parts.items()} for i in range(steps)]
    return list(batched)


def rllib_episode_files(path: str | Path) -> list[Path]:
    """The Parquet files of an RLlib recording, in a fixed order (RLlib writes ``<env>/run-<runner>-<call>/``)."""
    files = sorted(Path(path).rglob("*.parquet"))
    if not files:
        raise DatasetError(f"{path} holds no Parquet files: not an RLlib recording (.offline_data(output=...))")
    return files


def read_rllib_episodes(path: str | Path) -> Iterator[tuple[Episode, gym.Space, gym.Space]]:
    """Every episode of an RLlib recording with its observation and action spaces, file by file."""
    try:
        import msgpack
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError("reading RLlib's recordings needs msgpack and pyarrow: pip install 'herdrl[offline]'") \
            from None
    for file in rllib_episode_files(path):
        table = pq.read_table(file)
        if table.column_names != ["item"]:
            raise DatasetError(f"{file}: columns {table.column_names}, not RLlib's recorded episodes (one 'item' "
                               "column): record with output_write_episodes=True (RLlib's default)")
        for row, item in enumerate(table.column("item").to_pylist()):
            where = f"{file.name} row {row}"
            try:
                state = msgpack.unpackb(item, object_hook=_decoded(where), strict_map_key=False)
            except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
                raise DatasetError(f"{where}: not a msgpack-packed RLlib episode ({exc})") from None
            yield _episode(state, where)


def _episode(state: Any, where: str) -> tuple[Episode, gym.Space, gym.Space]:
    if not isinstance(state, dict) or "_observation_space" not in state:
        raise DatasetError(f"{where}: not an RLlib single-agent episode (multi-agent episodes are not read)")
    if int(state.get("t_started", 0)):
        raise DatasetError(f"{where}: an episode chunk starting at step {state['t_started']}, not a whole "
                           "episode: record with batch_mode='complete_episodes'")
    obs_space = rllib_space(state["_observation_space"], where)
    action_space = rllib_space(state["_action_space"], where)
    observations = _buffer(state.get("observations"), "observations", where)
    actions = _buffer(state.get("actions"), "actions", where)
    rewards = np.asarray(_buffer(state.get("rewards"), "rewards", where), np.float64)
    steps = len(rewards)
    if not steps:
        raise DatasetError(f"{where}: an episode of no steps")
    if len(observations) != steps + 1 or len(actions) != steps:
        raise DatasetError(f"{where}: {len(observations)} observations, {len(actions)} actions and {steps} rewards "
                           "(an episode has one observation more than steps)")
    terminations, truncations = np.zeros(steps, bool), np.zeros(steps, bool)
    terminations[-1], truncations[-1] = bool(state.get("is_terminated")), bool(state.get("is_truncated"))
    episode = Episode(stack_rows(observations), stack_rows(actions), rewards, terminations, truncations)
    return episode, obs_space, action_space


def convert_rllib(source: str | Path, out: str | Path, data_format: str = "parquet") -> dict[str, Any]:
    """Write every episode of RLlib's recording ``source`` as a herdrl dataset at ``out`` (a new or empty folder);
    its metadata."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise DatasetError(f"{out} is not empty: convert into a new folder")
    writer = spaces = None
    for episode, obs_space, action_space in read_rllib_episodes(source):
        if writer is None:
            spaces = obs_space, action_space
            writer = DatasetWriter(out, obs_space, action_space, data_format)
        elif (obs_space, action_space) != spaces:
            raise DatasetError(f"{source}: episodes with different spaces ({spaces} then {(obs_space, action_space)})")
        writer.write(episode)
    if writer is None:
        raise DatasetError(f"{source} holds no episodes")
    return write_metadata(out, *spaces, data_format, algorithm_name="RLlib (herd data from-rllib)",
                          description=f"converted from RLlib's recording {Path(source).resolve()}")
