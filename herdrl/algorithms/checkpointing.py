"""Checkpoints of an algorithm: what ``save()`` writes, what ``restore()`` and ``from_checkpoint()`` read back and
refuse, the learner and policy state, and the rule that replay files live in a run's newest checkpoint only.

:class:`Checkpointing` is mixed into :class:`~herdrl.algorithms.base.Algorithm`; it reads the run's state that
``Algorithm.__init__`` builds (config, learners, normalizer, counters, episode windows, callbacks' reducers).
The file format itself is :mod:`herdrl.checkpoint`.
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from herdrl.checkpoint import (
    PREFIX,
    SITE_KEYS,
    CheckpointError,
    CheckpointPath,
    as_checkpoint_path,
    checkpoint_config,
    checkpoint_name,
    list_checkpoints,
    read_meta,
    read_tensors,
    space_from_json,
    space_to_json,
    write_checkpoint,
)
from herdrl.env.imports import env_origin
from herdrl.errors import ConfigError
from herdrl.filters import model_observation_space
from herdrl.models.encoders import encoding_differs
from herdrl.results import Result

logger = logging.getLogger("herdrl")


class Checkpointing:
    """Save, restore and rebuild an algorithm from a checkpoint (RLlib's ``Checkpointable``, for one class)."""

    def get_policy_state(self) -> dict[str, Any]:
        """Everything inference needs, as plain data: weights and normalisation statistics (numpy), spaces (JSON
        form), model config. Multi-agent runs: see ``Policy.from_checkpoint(path, policy_id=...)``."""
        if self.multi_agent:
            raise ConfigError("get_policy_state() is for single-agent runs: save a checkpoint and load one policy "
                              "with Policy.from_checkpoint(path, policy_id=...)")
        return {"weights": self.learners.get_weights(), "model": dict(self.config.model),
                "filters": self.normalizer.state(), "observation_filter": self.config.observation_filter,
                "clip_obs": self.config.clip_obs, "observation_space": space_to_json(self.observation_space),
                "model_observation_space": space_to_json(model_observation_space(self.observation_space,
                                                                                 self.config)),
                "action_space": space_to_json(self.action_space)}

    def _checkpoint_learner_state(self) -> dict[str, Any] | None:
        """The learner state of the newest checkpoint written or restored, if it can be read."""
        if self.last_checkpoint is None:
            return None
        try:
            return read_tensors(self.last_checkpoint)["learner"]
        except (CheckpointError, OSError, KeyError) as exc:
            logger.warning("herdrl: cannot read the learner state of %s: %s", self.last_checkpoint, exc)
            return None

    def learner_state(self) -> dict[str, Any]:
        """Tensors of the learner (module, optimizers, target networks); off-policy algorithms add their
        replay debt."""
        return self.learners.state()

    def load_learner_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`learner_state`."""
        self.learners.load_state(state)

    def _default_trial_dir(self) -> Path:
        """Where ``save()`` without a path writes: the run's trial folder, or for an algorithm built in Python a new
        one, ``results/<env>/<ALGO>_<env>_<seed>_<time>`` (made on the first save, then kept)."""
        if self.logger is not None:
            return Path(self.logger.logdir)
        if self._save_dir is None:
            from herdrl.experiment import experiment_name, run_subject, trial_name
            from herdrl.trial_dir import create_trial_dir

            self._save_dir = create_trial_dir(Path("results").resolve() / experiment_name(run_subject(self.config))
                                              / trial_name(self.config), exact=False)
            logger.info("herdrl: checkpoints of this algorithm go to %s", self._save_dir)
        return self._save_dir

    def save(self, checkpoint_dir: str | Path | None = None) -> CheckpointPath:
        """Write a checkpoint (atomically) and return its path (a Path, also read as RLlib's training result:
        ``.checkpoint.path``, ``.metrics``).

        ``checkpoint_dir``: where to write it; default ``<trial dir>/checkpoint_<iteration>`` (an algorithm built in
        Python, with no trial folder: a new one under ``results/<env>/``, made on the first save).
        """
        if checkpoint_dir is None:
            checkpoint_dir = self._default_trial_dir() / checkpoint_name(self.iteration)
        config = self.config.to_dict()
        if callable(config["env"]):
            config["env"] = None  # a class or function: from_checkpoint then needs env=... again
        if callable(config["policy_mapping_fn"]):
            config["policy_mapping_fn"] = None  # a function: a resumed run needs it passed again
        config["callbacks_class"], config["callbacks_hooks"] = None, {}  # code: never saved, never read back
        if config["policies"] is not None:  # policy spaces are saved with the others, below; their own keys here
            config["policies"] = {pid: {"config": spec["config"]} if spec.get("config") else None
                                  for pid, spec in sorted(config["policies"].items())}
        for key in SITE_KEYS:  # where it ran is not part of the experiment (and never read back)
            config[key] = None
        meta = {
            "algorithm": self.config.algo_name, "config": config,
            "counters": {"training_iteration": self.iteration,
                         "num_env_steps_sampled_lifetime": self.env_steps_lifetime,
                         "num_episodes_lifetime": self.episodes_lifetime, "time_total_s": self.time_total_s,
                         "num_agent_steps_sampled_lifetime": self.agent_steps_lifetime,
                         "policy_steps_lifetime": self.policy_steps_lifetime},
            "episodes": {"returns": list(self._returns), "lengths": list(self._lengths),
                         "parts": {key: list(values) for key, values in self._part_returns.items()}},
            "numpy_rng": self.rng.bit_generator.state,
            "spaces": {"observation": space_to_json(_space(self.observation_space)),
                       "action": space_to_json(_space(self.action_space))},
            "metrics": {k: v for k, v in self.last_result.items() if isinstance(v, (int, float))},
            "custom_metrics": {"runners": self._runner_metrics.state(), "driver": self._driver_metrics.state()},
            **env_origin(self.config.env),
        }
        filters = {key: torch.from_numpy(np.asarray(value)) for key, value in self.normalizer.state().items()}
        tensors = {"learner": self.learner_state(), "torch_rng": torch.get_rng_state(), "filters": filters}
        arrays = self.checkpoint_arrays()
        path = write_checkpoint(Path(checkpoint_dir), meta, tensors, arrays)
        self.last_checkpoint = path
        if hasattr(self.logger, "checkpoint"):  # trackers record the newest checkpoint folder
            self.logger.checkpoint(path)
        self.learners.checkpoint_written()
        # Large array files (replay buffers) live in this run's newest checkpoint only: dropped from the checkpoints
        # this instance wrote before and from its own trial folder's, never from anyone else's.
        if arrays and path.name.startswith(PREFIX):  # (a Tune trial's checkpoints keep theirs: PBT may restore any)
            trial_dir = Path(self.logger.logdir).resolve() if self.logger is not None else None
            ours = set(self._array_checkpoints)
            if trial_dir is not None and path.parent.resolve() == trial_dir:
                ours.update(p.resolve() for p in list_checkpoints(trial_dir))
            ours.discard(path.resolve())
            for older in ours:
                for name in arrays:
                    (older / f"{name}.npz").unlink(missing_ok=True)
            self._array_checkpoints = [path.resolve()]
        saved = CheckpointPath(path)
        saved.metrics = Result(self.last_result)
        return saved

    def checkpoint_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """Extra state saved as plain numpy arrays, one ``.npz`` file per key (off-policy: the replay buffer)."""
        return {}

    def load_checkpoint_arrays(self, path: Path) -> None:
        """Inverse of :meth:`checkpoint_arrays`, given the checkpoint directory."""

    def restore(self, path: str | Path | Any) -> None:
        """Load a checkpoint of this algorithm into this instance: weights, optimizer, counters, RNG states.
        ``path``: a folder, or what ``save()`` returned, or a Tune result's ``.checkpoint``."""
        meta = read_meta(as_checkpoint_path(path))
        where = meta["path"]
        if meta.get("algorithm") != self.config.algo_name:
            raise CheckpointError(f"checkpoint '{where}' is a {meta.get('algorithm')} checkpoint, not "
                                  f"{self.config.algo_name}: load it with Algorithm.from_checkpoint")
        for kind, space in (("observation", _space(self.observation_space)), ("action", _space(self.action_space))):
            trained = space_from_json(meta["spaces"][kind])
            if trained != space or trained.dtype != space.dtype:
                raise CheckpointError(f"checkpoint '{where}' was trained with {kind} space {trained}; this env "
                                      f"has {space}")
        if (meta.get("format_version", 1) < 3 and self.config.model.get("obs_encoding") != "flat"
                and encoding_differs(self.observation_space)):
            raise CheckpointError(f"checkpoint '{where}' was written before encoders existed (format "
                                  f"{meta.get('format_version', 1)}) for observations today's encoders read "
                                  "differently: load it with Algorithm.from_checkpoint (or herd train --resume), "
                                  "or set model obs_encoding='flat'")
        clash = self.config.checkpoint_clash(meta, self.action_space)
        if clash:
            raise CheckpointError(f"checkpoint '{where}': {clash}")
        self._check_normalisation(meta)
        tensors = read_tensors(where)
        # The statistics first: loading the learner state of an asynchronous algorithm broadcasts them.
        self.normalizer.load_state(tensors.get("filters", {}))  # checkpoints before normalisation: none
        try:
            self.load_learner_state(tensors["learner"])
        except (KeyError, RuntimeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint '{where}' does not fit this {self.config.algo_name} "
                                  f"(a different model config?): {str(exc).splitlines()[0]}") from None
        torch.set_rng_state(tensors["torch_rng"])
        counters = meta["counters"]
        self.iteration = counters["training_iteration"]
        self.env_steps_lifetime = counters["num_env_steps_sampled_lifetime"]
        self.episodes_lifetime = counters["num_episodes_lifetime"]
        self.time_total_s = counters["time_total_s"]
        window = self._returns.maxlen  # (the episodes the running means average over: base.EPISODE_WINDOW)
        self._returns = deque(meta["episodes"]["returns"], maxlen=window)
        self._lengths = deque(meta["episodes"]["lengths"], maxlen=window)
        self._part_returns = {key: deque(values, maxlen=window)
                              for key, values in meta["episodes"].get("parts", {}).items()}
        self.agent_steps_lifetime = counters.get("num_agent_steps_sampled_lifetime", 0)
        # (before herdrl 0.4 schedules counted env steps for every policy: a checkpoint without counts starts there)
        self.policy_steps_lifetime = {str(k): int(v) for k, v in counters.get(
            "policy_steps_lifetime", dict.fromkeys(self.policies, self.env_steps_lifetime)).items()}
        self.rng.bit_generator.state = meta["numpy_rng"]
        self.last_result = Result(meta.get("metrics", {}))
        custom = meta.get("custom_metrics") or {} if self.callbacks is not None else {}  # (none log without them)
        self._runner_metrics.load_state(custom.get("runners", {}))
        self._driver_metrics.load_state(custom.get("driver", {}))
        self.load_checkpoint_arrays(Path(where))
        self.last_checkpoint = Path(where)
        self.runners.reseed(self.iteration)  # a resumed run must not replay the episodes and noise it began with
        self._callback("on_checkpoint_loaded", algorithm=self)

    def _check_normalisation(self, meta: dict[str, Any]) -> None:
        """A policy trained on normalised observations reads nothing else: refuse a config that normalises
        differently from the checkpoint's (its weights would load and silently read other inputs)."""
        saved = meta["config"]
        keys = [key for key, default in (("observation_filter", "NoFilter"), ("clip_obs", 10.0),
                                         ("norm_reward", False))
                if saved.get(key, default) != getattr(self.config, key)]
        if keys:
            key = keys[0]
            raise CheckpointError(f"checkpoint '{meta['path']}' was trained with {key}="
                                  f"{saved.get(key)!r}, this config has {getattr(self.config, key)!r}: "
                                  f"resume with the same {key}")

    @classmethod
    def from_checkpoint(cls, path: str | Path | Any, **config_overrides: Any) -> Any:
        """Rebuild the algorithm a checkpoint was saved from (its config, plus ``config_overrides``) and restore it.

        Example: ``Algorithm.from_checkpoint(path, num_env_runners=0)``. Where the run executes comes from
        ``config_overrides`` only (``address=...``; the checkpoint's are dropped), and a checkpoint env of the
        ``module:EnvId`` form (which imports ``module``) is made only when passed here too: ``env="module:EnvId"``.
        """
        from herdrl.multi_agent import actor_observation_space
        from herdrl.registry import get_config_class

        meta = read_meta(as_checkpoint_path(path))  # (also what save() returned, a Tune result's .checkpoint)
        # An env of the caller's replaces the checkpoint's (which then is never made).
        config = get_config_class(meta["algorithm"]).from_dict(
            checkpoint_config(meta, makes_env=config_overrides.get("env") is None))
        if config.policies is not None:  # multi-agent: each policy keeps the spaces it was trained with, its keys
            spaces = {kind: space_from_json(meta["spaces"][kind]) for kind in ("observation", "action")}
            own = config.policies if isinstance(config.policies, dict) else {}  # (a list before herdrl 0.4)
            # A policy's spec names its agents' own observations; the checkpoint holds what the policy stores,
            # which with a centralised critic has the global state beside them (the runners add it again).
            agent_space = actor_observation_space if config.centralized_critic else (lambda space: space)
            config.policies = {pid: {"observation_space": agent_space(spaces["observation"][pid]),
                                     "action_space": spaces["action"][pid],
                                     **({"config": own[pid]["config"]} if (own.get(pid) or {}).get("config")
                                        else {})} for pid in config.policies}
        config.update_from_dict(config_overrides)
        algo = config.build()
        try:
            algo.restore(meta["path"])
        except BaseException:
            algo.stop()
            raise
        return algo


def _space(space: gym.Space | dict[str, gym.Space]) -> gym.Space:
    """A space as checkpoints hold it: a multi-agent run's policy id -> space as a Dict space."""
    return gym.spaces.Dict(space) if isinstance(space, dict) else space

