"""Datasets of recorded episodes in the Minari format: written by ``herd record``, read by offline algorithms.

A dataset is a folder holding ``data/metadata.json`` (the spaces, counts, format) and one sub-folder per episode,
``data/<id>/part-0.parquet`` (or ``.arrow``) with its ``metadata.json``: Minari's own layout and columns, so
``minari.load_dataset`` reads what herdrl writes and herdrl reads what Minari writes (Parquet, Arrow IPC and HDF5).
herdrl writes Parquet by default: Minari's Arrow layout in the file format Ray Data reads natively.

An episode file has T+1 rows: the observations (the last row is the one its final step ended in) and the actions,
rewards, terminations and truncations of its T steps, padded with one row. Images are stored as raw pixels
(``jpeg_encoding`` off: Minari's default JPEG would change them); JPEG-encoded datasets written by Minari are read.

Reading never unpickles and never makes an env from the dataset's ``env_spec`` (a file must not decide what
runs): the env comes from the user's config. Every episode read is checked against the dataset's spaces; a bad
shape, a value outside a discrete space or a NaN is refused in one line naming the episode and the field.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.errors import HerdError

#: What herdrl writes (``parquet``: Ray Data reads it natively; ``arrow``: Minari's default); ``hdf5`` is read too.
WRITE_FORMATS = ("parquet", "arrow")
READ_FORMATS = (*WRITE_FORMATS, "hdf5")
#: The Minari release whose layout this follows (written into the metadata, as Minari does).
MINARI_VERSION = "0.5.4"
_EPISODE_FILE = {"parquet": "part-0.parquet", "arrow": "part-0.arrow"}
#: What decoding a file that does not hold what its metadata says can raise (a wrong column type, a bad image).
UNREADABLE = (ValueError, TypeError, KeyError, AttributeError, IndexError, OSError)


class DatasetError(HerdError):
    """A dataset cannot be read or written (missing, malformed, or not matching its spaces)."""


# ----------------------------------------------------------------------------------------------------- spaces
def space_to_minari(space: gym.Space) -> dict[str, Any]:
    """A space as Minari serialises it (JSON-ready): Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple."""
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "dtype": str(space.dtype), "shape": list(space.shape),
                "low": space.low.tolist(), "high": space.high.tolist()}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "dtype": "int64", "start": int(space.start), "n": int(space.n)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "dtype": str(space.dtype), "nvec": space.nvec.tolist(),
                "start": space.start.tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "subspaces": {key: space_to_minari(sub) for key, sub in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "subspaces": [space_to_minari(sub) for sub in space.spaces]}
    raise DatasetError(f"cannot record a {type(space).__name__} space: datasets hold Box, Discrete, MultiDiscrete, "
                       "MultiBinary, Dict and Tuple spaces")


def space_from_minari(spec: Any, where: str = "space") -> gym.Space:
    """Inverse of :func:`space_to_minari` (a dict, or its JSON text as Minari's metadata holds it)."""
    try:
        if isinstance(spec, str):
            spec = json.loads(spec)
        kind = spec["type"]
        if kind == "Box":
            dtype = np.dtype(spec["dtype"])
            if dtype.kind not in "fiub":
                raise ValueError(f"dtype {dtype}")
            shape = tuple(int(n) for n in spec["shape"])
            low = np.asarray(spec["low"], dtype=np.float64).reshape(shape)
            high = np.asarray(spec["high"], dtype=np.float64).reshape(shape)
            return gym.spaces.Box(low.astype(dtype), high.astype(dtype), shape, dtype)
        if kind == "Discrete":
            return gym.spaces.Discrete(int(spec["n"]), start=int(spec.get("start", 0)))
        if kind == "MultiDiscrete":
            return gym.spaces.MultiDiscrete(np.asarray(spec["nvec"], np.int64), np.dtype(spec.get("dtype", "int64")),
                                            start=np.asarray(spec.get("start", 0), np.int64))
        if kind == "MultiBinary":
            return gym.spaces.MultiBinary(spec["n"])
        if kind == "Dict":
            return gym.spaces.Dict({key: space_from_minari(sub, f"{where}.{key}")
                                    for key, sub in spec["subspaces"].items()})
        if kind == "Tuple":
            return gym.spaces.Tuple([space_from_minari(sub, f"{where}[{i}]")
                                     for i, sub in enumerate(spec["subspaces"])])
    except DatasetError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DatasetError(f"the dataset's {where} is malformed ({type(exc).__name__}: {exc})") from exc
    raise DatasetError(f"the dataset's {where} has type {kind!r}, which herdrl cannot read (Box, Discrete, "
                       "MultiDiscrete, MultiBinary, Dict, Tuple)")


def is_image_space(space: gym.Space) -> bool:
    """Minari's rule for spaces it JPEG-encodes: uint8 Box of 2 or 3 dims, at least 32x32, pixels 0..255."""
    return (isinstance(space, gym.spaces.Box) and len(space.shape) in (2, 3) and space.shape[0] >= 32
            and space.shape[1] >= 32 and space.dtype == np.uint8 and bool(np.all(space.low == 0))
            and bool(np.all(space.high == 255)))


# ---------------------------------------------------------------------------------------------------- episodes
@dataclass
class Episode:
    """One recorded episode, nested as its spaces are (a dict of arrays for a Dict space, a tuple for Tuple).

    ``observations`` has ``T + 1`` rows (from the reset to the observation its last step ended in), ``actions``,
    ``rewards``, ``terminations`` and ``truncations`` have ``T``; ``infos`` maps keys to arrays of ``T + 1`` rows
    (the reset's info, then each step's) when the recorder kept them.
    """

    observations: Any
    actions: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    infos: dict[str, Any] = field(default_factory=dict)
    id: int | None = None
    seed: int | None = None

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def total_return(self) -> float:
        """The sum of its rewards."""
        return float(np.sum(self.rewards))


def stack_rows(rows: list[Any]) -> Any:
    """Per-step observations or actions (arrays, or dicts/tuples of them) stacked along a new first axis."""
    first = rows[0]
    if isinstance(first, dict):
        return {key: stack_rows([row[key] for row in rows]) for key in first}
    if isinstance(first, tuple):
        return tuple(stack_rows([row[i] for row in rows]) for i in range(len(first)))
    return np.stack([np.asarray(row) for row in rows])


def _leaves(space: gym.Space, value: Any, name: str) -> Iterator[tuple[str, gym.Space, Any]]:
    """(name, leaf space, values) for each leaf of a nested space's values."""
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(value, dict) or set(value) != set(space.spaces):
            raise DatasetError(f"{name}: expected a dict with keys {sorted(space.spaces)}, got "
                               f"{sorted(value) if isinstance(value, dict) else type(value).__name__}")
        for key, sub in space.spaces.items():
            yield from _leaves(sub, value[key], f"{name}.{key}")
    elif isinstance(space, gym.spaces.Tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(space.spaces):
            raise DatasetError(f"{name}: expected a tuple of {len(space.spaces)}")
        for i, sub in enumerate(space.spaces):
            yield from _leaves(sub, value[i], f"{name}[{i}]")
    else:
        yield name, space, value


def _whole_number_bounds(space: gym.Space) -> tuple[Any, Any] | None:
    """The lowest and highest value of a space of whole numbers (per element where they vary); None for others."""
    if isinstance(space, gym.spaces.Discrete):
        return space.start, space.start + space.n - 1
    if isinstance(space, gym.spaces.MultiDiscrete):
        return space.start, space.start + space.nvec - 1
    if isinstance(space, gym.spaces.MultiBinary):
        return 0, 1
    if isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.integer):
        return space.low, space.high
    return None


def check_leaf(space: gym.Space, values: Any, rows: int, name: str) -> np.ndarray:
    """``values`` as an array of ``rows`` elements of ``space`` (its dtype), or a one-line DatasetError saying
    what is wrong: the shape, a NaN or infinity, a fraction or a value outside a space of whole numbers
    (Discrete, MultiDiscrete, MultiBinary, an integer Box)."""
    array = np.asarray(values)
    shape = space.shape if space.shape is not None else ()
    if array.shape != (rows, *shape):
        raise DatasetError(f"{name} has shape {array.shape}; its space {space} needs {(rows, *shape)}")
    if array.dtype.kind not in "fiub":
        raise DatasetError(f"{name} holds {array.dtype} values, not numbers")
    if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
        bad = int(np.argwhere(~np.isfinite(array.reshape(rows, -1)))[0][0])
        raise DatasetError(f"{name} holds a NaN or infinity (row {bad})")
    bounds = _whole_number_bounds(space)
    if bounds is not None:
        # cast to the space's dtype below: a fraction or an out-of-range value would wrap or index outside it
        low, high = bounds
        if array.dtype.kind == "f" and np.any(array != np.round(array)):
            raise DatasetError(f"{name} holds fractions where its space {space} takes whole numbers")
        if array.size and (np.any(array < low) or np.any(array > high)):
            raise DatasetError(f"{name} holds values outside its space {space}")
    return array.astype(space.dtype, copy=False) if space.dtype is not None else array


def check_episode(episode: Episode, observation_space: gym.Space, action_space: gym.Space,
                  name: str = "episode") -> Episode:
    """The episode with every field checked against the spaces (and cast to their dtypes); DatasetError if not."""
    steps = len(np.asarray(episode.rewards).reshape(-1))
    if steps < 1:
        raise DatasetError(f"{name} has no steps")

    def rebuild(space: gym.Space, value: Any, rows: int, label: str) -> Any:
        if isinstance(space, gym.spaces.Dict):
            list(_leaves(space, value, label))  # checks the keys
            return {key: rebuild(sub, value[key], rows, f"{label}.{key}") for key, sub in space.spaces.items()}
        if isinstance(space, gym.spaces.Tuple):
            list(_leaves(space, value, label))
            return tuple(rebuild(sub, value[i], rows, f"{label}[{i}]") for i, sub in enumerate(space.spaces))
        return check_leaf(space, value, rows, label)

    observations = rebuild(observation_space, episode.observations, steps + 1, f"{name} observations")
    actions = rebuild(action_space, episode.actions, steps, f"{name} actions")
    for label, leaf_space, values in _leaves(action_space, actions, f"{name} actions"):
        if isinstance(leaf_space, gym.spaces.Box) and values.size:
            slack = 1e-5 * (1 + np.abs(leaf_space.high - leaf_space.low))  # float rounding, not a wrong action
            if np.any(values < leaf_space.low - slack) or np.any(values > leaf_space.high + slack):
                raise DatasetError(f"{label} holds values outside its bounds {leaf_space}")
    rewards = np.asarray(episode.rewards, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(rewards)):
        bad = int(np.argwhere(~np.isfinite(rewards))[0][0])
        raise DatasetError(f"{name} rewards hold a NaN or infinity (row {bad})")
    flags = {}
    for key in ("terminations", "truncations"):
        flag = np.asarray(getattr(episode, key))
        if flag.shape != (steps,):
            raise DatasetError(f"{name} {key} has shape {flag.shape}; expected ({steps},) like its rewards")
        flags[key] = flag.astype(bool)
    if np.any(flags["terminations"][:-1] | flags["truncations"][:-1]):
        raise DatasetError(f"{name} ends before its last step (a termination or truncation inside it)")
    _check_infos(episode.infos, steps + 1, f"{name} infos")
    return Episode(observations, actions, rewards, flags["terminations"], flags["truncations"], episode.infos,
                   episode.id, episode.seed)


def _check_infos(infos: dict[str, Any], rows: int, name: str) -> None:
    """Every info entry is a nested dict or an array of ``rows`` rows (the reset's info, then each step's)."""
    for key, value in infos.items():
        if isinstance(value, dict):
            _check_infos(value, rows, f"{name}.{key}")
        elif len(np.asarray(value)) != rows:
            raise DatasetError(f"{name}.{key} has {len(np.asarray(value))} rows; expected {rows} (the reset's info "
                               "and one per step)")


# --------------------------------------------------------------------------------------------- arrow columns
def _encode(space: gym.Space, values: Any, pad: int) -> Any:
    """One column (Minari's encoding): fixed-size lists for Box/MultiDiscrete/MultiBinary, int64 for Discrete,
    structs for Dict and Tuple (fields "0", "1", ...); ``pad`` zero rows appended."""
    import pyarrow as pa

    if isinstance(space, gym.spaces.Dict):
        return pa.StructArray.from_arrays([_encode(sub, values[key], pad) for key, sub in space.spaces.items()],
                                          names=list(space.spaces))
    if isinstance(space, gym.spaces.Tuple):
        return pa.StructArray.from_arrays([_encode(sub, values[i], pad) for i, sub in enumerate(space.spaces)],
                                          names=[str(i) for i in range(len(space.spaces))])
    array = np.asarray(values)
    if isinstance(space, gym.spaces.Discrete):
        return pa.array(np.pad(array.reshape(-1), (0, pad)).astype(np.int64))
    flat = np.pad(array.reshape(len(array), -1), ((0, pad), (0, 0)))
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])


def _jpeg_frames(blobs: Iterable[bytes], shape: tuple[int, ...]) -> np.ndarray:
    """Minari's JPEG-encoded frames of ``shape`` (height, width[, channels]) as uint8 arrays. JPEG only, so a crafted
    cell cannot pick another of Pillow's decoders (some call external programs); each frame's size is read from its
    header and checked before it is decoded, so a small crafted cell cannot make a huge image."""
    from PIL import Image

    frames = []
    try:
        for blob in blobs:
            image = Image.open(io.BytesIO(blob), formats=["JPEG"])  # (reads the header only)
            if (image.height, image.width) != tuple(shape[:2]):
                raise DatasetError(f"an image of a JPEG-encoded dataset is {image.height}x{image.width}; its space "
                                   f"needs {shape[0]}x{shape[1]}")
            frames.append(np.asarray(image))
    except (OSError, Image.DecompressionBombError) as exc:  # (PIL's UnidentifiedImageError is an OSError)
        raise DatasetError(f"an image of a JPEG-encoded dataset is not a readable JPEG ({exc})") from exc
    return np.stack(frames).astype(np.uint8, copy=False)


def _decode(space: gym.Space, column: Any, jpeg: bool) -> Any:
    """Inverse of :func:`_encode` (and of Minari's JPEG images when ``jpeg``)."""
    if isinstance(space, gym.spaces.Dict):
        return {key: _decode(sub, column.field(key), jpeg) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_decode(sub, column.field(str(i)), jpeg) for i, sub in enumerate(space.spaces))
    if jpeg and is_image_space(space):
        return _jpeg_frames((item.as_py() for item in column), space.shape)
    if isinstance(space, gym.spaces.Discrete):
        return np.array(column.to_numpy(zero_copy_only=False))  # (a copy: Arrow's own memory is read-only)
    flat = np.array(column.flatten().to_numpy(zero_copy_only=False))
    return flat.reshape(len(column), *space.shape)


def _encode_infos(infos: dict[str, Any]) -> Any:
    """Infos as Minari stores them: a struct of columns, arrays of rows as fixed-size lists with the row shape in
    the field's metadata, nested dicts as structs."""
    import pyarrow as pa

    arrays, fields = [], []
    for key, value in infos.items():
        if isinstance(value, dict):
            array = _encode_infos(value)
            fields.append(pa.field(str(key), array.type))
        else:
            value = np.asarray(value)
            if value.ndim == 1:  # scalars: a plain column (Minari's reader cannot parse an empty shape)
                arrays.append(pa.array(value))
                fields.append(pa.field(str(key), arrays[-1].type))
                continue
            flat = value.reshape(len(value), -1)
            array = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])
            fields.append(pa.field(str(key), array.type, metadata={"shape": ",".join(map(str, value.shape[1:]))}))
        arrays.append(array)
    return pa.StructArray.from_arrays(arrays, fields=fields)


def _decode_infos(column: Any) -> dict[str, Any]:
    """Inverse of :func:`_encode_infos` (plain columns are read as they are)."""
    import pyarrow as pa

    out: dict[str, Any] = {}
    for i, f in enumerate(column.type):
        child = column.field(i)
        if pa.types.is_struct(f.type):
            out[f.name] = _decode_infos(child)
        elif pa.types.is_fixed_size_list(f.type):
            shape_text = (f.metadata or {}).get(b"shape", b"")
            shape = tuple(int(n) for n in shape_text.split(b",") if n)
            out[f.name] = child.flatten().to_numpy(zero_copy_only=False).reshape(len(child), *shape)
        else:
            out[f.name] = np.asarray(child.to_numpy(zero_copy_only=False))
    return out


# ------------------------------------------------------------------------------------------------------ write
class DatasetWriter:
    """Writes episodes into a dataset folder, one episode folder each, then the dataset's metadata.

    Several writers (one per runner) may write into one folder at once if each gets its own episode ids
    (``first_id`` and ``id_step``: writer k of n writes ids k, k+n, k+2n, ...); :func:`write_metadata` then
    counts what they wrote. On a cluster, the folder must be one every writer's node sees (a shared filesystem),
    or each node writes its own and the folders are merged before reading (each episode folder is self-contained).
    """

    def __init__(self, path: str | os.PathLike, observation_space: gym.Space, action_space: gym.Space,
                 data_format: str = "parquet", first_id: int = 0, id_step: int = 1) -> None:
        if data_format not in WRITE_FORMATS:
            raise DatasetError(f"data_format got {data_format!r}; herdrl writes {' or '.join(WRITE_FORMATS)}")
        space_to_minari(observation_space), space_to_minari(action_space)  # refuse what cannot be stored, now
        self.data = Path(path) / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.observation_space, self.action_space = observation_space, action_space
        self.data_format = data_format
        self.next_id, self.id_step = first_id, id_step

    def write(self, episode: Episode) -> int:
        """Check ``episode`` against the spaces, write it (a new folder; its file, then its metadata, each written
        under a temporary name and renamed: a crash never leaves a half-written episode that counts), and return
        its id."""
        import pyarrow as pa

        episode = check_episode(episode, self.observation_space, self.action_space, f"episode {self.next_id}")
        episode_id, self.next_id = self.next_id, self.next_id + self.id_step
        steps = len(episode)
        columns = {
            "observations": _encode(self.observation_space, episode.observations, 0),
            "actions": _encode(self.action_space, episode.actions, 1),
            "rewards": pa.array(np.pad(episode.rewards, (0, 1))),
            "terminations": pa.array(np.pad(episode.terminations, (0, 1))),
            "truncations": pa.array(np.pad(episode.truncations, (0, 1))),
        }
        if episode.infos:
            columns["infos"] = _encode_infos(episode.infos)
        table = pa.table(columns)
        folder = self.data / str(episode_id)
        try:
            folder.mkdir()
        except FileExistsError:
            raise DatasetError(f"{folder} exists already: another writer uses episode id {episode_id} (one run "
                               "records into a folder at a time)") from None
        target = folder / _EPISODE_FILE[self.data_format]
        partial = folder / f".{target.name}.partial"
        if self.data_format == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, partial)
        else:
            import pyarrow.ipc as ipc

            with ipc.new_file(str(partial), table.schema) as sink:
                sink.write_table(table)
        partial.replace(target)
        meta = {"id": episode_id, "total_steps": steps, "rewards_sum": episode.total_return}
        if episode.seed is not None:
            meta["seed"] = int(episode.seed)
        # The episode's metadata last, written whole then renamed: an episode folder is complete when it has one
        # (a crash before leaves a folder that readers skip and `herd data finish` removes).
        (folder / ".metadata.json.partial").write_text(json.dumps(meta))
        (folder / ".metadata.json.partial").replace(folder / "metadata.json")
        return episode_id


def write_metadata(path: str | os.PathLike, observation_space: gym.Space, action_space: gym.Space,
                   data_format: str = "parquet", **extra: Any) -> dict[str, Any]:
    """Count the episodes in ``path`` and write the dataset's ``data/metadata.json`` (Minari's keys; ``extra``:
    ``dataset_id``, ``algorithm_name``, ``author``, ``description``, ... and herdrl's own ``herdrl_*`` keys)."""
    data = Path(path) / "data"
    steps = episodes = 0
    for meta_file in data.glob("*/metadata.json"):
        if meta_file.parent.name.isdigit() and (meta_file.parent / _EPISODE_FILE[data_format]).exists():
            steps += int(json.loads(meta_file.read_text())["total_steps"])
            episodes += 1
    metadata = {
        "total_episodes": episodes, "total_steps": steps, "data_format": data_format, "jpeg_encoding": False,
        "observation_space": json.dumps(space_to_minari(observation_space)),
        "action_space": json.dumps(space_to_minari(action_space)),
        "env_spec": None, "eval_env_spec": None,
        "dataset_id": extra.pop("dataset_id", f"herdrl/{Path(path).resolve().name}-v0"),
        "minari_version": MINARI_VERSION, **extra,
    }
    (data / "metadata.json").write_text(json.dumps(metadata, indent=1))
    return metadata


# ------------------------------------------------------------------------------------------------------- read
class OfflineDataset:
    """A dataset on disk (herdrl's or Minari's): its spaces, counts and episodes, read lazily."""

    def __init__(self, path: str | os.PathLike) -> None:
        root = Path(path).expanduser()
        data = root if (root / "metadata.json").exists() and root.name == "data" else root / "data"
        if not (data / "metadata.json").exists():
            raise DatasetError(f"{path}: not a dataset (no data/metadata.json); record one with herd record "
                               "CHECKPOINT --out DIR")
        self.path, self.data = root, data
        try:
            self.metadata: dict[str, Any] = json.loads((data / "metadata.json").read_text())
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{data / 'metadata.json'} is not readable JSON ({exc})") from exc
        self.data_format = self.metadata.get("data_format", "hdf5")
        if self.data_format not in READ_FORMATS:
            raise DatasetError(f"{path}: data_format {self.data_format!r} is not one herdrl reads "
                               f"({', '.join(READ_FORMATS)})")
        for key in ("observation_space", "action_space"):
            if key not in self.metadata:
                raise DatasetError(f"{path}: its metadata has no {key}")
        self.observation_space = space_from_minari(self.metadata["observation_space"], "observation_space")
        self.action_space = space_from_minari(self.metadata["action_space"], "action_space")
        self.jpeg = bool(self.metadata.get("jpeg_encoding", False))
        self.total_episodes = int(self.metadata.get("total_episodes", 0))
        self.total_steps = int(self.metadata.get("total_steps", 0))

    def episode_ids(self) -> list[int]:
        """The ids of its episodes, in order."""
        if self.data_format == "hdf5":
            h5py = _h5py()
            with h5py.File(self.data / "main_data.hdf5", "r") as f:
                return sorted(int(key.split("_", 1)[1]) for key in f if key.startswith("episode_"))
        name = _EPISODE_FILE[self.data_format]
        return sorted(int(p.parent.name) for p in self.data.glob(f"*/{name}")
                      if p.parent.name.isdigit() and (p.parent / "metadata.json").exists())

    def episode_files(self) -> list[Path]:
        """The file of each episode (Parquet or Arrow datasets), in id order."""
        if self.data_format == "hdf5":
            raise DatasetError(f"{self.path}: an HDF5 dataset is one file; its episodes have no files of their own")
        return [self.data / str(i) / _EPISODE_FILE[self.data_format] for i in self.episode_ids()]

    def episodes(self, ids: list[int] | None = None) -> Iterator[Episode]:
        """Each episode (``ids``: those, in that order), checked against the dataset's spaces."""
        ids = self.episode_ids() if ids is None else ids
        if self.data_format == "hdf5":
            yield from self._hdf5_episodes(ids)
            return
        for episode_id in ids:
            yield self.read_file(self.data / str(episode_id) / _EPISODE_FILE[self.data_format], episode_id)

    def read_file(self, path: Path, episode_id: int | None = None) -> Episode:
        """One episode file (Parquet or Arrow IPC), checked."""
        table = read_table(path)
        name = f"episode {episode_id if episode_id is not None else path}"
        for column in ("observations", "actions", "rewards", "terminations", "truncations"):
            if column not in table.column_names:
                raise DatasetError(f"{name} has no {column} column ({path})")
        table = table.combine_chunks()
        try:
            observations = _decode(self.observation_space, table.column("observations").chunk(0), self.jpeg)
            actions = _decode(self.action_space, table.column("actions").chunk(0)[:-1], self.jpeg)
            infos = _decode_infos(table.column("infos").chunk(0)) if "infos" in table.column_names else {}
            rows = lambda column: table.column(column).to_numpy()[:-1]  # noqa: E731 (the padding row dropped)
            episode = Episode(observations, actions, rows("rewards"), rows("terminations"), rows("truncations"),
                              infos, episode_id)
        except UNREADABLE as exc:
            raise DatasetError(f"{name}: its columns do not match the dataset's spaces ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
        return check_episode(episode, self.observation_space, self.action_space, name)

    def _hdf5_episodes(self, ids: list[int]) -> Iterator[Episode]:
        h5py = _h5py()

        def leaf(space: gym.Space, node: Any) -> Any:
            if isinstance(space, gym.spaces.Dict):
                return {key: leaf(sub, node[key]) for key, sub in space.spaces.items()}
            if isinstance(space, gym.spaces.Tuple):
                return tuple(leaf(sub, node[f"_index_{i}"]) for i, sub in enumerate(space.spaces))
            if self.jpeg and is_image_space(space):
                return _jpeg_frames((bytes(frame) for frame in node[()]), space.shape)
            return node[()]

        def infos(node: Any) -> dict[str, Any]:
            return {key: infos(value) if isinstance(value, h5py.Group) else value[()] for key, value in node.items()}

        with h5py.File(self.data / "main_data.hdf5", "r") as f:
            for episode_id in ids:
                name = f"episode {episode_id}"
                group = f.get(f"episode_{episode_id}")
                if group is None:
                    raise DatasetError(f"{name} is not in {self.data / 'main_data.hdf5'}")
                try:
                    episode = Episode(leaf(self.observation_space, group["observations"]),
                                      leaf(self.action_space, group["actions"]), group["rewards"][()],
                                      group["terminations"][()], group["truncations"][()],
                                      infos(group["infos"]) if "infos" in group else {}, episode_id)
                except UNREADABLE as exc:
                    raise DatasetError(f"{name} cannot be read as the dataset's spaces say ({type(exc).__name__}: "
                                       f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
                yield check_episode(episode, self.observation_space, self.action_space, name)

    def info(self) -> dict[str, Any]:
        """A summary: episodes, steps, return mean/min/max, episode length, spaces, format (reads every episode's
        metadata, or its rewards where Minari wrote no ``rewards_sum``)."""
        returns, lengths = [], []
        if self.data_format == "hdf5":
            for episode in self.episodes():
                returns.append(episode.total_return)
                lengths.append(len(episode))
        else:
            for episode_id in self.episode_ids():
                meta = json.loads((self.data / str(episode_id) / "metadata.json").read_text())
                if "rewards_sum" in meta:
                    returns.append(float(meta["rewards_sum"]))
                else:
                    table = read_table(self.data / str(episode_id) / _EPISODE_FILE[self.data_format])
                    returns.append(float(np.sum(table.column("rewards").to_numpy()[:-1])))
                lengths.append(int(meta["total_steps"]))
        mean = lambda xs: float(np.mean(xs)) if xs else math.nan  # noqa: E731
        return {"path": str(self.path), "data_format": self.data_format, "episodes": len(returns),
                "steps": int(sum(lengths)), "return_mean": mean(returns),
                "return_min": min(returns, default=math.nan), "return_max": max(returns, default=math.nan),
                "episode_length_mean": mean(lengths), "observation_space": str(self.observation_space),
                "action_space": str(self.action_space),
                **{key: self.metadata[key] for key in ("dataset_id", "algorithm_name", "herdrl_env",
                                                        "herdrl_checkpoint", "herdrl_explore") if key in self.metadata}}


def to_transitions(episodes: list[Episode], observation_space: gym.Space, action_space: gym.Space, gamma: float,
                   tails: bool = False) -> dict[str, Any]:
    """The episodes' steps as transitions in stored form (:class:`herdrl.obs.ObsSpec`): ``obs``, ``actions`` (env
    actions joined along the steps; a Tuple space's part by part), ``rewards``, ``next_obs``, ``discounts``
    (``gamma``, 0 where the step terminated its episode) and ``returns``
    (the discounted reward-to-go from each step to its episode's last recorded step). ``tails``: also
    ``tail_obs`` (the observation the step's episode stopped at) and ``tail_discounts`` (``gamma ** (T - t)`` from
    step ``t`` of an episode of ``T`` steps that did not terminate, 0 in one that did), so a learner can bootstrap
    a truncated episode's returns with its current value of where it stopped."""
    from herdrl.obs import ObsSpec, obs_concat, obs_map

    spec = ObsSpec(observation_space)
    obs, next_obs, rewards, discounts, returns = [], [], [], [], []
    tail_obs, tail_discounts = [], []
    for episode in episodes:
        stored = spec.batch(episode.observations)
        obs.append(obs_map(lambda o: o[:-1], stored))
        next_obs.append(obs_map(lambda o: o[1:], stored))
        rewards.append(episode.rewards.astype(np.float32))
        discounts.append(np.where(episode.terminations, 0.0, gamma).astype(np.float32))
        to_go, running = np.zeros(len(episode), np.float32), 0.0
        for t in range(len(episode) - 1, -1, -1):
            running = float(episode.rewards[t]) + gamma * running
            to_go[t] = running
        returns.append(to_go)
        if tails:
            steps = len(episode)
            tail_obs.append(obs_map(lambda o, n=steps: np.repeat(o[-1:], n, 0), stored))
            ended = bool(np.asarray(episode.terminations)[-1]) if steps else True
            tail_discounts.append(np.zeros(steps, np.float32) if ended else
                                  (gamma ** np.arange(steps, 0, -1, dtype=np.float64)).astype(np.float32))
    if not obs:
        raise DatasetError("the dataset has no episodes")
    out = {"obs": obs_concat(obs), "next_obs": obs_concat(next_obs), "actions": joined_actions(action_space, episodes),
           "rewards": np.concatenate(rewards), "discounts": np.concatenate(discounts),
           "returns": np.concatenate(returns)}
    if tails:
        out.update(tail_obs=obs_concat(tail_obs), tail_discounts=np.concatenate(tail_discounts))
    return out


def joined_actions(space: gym.Space, episodes: list[Episode]) -> Any:
    """Every episode's env actions joined along the step axis (a Tuple space's part by part, nested ones too)."""

    def join(sub: gym.Space, parts: list[Any]) -> Any:
        if isinstance(sub, gym.spaces.Tuple):
            return tuple(join(part_space, [p[i] for p in parts]) for i, part_space in enumerate(sub.spaces))
        return np.concatenate([np.asarray(p) for p in parts])

    return join(space, [e.actions for e in episodes])


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise DatasetError("reading an HDF5 dataset needs h5py: pip install 'herdrl[offline]'") from None
    return h5py


def read_table(path: Path) -> Any:
    """A Parquet or Arrow IPC file as a pyarrow Table (no pickled pandas or extension metadata is ever used)."""
    import pyarrow as pa

    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path)
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid) as exc:
        raise DatasetError(f"{path} is not a readable {path.suffix[1:]} file ({exc})") from exc


def episode_steps(path: Path) -> int:
    """The steps of an episode file, from its metadata alone (its rows, less the padding row)."""
    import pyarrow as pa

    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_metadata(path).num_rows - 1
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_file(source)
            return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches)) - 1
    except (OSError, pa.ArrowInvalid) as exc:
        raise DatasetError(f"{path} is not a readable {path.suffix[1:]} file ({exc})") from exc


def open_dataset(path: str | os.PathLike) -> OfflineDataset:
    """The dataset at ``path`` (the folder holding ``data/``, or ``data/`` itself)."""
    return OfflineDataset(path)
