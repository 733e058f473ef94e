"""``herd record``: play a trained policy and write its episodes as a dataset (Minari's format).

One process plays its episodes one after another; ``num_runners=N`` plays them in N Ray tasks at once, each
writing its own episode ids (task k: k, k+N, ...) into the one folder, whose metadata the driver writes when all
are done. The folder must be one every task's node sees (a shared filesystem); see :class:`DatasetWriter`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from herdrl.errors import ConfigError
from herdrl.offline.dataset import DatasetError, DatasetWriter, Episode, stack_rows, write_metadata

#: Steps after which an episode that has not ended is cut (truncated) while recording.
MAX_EPISODE_STEPS = 1_000_000


def _numeric_infos(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """The info keys every step of the episode has with a number or a numeric array of one shape (what a dataset
    column can hold); others (strings, objects, keys some steps lack) are left out."""
    kept: dict[str, Any] = {}
    for key in infos[0]:
        values = [info.get(key) for info in infos]
        if isinstance(values[0], dict):
            if all(isinstance(v, dict) for v in values):
                nested = _numeric_infos(values)
                if nested:
                    kept[key] = nested
            continue
        try:
            array = np.asarray(values)
        except (ValueError, TypeError):
            continue
        if array.dtype.kind in "fiub" and len(array) == len(infos):
            kept[key] = array
    return kept


def play_episodes(policy: Any, env: Any, count: int, seed: int | None, explore: bool, keep_infos: bool = True,
                  first_index: int = 0, index_step: int = 1) -> Any:
    """Yield ``count`` episodes played by ``policy`` on ``env`` (one gym env); episode i (from ``first_index`` in
    steps of ``index_step``) is reset with seed ``seed + i`` when a seed is given."""
    for k in range(count):
        index = first_index + k * index_step
        episode_seed = None if seed is None else seed + index
        obs, info = env.reset(seed=episode_seed)
        if episode_seed is not None:  # the policy's sampling noise (torch's stream) too: the same actions again
            import torch

            torch.manual_seed(episode_seed)
        observations, actions, rewards, terminations, truncations, infos = [obs], [], [], [], [], [info]
        state = policy.initial_state(1)
        for _ in range(MAX_EPISODE_STEPS):
            if policy.recurrent:
                action, state = policy.compute_single_action(obs, explore=explore, state=state)
            else:
                action = policy.compute_single_action(obs, explore=explore)
            obs, reward, terminated, truncated, info = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(float(reward))
            terminations.append(bool(terminated))
            truncations.append(bool(truncated))
            infos.append(info)
            if terminated or truncated:
                break
        else:
            truncations[-1] = True  # cut: the dataset says so rather than pretending it ended
        yield Episode(stack_rows(observations), stack_rows(actions), np.asarray(rewards), np.asarray(terminations),
                      np.asarray(truncations), _numeric_infos(infos) if keep_infos else {}, seed=episode_seed)


class _Controller:
    """A plain function of the observation, played as a policy by :func:`play_episodes`."""

    recurrent = False

    def __init__(self, act: Callable[[Any], Any]) -> None:
        self.act = act

    def initial_state(self, batch: int) -> None:
        """No state."""

    def compute_single_action(self, obs: Any, explore: bool = False) -> Any:
        """The function's action."""
        return self.act(obs)


def record_controller(act: Callable[[Any], Any], env_id: str, out: str | os.PathLike, episodes: int,
                      seed: int = 0, algorithm_name: str = "hand-written controller") -> dict[str, Any]:
    """Write ``episodes`` episodes of ``act`` (observation -> action: a hand-written controller) on ``env_id`` as a
    dataset in ``out`` (episode i reset with seed ``seed + i``); return its metadata."""
    import gymnasium as gym

    env = gym.make(env_id)
    writer = DatasetWriter(out, env.observation_space, env.action_space)
    try:
        for episode in play_episodes(_Controller(act), env, episodes, seed, explore=False, keep_infos=False):
            writer.write(episode)
    finally:
        env.close()
    return write_metadata(out, env.observation_space, env.action_space, algorithm_name=algorithm_name)


def _record_part(checkpoint: str, env_id: str, env_config: dict, out: str, count: int, seed: int | None,
                 explore: bool, data_format: str, part: int, parts: int,
                 progress: Callable[[int, float], None] | None = None) -> list[float]:
    """Play and write ``count`` episodes as writer ``part`` of ``parts``; their returns."""
    from herdrl.env import make_single_env
    from herdrl.env.previous import inputs_of
    from herdrl.policy import Policy

    policy = Policy.from_checkpoint(checkpoint)
    if any(inputs_of(policy.observation_space)):
        raise ConfigError("this policy sees the previous action/reward beside its observation "
                          "(lstm_use_prev_action/reward): recording it is not supported yet")
    env = make_single_env(env_id, env_config)
    writer = DatasetWriter(out, policy.observation_space, policy.action_space, data_format, first_id=part,
                           id_step=parts)
    returns = []
    try:
        for episode in play_episodes(policy, env, count, seed, explore, first_index=part, index_step=parts):
            writer.write(episode)
            returns.append(episode.total_return)
            if progress is not None:
                progress(len(returns), episode.total_return)
    finally:
        env.close()
    return returns


def record(checkpoint: str | os.PathLike, episodes: int, out: str | os.PathLike, *, env: str | None = None,
           explore: bool = False, seed: int | None = None, num_runners: int = 0, data_format: str = "parquet",
           address: str | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Play ``episodes`` episodes with a checkpoint's policy (greedy, or sampling with ``explore``) and write them
    to the dataset folder ``out`` (which must not hold a dataset yet); return the dataset's metadata.

    ``env``: play on this env instead of the checkpoint's (the same spaces). ``num_runners``: play in that many
    Ray tasks at once (0: in this process), on the Ray cluster at ``address`` (default: ``RAY_ADDRESS``, else a
    private Ray). ``seed``: episode i is reset with ``seed + i`` (reproducible).
    """
    from herdrl.checkpoint import env_to_make, read_meta

    if episodes < 1:
        raise ConfigError(f"--episodes got {episodes}; expected >= 1")
    if num_runners < 0:
        raise ConfigError(f"num_runners got {num_runners}; expected >= 0")
    if address and not num_runners:
        raise ConfigError("an address is for recording on a cluster: give --num-runners N too")
    out = Path(out)
    if (out / "data" / "metadata.json").exists() or (out.exists() and any(out.iterdir())):
        raise DatasetError(f"{out} is not empty: record into a new folder (a dataset is never overwritten)")
    meta = read_meta(Path(checkpoint))
    if meta["config"].get("policies") is not None:
        raise ConfigError("recording a multi-agent checkpoint is not supported yet: record a single-agent one")
    env_id = env_to_make(meta, env)
    if env_id is None:
        raise ConfigError("the checkpoint's env was a Python object: give --env ID")
    env_config = meta["config"].get("env_config") or {}
    start = time.perf_counter()
    say = progress or (lambda line: None)
    if num_runners == 0:
        ticker = {"last": time.monotonic()}

        def tick(done: int, last_return: float) -> None:
            if time.monotonic() - ticker["last"] >= 10 or done == episodes:
                ticker["last"] = time.monotonic()
                say(f"{done}/{episodes} episodes, last return {last_return:.2f}")

        returns = _record_part(str(meta["path"]), env_id, env_config, str(out), episodes, seed, explore,
                               data_format, 0, 1, tick)
    else:
        returns = _record_remote(str(meta["path"]), env_id, env_config, str(out), episodes, seed, explore,
                                 data_format, num_runners, address, say)
    from herdrl.checkpoint import space_from_json

    spaces = [space_from_json(meta["spaces"][kind]) for kind in ("observation", "action")]
    metadata = write_metadata(
        out, *spaces, data_format, algorithm_name=meta["algorithm"],
        author="herdrl", description=f"{len(returns)} episodes of {meta['algorithm']} on {env_id} "
                                     f"({'exploring' if explore else 'greedy'})",
        herdrl_env=env_id, herdrl_env_config=json.dumps(env_config), herdrl_checkpoint=str(meta["path"]),
        herdrl_explore=explore, herdrl_seed=seed)
    say(f"wrote {metadata['total_episodes']} episodes, {metadata['total_steps']} steps to {out} "
        f"({time.perf_counter() - start:.1f} s)")
    return metadata


def _record_remote(checkpoint: str, env_id: str, env_config: dict, out: str, episodes: int, seed: int | None,
                   explore: bool, data_format: str, num_runners: int, address: str | None,
                   say: Callable[[str], None]) -> list[float]:
    """Record in ``num_runners`` Ray tasks (one CPU each) on the cluster this process joins or starts."""
    import ray

    from herdrl.cluster.connect import connect, disconnect
    from herdrl.config import AlgorithmConfig

    config = AlgorithmConfig()
    config.address = address
    started = connect(config, num_cpus=num_runners)
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(_record_part)
        counts = [episodes // num_runners + (k < episodes % num_runners) for k in range(num_runners)]
        refs = [task.remote(checkpoint, env_id, env_config, out, count, seed, explore, data_format, k, num_runners)
                for k, count in enumerate(counts) if count]
        returns: list[float] = []
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            returns += ray.get(done[0])
            say(f"{len(refs) - len(pending)}/{len(refs)} runners done, {len(returns)}/{episodes} episodes")
        return returns
    finally:
        if started:
            disconnect()
