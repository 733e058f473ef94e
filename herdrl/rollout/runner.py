"""EnvRunner: one vector env and a copy of the policy, stepping out fixed-length fragments.

In-process (``num_env_runners=0``) the algorithm holds one EnvRunner; with Ray,
each runner actor wraps one. Each step is one batched forward pass for all the
runner's envs; the runner keeps no torch graph and returns plain numpy arrays.
Values and log-probabilities are not computed here: the learner gets them for
the whole batch in one pass, which is cheaper than one small pass per step.
This module imports torch only for a torch policy (see ``herdrl.rollout.light``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from herdrl.callbacks import EpisodeTracker, runner_callbacks
from herdrl.config import AlgorithmConfig
from herdrl.env import make_vector_env
from herdrl.env.atari import life_losses
from herdrl.env.previous import previous_inputs
from herdrl.errors import ConfigError, EnvError
from herdrl.filters import Normalizer, RunnerNormalizer, model_observation_space, split_weights
from herdrl.models.action_layout import ActionLayout
from herdrl.models.numpy_policy import MLPWeights, light_policy
from herdrl.models.protocol import concat_states, state_rows
from herdrl.obs import ObsArray, ObsSpec, obs_map
from herdrl.rollout.light import PENDING, TORCH, RunnerConfig


def _rows(obs: ObsArray) -> Any:
    """``t -> step t's rows``: a view of the array, or a dict of views for Dict/Tuple observations."""
    return obs.__getitem__ if isinstance(obs, np.ndarray) else lambda t: {k: v[t] for k, v in obs.items()}


class _Loop:
    """One ``sample()`` call's working set: the fragment's arrays as they fill, what the policy reads, the states
    entering its training sequences, and which env parts have a step in flight."""

    steps: int
    obs: ObsArray
    acting: ObsArray
    actions: np.ndarray
    rewards: np.ndarray
    terminateds: np.ndarray
    truncateds: np.ndarray
    lives: np.ndarray | None
    logp: np.ndarray | None
    noise: np.ndarray
    norm: Any
    state_in: list[Any]
    reset_at_start: np.ndarray
    parts: int
    in_flight: list[bool]


@dataclass
class Fragment:
    """``T`` steps of ``B`` envs. ``obs`` has T+1 rows: the last is the observation after the fragment.

    With normalisation (``herdrl.filters``) on, on-policy fragments hold observations and rewards as the runner
    normalised them; off-policy fragments hold them raw (replayed batches are normalised).

    ``valid[t, b]`` is False for the reset-only step that follows an episode end
    (NEXT_STEP autoreset); such steps carry no experience and are masked out.
    """

    obs: ObsArray  # (T+1, B, *obs_shape) in stored dtypes (herdrl.obs): uint8 frames stay uint8
    actions: np.ndarray  # (T, B, ...) as sampled (unclipped), stored as herdrl.models.distributions lays them out
    rewards: np.ndarray  # (T, B) float32
    terminateds: np.ndarray  # (T, B) bool
    truncateds: np.ndarray  # (T, B) bool
    valid: np.ndarray  # (T, B) bool
    episode_returns: list[float] = field(default_factory=list)  # episodes finished in this fragment
    episode_lengths: list[int] = field(default_factory=list)
    logp: np.ndarray | None = None  # (T, B) float32: log-probability of each action under the sampling policy
    weights_version: int = -1  # the learner update whose weights sampled it (asynchronous algorithms)
    worker_index: int = 0  # the runner that sampled it (0: in the driver)
    filter_delta: dict[str, np.ndarray] | None = None  # normalisation statistics of its samples (herdrl.filters)
    # Recurrent policies' states (herdrl.models.protocol: an LSTM's one array, any module's numpy leaves): entering
    # each training sequence, N rows (batch.py), and entering step T, B rows.
    state_in: Any = None
    state_last: Any = None
    metrics: list | None = None  # custom metrics its callbacks logged (herdrl.callbacks.MetricsLogger.take)
    begins: np.ndarray | None = None  # (B,) bool: step 0 begins an episode (new envs, or after a reset-only step)

    @property
    def env_steps(self) -> int:
        """Real env steps in this fragment (reset-only steps excluded)."""
        return int(self.valid.sum())


def load_weights(module: Any, weights: dict[str, Any]) -> None:
    """Copy the learner's weights (numpy arrays or CPU tensors) into a runner's torch module, in place, on the CPU
    or its GPU; keys and shapes must match."""
    import torch

    own = module.state_dict()
    if own.keys() != weights.keys():
        raise ValueError(f"weights have keys {sorted(weights)}, the runner's policy {sorted(own)}")
    for key, value in weights.items():
        value = np.asarray(value)
        if value.shape != tuple(own[key].shape):
            raise ValueError(f"weight '{key}' has shape {value.shape}, expected {tuple(own[key].shape)}")
        if own[key].device.type == "cpu":
            own[key].numpy()[...] = value  # read-only object-store arrays are fine: we copy out of them
        else:
            own[key].copy_(torch.tensor(value))  # a copy first: the object store's arrays are read-only


def runner_module(config: AlgorithmConfig, observation_space: Any, action_space: Any) -> Any:
    """The runner's copy of the policy, without gradients, on a GPU when ``num_gpus_per_env_runner`` asks for one."""
    from herdrl.models.encoders import torch_device

    device = torch_device(config.num_gpus_per_env_runner, "num_gpus_per_env_runner")
    return config.build_module(observation_space, action_space).requires_grad_(False).to(device)


class EnvRunner:
    """Steps ``num_envs_per_env_runner`` env copies with the current policy."""

    def __init__(self, config: AlgorithmConfig | RunnerConfig, worker_index: int = 0, incarnation: int = 0,
                 epoch: int = 0, recorder: Callable[..., Any] | None = None) -> None:
        """``worker_index``: 0 in-process, 1.. for Ray runners; ``incarnation``: how many runners held this index
        before (restarts); ``epoch``: the training iteration the run resumed from (0 for a new run). With a
        ``seed``, the four pick this runner's own random streams (env resets, exploration noise, torch), so
        neither a restarted runner nor a resumed run replays earlier episodes or noise. ``config``: the
        algorithm's config, or a :class:`~herdrl.rollout.light.RunnerConfig` (Ray runners: its ``policy`` says
        whether the policy runs in numpy, in torch, or is yet to be told by :meth:`use_policy`). ``recorder``:
        with ``.offline_data(output=DIR)``, what makes the runner's episode recorder, called as
        ``recorder(DIR, observation_space, action_space, num_envs, worker_index, incarnation)`` (the layer above
        passes :class:`herdrl.offline.recorder.EpisodeRecorder`: rollout never imports offline)."""
        self.config = config
        self.worker_index = worker_index
        self.incarnation = incarnation
        policy = config.policy if isinstance(config, RunnerConfig) else TORCH
        if config.num_gpus_per_env_runner:
            from herdrl.models.encoders import torch_device

            torch_device(config.num_gpus_per_env_runner, "num_gpus_per_env_runner")  # refused before any env starts
        self.env = make_vector_env(config.env, config.env_config, config.num_envs_per_env_runner,
                                   config.gym_env_vectorize_mode, worker_index, previous_inputs(config.model))
        self.num_envs = self.env.num_envs
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        self.obs_spec = ObsSpec(self.observation_space)  # raw observations, as the env gives them
        model_space = model_observation_space(self.observation_space, config)
        self.model_spec = ObsSpec(model_space)  # what the policy reads (filtered leaves as float32)
        self.module: Any = None  # the torch policy network (None: the policy runs in numpy)
        self._weights: MLPWeights | None = None  # a light runner's policy weights (kept across reseeds)
        self._model_space = model_space
        if policy == TORCH:
            self.module = self._build_module(model_space)
        elif policy != PENDING:
            self._weights = MLPWeights(policy)
        self.normalizer = RunnerNormalizer(self.observation_space, config, self.num_envs) \
            if Normalizer(self.observation_space, config).active else None
        self.actions = ActionLayout(self.action_space)  # stored layout and env form of actions
        self._with_logp = bool(getattr(config, "behaviour_logp", False))
        self.weights_version = -1  # no versioned weights yet
        self.explore = True  # False: greedy actions (evaluation runners)
        self._evaluation: Any = None  # the evaluation this runner last took weights for
        self._counting = True  # whether sampling adds to the normalisation statistics (not while evaluating)
        self._policy_error: BaseException | None = None  # why use_policy failed (said at the next sample)
        self._choose_stepping()
        self.callbacks, self.metrics_logger, self._episodes = runner_callbacks(self, EpisodeTracker, self.env)
        self.recorder: Any = None  # .offline_data(output=DIR): this runner writes the episodes it plays there
        if getattr(config, "output", None):
            if recorder is None:
                raise ConfigError("output= records episodes: pass the runner "
                                  "recorder=herdrl.offline.recorder.EpisodeRecorder")
            self.recorder = recorder(config.output, self.observation_space, self.action_space, self.num_envs,
                                     worker_index, incarnation)
        self.reseed(epoch)

    def reseed(self, epoch: int) -> None:
        """Take the random streams of (seed, runner index, incarnation, ``epoch``) and start fresh episodes."""
        if getattr(self, "recorder", None) is not None:  # the envs restart: their open episodes end unrecorded
            self.recorder.restart()
        seed = self.config.seed
        key = [seed, self.worker_index, self.incarnation, epoch]
        streams = [None] * 3 if seed is None else np.random.SeedSequence(key).spawn(3)
        reset_stream, noise_stream, self.torch_stream = streams
        self._rng = np.random.default_rng(noise_stream)
        self.policy = self._make_policy()
        reset_seed = None if reset_stream is None else int(reset_stream.generate_state(1)[0])
        if getattr(self, "_reseeded", False):  # (not at start: on_environment_created may have logged)
            self.metrics_logger.take()  # what hooks logged for the episodes left behind is not reported
        self._reseeded = True
        if self._episodes is not None:
            self._episodes.create_all()
        try:
            raw_obs, reset_info = self.env.reset(seed=reset_seed)
        except Exception as exc:
            raise self._env_error(exc) from exc
        self._obs = self.obs_spec.batch(raw_obs)
        if self._episodes is not None:
            self._episodes.start_all(self._obs, reset_info)
        if self.normalizer is not None:  # a new timeline: nothing of the old one is shipped or carried
            self.normalizer.restart()
            if self._counting:
                self.normalizer.observe(self._obs)
                self.normalizer.count(self._obs)
        self._reset_next = np.zeros(self.num_envs, dtype=bool)  # next step of env b only resets it
        self._begins = np.ones(self.num_envs, dtype=bool)  # each env's next step begins an episode
        self._clip_rewards = bool(getattr(self.env, "herd_clip_rewards", False))
        self._episodic_life = bool(getattr(self.env, "herd_episodic_life", False))
        if self._episodic_life:
            self._lives = np.asarray(reset_info["lives"], dtype=np.int64).copy()
        self._episode_return = np.zeros(self.num_envs)
        self._episode_length = np.zeros(self.num_envs, dtype=np.int64)

    def _choose_stepping(self) -> None:
        """Step the envs in parts the runner overlaps with acting (atari.TwoHalves), or all at once (any other env,
        and a recurrent policy, which steps all its envs' states together); whether fragments carry sequence
        states."""
        self.recurrent = bool(getattr(self.module, "recurrent", False))
        self._ships_states = self.recurrent and self._algorithm_config().reads_sequence_states
        if hasattr(self.env, "parts") and not self.recurrent:
            self._parts, self._send, self._recv = self.env.parts, self.env.send, self.env.recv
        else:
            self._parts, self._send, self._recv = (slice(None),), self._stash, self._step

    def _algorithm_config(self) -> AlgorithmConfig:
        """The algorithm's config object (a Ray runner's comes as bytes, unpickled here: it imports torch)."""
        return self.config.full() if isinstance(self.config, RunnerConfig) else self.config

    def _build_module(self, model_space: Any) -> Any:
        """The torch network."""
        return runner_module(self._algorithm_config(), model_space, self.action_space)

    def _make_policy(self) -> Any:
        """The policy acting with this runner's noise stream: numpy on the blueprint's arrays, the torch network's
        (its numpy twin where it has one), or None until :meth:`use_policy` says which."""
        if self._weights is not None:
            return light_policy(self._weights, self.actions, self._rng)
        if self.module is None:
            return None
        if self.recurrent:  # a state per env, zero: every env starts an episode
            return self._algorithm_config().recurrent_runner_policy(self.module, self._rng, self.num_envs)
        return self._algorithm_config().runner_policy(self.module, self._rng)

    def use_policy(self, policy: Any) -> None:
        """Ray runners started without a policy: act in numpy on ``policy`` (a blueprint) or build the torch
        network (:data:`~herdrl.rollout.light.TORCH`)."""
        if self.module is not None or self._weights is not None:
            return  # told already (a runner started after the driver knew)
        try:
            if policy == TORCH:
                self.module = self._build_module(self._model_space)
                self._choose_stepping()
            else:
                self._weights = MLPWeights(policy)
            self.policy = self._make_policy()
        except Exception as exc:  # said by the next sample call, which the driver waits on
            self._policy_error = exc

    def _stash(self, part: int, env_actions: Any) -> None:
        self._env_actions = env_actions

    def _step(self, part: int) -> tuple[Any, ...]:
        return self.env.step(self._env_actions)

    def set_weights(self, weights: dict[str, Any], version: int | None = None) -> None:
        """Load the learner's weights (numpy arrays or CPU tensors) into this runner's policy, in place; ``version``
        (asynchronous algorithms) is stamped on the fragments sampled with them. Normalisation statistics sent
        along (``herdrl.filters``) replace the runner's."""
        if version is not None:
            self.weights_version = version
        weights, stats = split_weights(weights)
        if stats is not None and self.normalizer is not None:
            self.normalizer.load(stats)
        if self.module is not None:
            load_weights(self.module, weights)
        elif self._weights is not None:
            self._weights.load(weights)
        else:
            self._no_policy()

    def _no_policy(self) -> None:
        if self._policy_error is not None:
            raise self._policy_error
        raise RuntimeError("the runner was never told its policy (use_policy)")

    def normalizer_state(self) -> dict[str, np.ndarray]:
        """The normalisation statistics this runner normalises with (empty without normalisation)."""
        return {} if self.normalizer is None else self.normalizer.local.state()

    def set_exploration(self, params: dict[str, Any] | None) -> None:
        """Exploration settings the algorithm changes over time (e.g. DQN's ``epsilon``)."""
        for key, value in (params or {}).items():
            setattr(self.policy, key, value)

    def _env_error(self, exc: Exception) -> EnvError:
        """The user's env code failed: name it in one line, keep the cause for --debug."""
        return EnvError(f"env '{self.config.env}' raised {type(exc).__name__}: {exc}")

    def sample(self, num_steps: int | None = None) -> Fragment:
        """Step every env ``num_steps`` times (default: the config's fragment length)."""
        if self.policy is None:
            self._no_policy()
        loop = self._open_fragment(num_steps or self.config.fragment_length())
        self._run_steps(loop, *self._step_functions(loop))
        fragment = self._close_fragment(loop)
        if self.callbacks is not None:
            self.callbacks("on_sample_end", env_runner=self, worker=self, metrics_logger=self.metrics_logger,
                           samples=[fragment])
            fragment.metrics = self.metrics_logger.take()
        return fragment

    def _open_fragment(self, steps: int) -> _Loop:
        """A fragment's storage, its exploration noise, and the observations its first step acts on."""
        loop, envs = _Loop(), self.num_envs
        loop.steps = steps
        loop.obs = self.obs_spec.empty((steps + 1, envs))
        loop.actions = np.empty((steps, *self.actions.action_shape(envs)), dtype=self.actions.action_dtype)
        loop.rewards = np.empty((steps, envs), dtype=np.float32)
        loop.terminateds = np.empty((steps, envs), dtype=bool)
        loop.truncateds = np.empty((steps, envs), dtype=bool)
        loop.lives = np.empty((steps, envs), dtype=np.int64) if self._episodic_life else None
        loop.logp = np.empty((steps, envs), dtype=np.float32) if self._with_logp else None
        loop.noise = self.policy.noise(steps, envs)
        obs_map(lambda a, o: np.copyto(a[0], o), loop.obs, self._obs)
        norm = self.normalizer
        loop.norm = norm if norm is not None and norm.local.observations else None
        # What the policy reads: the stored observations, or their normalised copies.
        loop.acting = loop.obs if loop.norm is None else self._acting_storage(loop.obs, steps, envs)
        if loop.norm is not None:
            loop.norm.local.normalize(self._obs, out=obs_map(lambda a: a[0], loop.acting))
        loop.state_in = []
        loop.reset_at_start = self._reset_next.copy()
        return loop

    def _step_functions(self, loop: _Loop) -> tuple[Callable[[int, int], None], Callable[[int, int], None]]:
        """``start(part, t)`` (act for one part of the envs at step t and send their env step) and ``finish(part,
        t)`` (wait for that step and store what it gave), closed over the fragment's arrays: the inner loop reads
        locals only."""
        obs, acting, actions, rewards = loop.obs, loop.acting, loop.actions, loop.rewards
        terminateds, truncateds, lives, logp, norm = loop.terminateds, loop.truncateds, loop.lives, loop.logp, loop.norm
        # Per part of the envs (all of them, or Atari's two halves), views of every array: view[t] is step t's.
        arrays = (actions, loop.noise, rewards, terminateds, truncateds, lives if lives is not None else rewards,
                  logp if logp is not None else rewards)
        views = [[_rows(obs_map(lambda a, envs=envs: a[:, envs], obs)), *(a[:, envs] for a in arrays),
                  _rows(obs_map(lambda a, envs=envs: a[:, envs], acting))]
                 for envs in self._parts]
        loop.parts = len(views)
        in_flight = loop.in_flight = [False] * len(views)  # parts whose env step was sent and not yet received
        write, act, to_env, send, recv = self.obs_spec.write, self.policy.act, self.actions.to_env, self._send, \
            self._recv
        recurrent, seq_len = self.recurrent, int(self.config.model.get("max_seq_len", 20))
        ships_states, counting, state_in = self._ships_states, self._counting, loop.state_in
        episodes, reset_at_start = self._episodes, loop.reset_at_start
        env_indices = [np.arange(self.num_envs)[part] for part in self._parts] if episodes is not None else None
        position = np.zeros(self.num_envs, np.int64)  # steps since the env's sequence grid restarted

        def start(part: int, t: int) -> None:
            _, part_actions, part_noise = views[part][:3]
            acting_rows = views[part][8]
            if ships_states:  # sequences start at the fragment's start, at episode starts and every seq_len after
                if t:
                    reset_only = reset_at_start if t == 1 else terminateds[t - 2] | truncateds[t - 2]
                    position[:] = np.where(reset_only, 0, position + 1)
                split = position % seq_len == 0
                if split.any():
                    state_in.append(state_rows(self.policy.get_state(), split))
            if logp is None:
                action = act(acting_rows(t), self.explore, part_noise[t])
            else:  # V-trace needs the sampling policy's log-probabilities
                action, views[part][7][t] = self.policy.act_logp(acting_rows(t), part_noise[t])
            part_actions[t] = action
            if recurrent:  # after a reset-only step, the env's next step begins an episode
                self.policy.zero_state(self._reset_next if t == 0 else terminateds[t - 1] | truncateds[t - 1])
            try:
                send(part, to_env(action))
            except Exception as exc:
                raise self._env_error(exc) from exc
            in_flight[part] = True

        def finish(part: int, t: int) -> None:
            obs_rows, _, _, part_rewards, part_terminateds, part_truncateds, part_lives, _, acting_rows = views[part]
            in_flight[part] = False
            try:
                raw_obs, part_rewards[t], part_terminateds[t], part_truncateds[t], info = recv(part)
                write(obs_rows(t + 1), raw_obs)
            except Exception as exc:
                raise self._env_error(exc) from exc
            if norm is not None:  # count the new observations, then normalise them for acting
                if counting:
                    norm.observe(obs_rows(t + 1))
                norm.local.normalize(obs_rows(t + 1), out=acting_rows(t + 1))
            if lives is not None:
                part_lives[t] = info["lives"]
            if episodes is not None:  # callbacks' episode hooks (only when set: a Python loop over the envs)
                reset_only = (reset_at_start if t == 0 else terminateds[t - 1] | truncateds[t - 1])[env_indices[part]]
                episodes.step(env_indices[part], obs_rows(t + 1), views[part][1][t], part_rewards[t],
                              part_terminateds[t], part_truncateds[t], info, reset_only)

        return start, finish

    def _run_steps(self, loop: _Loop, start: Callable[[int, int], None], finish: Callable[[int, int], None]) -> None:
        """The fragment's steps. With two parts, one part's env step runs while the policy acts for the other
        (torch then leaves half its threads to the env's); with one part this is the plain loop (act, step,
        store)."""
        parts, steps = range(loop.parts), loop.steps
        torch = None
        if loop.parts > 1 and self.module is not None:
            import torch
        threads = torch.get_num_threads() if torch is not None else 1
        if threads > 1:
            torch.set_num_threads(threads // 2)
        try:
            for t in range(steps):
                for part in parts:
                    if t:
                        finish(part, t - 1)
                    start(part, t)
            for part in parts:
                finish(part, steps - 1)
        except BaseException:
            # A failure mid-step (two halves): collect the steps still in flight, so the env can go on or close.
            for part in parts:
                if loop.in_flight[part] and loop.parts > 1:
                    with contextlib.suppress(Exception):
                        self._recv(part)
            raise
        finally:
            if threads > 1:
                torch.set_num_threads(threads)

    def _close_fragment(self, loop: _Loop) -> Fragment:
        """The fragment of the steps taken: valid rows, episodes finished, recording, reward clipping and
        normalisation, Atari's life losses; the runner's carry-overs to the next fragment."""
        obs, rewards, terminateds, truncateds, lives = loop.obs, loop.rewards, loop.terminateds, loop.truncateds, \
            loop.lives
        norm, counting, ships_states = loop.norm, self._counting, self._ships_states
        self._obs = obs_map(lambda a: a[loop.steps].copy(), obs)
        # A step right after an episode end only resets that env (NEXT_STEP autoreset): not experience.
        done = terminateds | truncateds
        valid = np.empty(done.shape, dtype=bool)
        valid[0] = ~self._reset_next
        np.logical_not(done[:-1], out=valid[1:])
        self._reset_next = done[-1].copy()
        self._check_finite(obs, rewards)
        stored = loop.acting if norm is not None and self.normalizer.scale_fragments else obs
        fragment = Fragment(stored, loop.actions, rewards, terminateds, truncateds, valid, logp=loop.logp,
                            weights_version=self.weights_version, worker_index=self.worker_index,
                            state_in=concat_states(loop.state_in) if ships_states else None,
                            state_last=self.policy.get_state() if ships_states else None, begins=self._begins)
        self._collect_episodes(fragment)  # whole games, unclipped rewards: what the user's env scores
        if self.recorder is not None:  # raw observations, env actions and rewards, the env's own episode ends
            self.recorder.add(obs, [self.actions.to_env(loop.actions[t]) for t in range(loop.steps)], rewards,
                              terminateds, truncateds, valid)
        if self._clip_rewards:  # Atari: learn on the reward's sign
            fragment.rewards = np.sign(rewards)
        if norm is not None and counting:
            norm.count(obs_map(lambda a: a[1:], obs))  # the observations counted step by step
        if self.normalizer is not None and counting:
            fragment.rewards = self.normalizer.rewards(fragment.rewards, terminateds, truncateds, valid)
            fragment.filter_delta = self.normalizer.take_delta()
        if lives is not None:  # Atari's episodic life: a lost life ends the episode for learning only
            previous = np.concatenate([self._lives[None], lives[:-1]])
            fragment.terminateds = terminateds | life_losses(lives, previous, done)
            self._lives = lives[-1].copy()
        # The next fragment's first step begins an episode after a reset-only last step, or after a lost life (the
        # env goes on: a real step, but a new episode for learning).
        self._begins = ~valid[-1] | (fragment.terminateds[-1] & ~done[-1])
        return fragment

    def evaluation_sample(self, weights: dict[str, Any], explore: bool, evaluation: tuple[int, int], reset: bool,
                          num_steps: int) -> tuple[list[float], list[int], int]:
        """Evaluation runners: ``num_steps`` steps per env with ``weights`` (greedy unless ``explore``); returns the
        returns and lengths of the episodes finished, and the env steps taken. The first call of an ``evaluation``
        (``(id, epoch)``; also a runner's first call after a restart) loads the weights and, with ``reset``, starts
        every env on a fresh episode from the random streams of ``epoch``."""
        self._counting = False  # evaluation acts with the run's statistics as they are and adds nothing to them
        try:
            if evaluation != self._evaluation:
                self.set_weights(weights)
                # Fresh episodes on the evaluation's own streams: every evaluation in the episodes unit, the first
                # (of this runner) in the timesteps unit, whose episodes then carry over (not the training
                # runners' streams).
                if reset or self._evaluation is None:
                    self.reseed(evaluation[1])
                self.explore, self._with_logp = explore, False
                self._evaluation = evaluation
            fragment = self.sample(num_steps)
        finally:
            self._counting = True
        return fragment.episode_returns, fragment.episode_lengths, fragment.env_steps

    def _acting_storage(self, obs: ObsArray, steps: int, envs: int) -> ObsArray:
        """Storage for normalised observations: float32 arrays for filtered leaves; the other leaves are the raw
        storage itself (nothing to copy)."""
        acting = self.model_spec.empty((steps + 1, envs))
        if isinstance(acting, dict):
            filtered = set(self.normalizer.local.obs_names)
            acting = {name: value if name in filtered else obs[name] for name, value in acting.items()}
        return acting

    def _check_finite(self, obs: ObsArray, rewards: np.ndarray) -> None:
        leaves = list(obs.values()) if isinstance(obs, dict) else [obs]
        for name, array in (("reward", rewards), *(("observation", a) for a in leaves)):
            if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
                step = int(np.argwhere(~np.isfinite(array))[0][0])
                raise EnvError(f"env '{self.config.env}' returned a non-finite {name} (NaN or inf) "
                               f"at step {step} of a fragment; check its step()")

    def _collect_episodes(self, fragment: Fragment) -> None:
        """Record the episodes that ended in this fragment, with returns and lengths carried over from
        earlier fragments; vectorised over envs (a loop per env costs as much as sampling at 64 envs)."""
        done = fragment.terminateds | fragment.truncateds
        cum_return = np.cumsum(np.where(fragment.valid, fragment.rewards, 0.0), axis=0)
        cum_length = np.cumsum(fragment.valid, axis=0)
        ends_t, ends_b = np.nonzero(done)  # ordered by time, then env
        if len(ends_t):
            by_env = np.lexsort((ends_t, ends_b))  # each env's episode ends in time order
            env_of = ends_b[by_env]
            first = np.ones(len(by_env), dtype=bool)
            first[1:] = env_of[1:] != env_of[:-1]
            returns, lengths = np.empty(len(by_env)), np.empty(len(by_env), dtype=np.int64)
            for out, cum, carry in ((returns, cum_return, self._episode_return),
                                    (lengths, cum_length, self._episode_length)):
                at_end = cum[ends_t, ends_b][by_env]
                # An episode's total: the cumulative sum at its end minus that at the previous end in the
                # same env, or plus what the env carried in from earlier fragments for its first end.
                out[by_env] = at_end - np.where(first, -carry[env_of], np.roll(at_end, 1))
            fragment.episode_returns = returns.tolist()
            fragment.episode_lengths = lengths.tolist()
        steps = done.shape[0]
        last_end = steps - 1 - np.argmax(done[::-1], axis=0)
        envs = np.arange(done.shape[1])
        ended = done.any(axis=0)
        self._episode_return = np.where(ended, cum_return[-1] - cum_return[last_end, envs],
                                        self._episode_return + cum_return[-1])
        self._episode_length = np.where(ended, cum_length[-1] - cum_length[last_end, envs],
                                        self._episode_length + cum_length[-1])

    def stop(self) -> None:
        """Close the envs."""
        self.env.close()
