"""How long a checkpoint takes to write, by replay-buffer size: what `herd launch slurm --signal-lead` must cover.

Writes checkpoints through herdrl's own writer (``herdrl.checkpoint.write_checkpoint``: torch tensors, the replay
buffer as an ``.npz``, every file fsynced, the directory swapped in atomically) with a replay buffer of Atari-shaped
transitions (84x84 uint8 frames, as the frame store keeps them: one frame per transition) of each size, into
``--dir`` (put it on the file system your jobs write to: a parallel file system is slower than this local disk).

    python benchmarks/checkpoint_time.py --sizes-gb 0.5,1,2,4 --dir /tmp/ckpt-bench
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from herdrl.checkpoint import write_checkpoint

FRAME = 84 * 84  # bytes per stored transition (one new frame each; actions, rewards, flags are small)


def replay_arrays(gigabytes: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A buffer of that many GB of frames plus the per-transition columns a DQN buffer keeps."""
    count = int(gigabytes * 1e9 / FRAME)
    frames = np.empty((count, 84, 84), np.uint8)
    chunk = 100_000
    for start in range(0, count, chunk):  # random bytes: no file system compresses them away
        frames[start:start + chunk] = rng.integers(0, 256, (min(chunk, count - start), 84, 84), np.uint8)
    return {"frames": frames, "actions": rng.integers(0, 6, count).astype(np.int64),
            "rewards": rng.standard_normal(count).astype(np.float32), "dones": np.zeros(count, bool)}


def main() -> None:
    """Time one checkpoint per buffer size; print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-gb", default="0.5,1,2,4")
    parser.add_argument("--dir", default="/tmp/herd-ckpt-bench")
    args = parser.parse_args()
    root = Path(args.dir)
    rng = np.random.default_rng(0)
    tensors = {"learner": {"module": {"w": torch.zeros(1_700_000)}}}  # ~7 MB: an Atari Q network and its Adam state
    print("| replay buffer | checkpoint written in | MB/s |\n|---|---|---|")
    for size in (float(s) for s in args.sizes_gb.split(",")):
        arrays = {"replay_buffer": replay_arrays(size, rng)}
        nbytes = sum(a.nbytes for a in arrays["replay_buffer"].values())
        start = time.perf_counter()
        write_checkpoint(root / f"checkpoint_{size:g}", {"metrics": {}}, tensors, arrays)
        seconds = time.perf_counter() - start
        print(f"| {nbytes / 1e9:.2f} GB | {seconds:.1f} s | {nbytes / 1e6 / seconds:.0f} |", flush=True)
        shutil.rmtree(root / f"checkpoint_{size:g}")
        del arrays
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
