"""What offline algorithms share: a dataset instead of env runners, gradient steps instead of env steps.

An offline algorithm is an ordinary :class:`~herdrl.algorithms.base.Algorithm` whose "sampling" reads its dataset
(``.offline_data(input_=DIR)``): its episodes become transitions read from memory or streamed by Ray Data
(:mod:`herdrl.offline.reader`); each iteration takes ``updates_per_iteration`` gradient steps on batches of
``train_batch_size``, sent to the learner (or split between N data-parallel learner actors) ``updates_per_call``
steps at a time (a stream with learner actors: each rank reads its own share, none of it through the driver).
Schedules
(``lr``) count gradient steps. With an env (``.environment(...)``), every ``evaluation_interval`` iterations the
policy plays greedy episodes there (``evaluation/episode_return_mean``, what "solved" is judged on); without one,
the run learns and checkpoints without evaluating.
"""

from __future__ import annotations

from typing import Any

from herdrl.algorithms.base import Algorithm
from herdrl.config import MODEL_DEFAULTS, AlgorithmConfig, Field, shared_field
from herdrl.errors import ConfigError
from herdrl.obs import obs_map


class OfflineConfig(AlgorithmConfig):
    """Keys every offline algorithm has."""

    learns_offline = True
    reads_datasets = True
    stop_metric = "evaluation/episode_return_mean"
    FIELDS = {
        "input_": Field(None, (str,), "offline_data", allow_none=True,
                        doc="the dataset folder to learn from (herd record's, or Minari's: parquet, arrow, hdf5)"),
        "updates_per_iteration": Field(1000, (int,), "training", low=1,
                                       doc="gradient steps per iteration (one result row, one evaluation)"),
        "updates_per_call": Field(50, (int,), "training", low=1,
                                  doc="gradient steps per call to the learner (learner actors: per round trip)"),
        "offline_read_method": Field(
            "auto", (str,), "offline_data", choices=("auto", "memory", "ray_data"),
            doc="memory: every transition loaded once, no Ray; ray_data: streamed by Ray Data (bounded memory, any "
                "size); auto: memory while the transitions take less than offline_memory_limit_mb"),
        "offline_memory_limit_mb": Field(2048.0, (float,), "offline_data", low=0, low_open=True,
                                         doc="auto reads in memory up to this many MB of transitions"),
        "shuffle_buffer_rows": Field(20000, (int,), "offline_data", low=1,
                                     doc="ray_data: transitions in the local shuffle buffer batches are drawn from"),
        "train_batch_size": shared_field("train_batch_size", 256),
        "lr": shared_field("lr", 1e-3),
        "evaluation_interval": shared_field("evaluation_interval", 1),
    }
    ALIASES = {"input": "input_"}

    @property
    def reads_tails(self) -> bool:
        """Whether batches carry each row's episode tail (``tail_obs``, ``tail_discounts``): for learners that
        bootstrap truncated episodes' returns."""
        return False

    def validate_algorithm(self) -> None:
        """A dataset is needed; evaluation needs an env; no normalisation yet."""
        if not self.input_:
            raise ConfigError(f"{self.algo_name} learns from a dataset: set .offline_data(input_=DIR) (herd train: "
                              "--input DIR); record one with herd record CHECKPOINT --out DIR")
        if self.env is None:
            if self.is_explicit("evaluation_interval") and self.evaluation_interval:
                raise ConfigError("evaluation_interval needs an env to evaluate in: set .environment(ENV) (the "
                                  "dataset's env is never made from the dataset itself)")
            self._values["evaluation_interval"] = None
        if self.norm_reward:
            raise ConfigError(f"{self.algo_name} learns the dataset's rewards as recorded: norm_reward=False (its "
                              "observations can be normalised: observation_filter='MeanStdFilter')")
        if self.model.get("use_lstm"):
            raise ConfigError(f"{self.algo_name} learns from single transitions: model use_lstm is not supported")
        if self.is_multi_agent:
            raise ConfigError(f"{self.algo_name} learns single-agent datasets: .multi_agent() is not supported")


#: Keys the actor-critic offline algorithms (CQL, IQL) share: d3rlpy's network sizes and learning rate.
ACTOR_CRITIC_OFFLINE_FIELDS = {
    "model": shared_field("model", {**MODEL_DEFAULTS, "fcnet_hiddens": [256, 256], "fcnet_activation": "relu",
                                    "free_log_std": False}),
    "lr": shared_field("lr", 3e-4),
    "gamma": shared_field("gamma", 0.99),
    "tau": Field(0.005, (float,), "training", low=0, low_open=True, high=1,
                 doc="Polyak factor of the target critics (IQL; CQL with continuous actions)"),
    "twin_q": Field(True, (bool,), "training"),
}


class OfflineUpdates:
    """A learner mixin: ``update(batch, steps)`` takes ``steps`` gradient steps, each the learner's
    ``replay_step`` on the next ``len(batch) / steps`` rows (unit importance weights), after moving its learning
    clock one gradient step (``advance_learning_clock``: DQN's target copies count gradient steps here)."""

    def update(self, batch: dict[str, Any], steps: int) -> dict[str, float]:
        """``steps`` gradient steps; their mean metrics."""
        import torch

        from herdrl.models.encoders import to_torch

        batch = {key: to_torch(value, self.device) for key, value in batch.items()}
        rows = len(batch["rewards"]) // steps
        sums: dict[str, float] = {}
        for step in range(steps):
            rows_now = slice(step * rows, (step + 1) * rows)
            part = {key: obs_map(lambda t, r=rows_now: t[r], value) for key, value in batch.items()}
            part["weights"] = torch.ones(rows, device=self.device)
            clock = getattr(self, "advance_learning_clock", None)
            if clock is not None:
                clock(1)
            metrics, _ = self.replay_step(part)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + float(value)
        return {key: value / steps for key, value in sums.items()}


class OfflineAlgorithm(Algorithm):
    """Takes gradient steps on batches of the dataset's transitions, drawn from memory or streamed by Ray Data
    (:mod:`herdrl.offline.reader`).

    Subclasses give ``learner_class``, an :class:`OfflineUpdates` learner whose ``replay_step`` takes one gradient
    step on a batch of tensors (``obs``, ``actions`` in stored form, ``rewards``, ``next_obs``, ``discounts``,
    ``returns``, ``weights``) and returns its metrics (and per-row errors, unused here).
    """

    config: OfflineConfig

    def setup(self) -> None:
        """The reader of the dataset's transitions (:mod:`herdrl.offline.reader`): in this process, or, streamed
        with learner actors, one per learner rank on its own share of the episode files."""
        from herdrl.offline.reader import (
            MemoryReader,
            RayDataReader,
            StreamSpec,
            episode_files,
            fit_observation_filter,
            require_episode_files,
            share_rows,
            stored_row_bytes,
        )

        cfg = self.config
        dataset = self.runners.dataset
        normalizer = self.normalizer if self.normalizer.observations else None
        tails = cfg.reads_tails
        megabytes = dataset.total_steps * stored_row_bytes(self.observation_space, self.action_space, tails) / 2**20
        method = cfg.offline_read_method
        if method == "auto":
            method = "memory" if megabytes <= cfg.offline_memory_limit_mb or dataset.data_format == "hdf5" \
                else "ray_data"
        self._ray_started = False
        self.reader: Any = None
        # Read into memory: the episodes once, for the statistics and the transitions both.
        episodes = list(dataset.episodes()) if method == "memory" else None
        if normalizer is not None:  # the dataset's statistics, fixed for the run (d3rlpy's standard scaler)
            fit_observation_filter(normalizer, dataset.episodes() if episodes is None else episodes,
                                   dataset.observation_space)
        if method == "ray_data" and cfg.num_learners > 0:  # each rank streams its own share: none passes here
            require_episode_files(dataset)
            files = len(episode_files(dataset))
            if files < cfg.num_learners or cfg.train_batch_size < cfg.num_learners:
                raise ConfigError(f"{cfg.num_learners} learners stream their own shares of the dataset's episode "
                                  f"files and of each batch: it has {files} files, train_batch_size is "
                                  f"{cfg.train_batch_size}; use fewer learners or offline_read_method='memory'")
            self._stream_spec = StreamSpec(str(dataset.path), cfg.gamma, int(self.rng.integers(2**31)),
                                           cfg.train_batch_size, cfg.shuffle_buffer_rows, tails=tails,
                                           filter_state=None if normalizer is None else normalizer.state(),
                                           clip_obs=cfg.clip_obs)
            transitions = self.learners.open_stream(self._stream_spec)
            self._stream_rows = share_rows(cfg.train_batch_size, transitions)
            summary = {"dataset/episodes": files, "dataset/transitions": dataset.total_steps}
        elif method == "ray_data":
            from herdrl.cluster.connect import connect

            self._ray_started = connect(cfg)
            self.reader = RayDataReader(dataset, cfg.gamma, self.rng, cfg.train_batch_size, cfg.shuffle_buffer_rows,
                                        tails=tails, normalizer=normalizer)
            summary = {"dataset/episodes": len(self.reader.files), "dataset/transitions": dataset.total_steps}
        else:
            self.reader = MemoryReader(dataset, cfg.gamma, self.rng, tails, normalizer, episodes)
            summary = {"dataset/episodes": self.reader.episodes, "dataset/transitions": self.reader.size,
                       "dataset/return_mean": self.reader.return_mean}
        self.read_method = method
        self.gradient_steps_lifetime = 0
        self._iter_gradient_steps = 0
        self.dataset_summary = summary

    def _schedule_steps(self) -> int:
        """Schedules count gradient steps (there are no env steps)."""
        return self.gradient_steps_lifetime + self._iter_gradient_steps

    def _scheduled_values(self) -> dict[str, float]:
        return {key: schedule(self.gradient_steps_lifetime) for key, schedule in self.schedules.items()}

    def draw(self, rows: int) -> Any:
        """The next ``rows`` transitions from the reader; with learner ranks streaming their own shares, only how
        many each is to read (:class:`~herdrl.offline.reader.StreamRows`)."""
        if self.reader is None:
            from herdrl.offline.reader import StreamRows

            return StreamRows(self._stream_rows, rows // self.config.train_batch_size)
        return self.reader.draw(rows)

    def training_step(self) -> dict[str, float]:
        """``updates_per_iteration`` gradient steps, ``updates_per_call`` per learner call."""
        cfg = self.config
        self._iter_gradient_steps = 0
        sums: dict[str, float] = {}
        while self._iter_gradient_steps < cfg.updates_per_iteration:
            steps = min(cfg.updates_per_call, cfg.updates_per_iteration - self._iter_gradient_steps)
            metrics = self.learners.update(self.draw(steps * cfg.train_batch_size), steps)
            self._iter_gradient_steps += steps
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value * steps
        self.gradient_steps_lifetime += self._iter_gradient_steps
        done = self._iter_gradient_steps
        epochs = ({"dataset/epochs": self.learners.stream_epochs()} if self.reader is None else
                  {"dataset/epochs": self.reader.epochs} if hasattr(self.reader, "epochs") else {})
        return {**{key: value / done for key, value in sums.items()}, "num_gradient_updates": done,
                "num_gradient_updates_lifetime": self.gradient_steps_lifetime, **self.dataset_summary, **epochs}

    def stop(self) -> None:
        """Release the reader (and a Ray it started), then what every algorithm releases."""
        reader = getattr(self, "reader", None)
        if reader is not None:
            reader.stop()
        super().stop()
        if getattr(self, "_ray_started", False):
            from herdrl.cluster.connect import disconnect

            disconnect()

    def learner_state(self) -> dict[str, Any]:
        """The learner's state and the gradient steps taken (what schedules follow)."""
        return {**super().learner_state(), "gradient_steps_lifetime": self.gradient_steps_lifetime}

    def load_learner_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`learner_state`."""
        state = dict(state)
        self.gradient_steps_lifetime = int(state.pop("gradient_steps_lifetime", 0))
        super().load_learner_state(state)
        if self.reader is None:  # learner ranks stream: a resumed run's streams draw new orders, not the first run's
            import dataclasses

            filters = self.normalizer.state() if self._stream_spec.filter_state is not None else None
            self._stream_spec = dataclasses.replace(self._stream_spec, seed=int(self.rng.integers(2**31)),
                                                    filter_state=filters)
            self.learners.open_stream(self._stream_spec)
