"""QMIX (Rashid et al. 2018) and VDN (Sunehag et al. 2018): value decomposition for cooperative teams.

A cooperative PettingZoo env is learned as one team (:mod:`herdrl.env.team`, as RLlib's agent groups): each step
the team observes every agent's observation, the global state and each agent's allowed actions, takes one action
per agent and is paid the agents' mean reward. One Q network, shared by the agents (each input carries its agent's
one-hot id), gives every agent's Q values; a mixer turns the Q values of the actions the agents took into the
team's ``Q_tot``, and the TD target is ``r + gamma * Q_tot_target(s', a'*)``, each agent's ``a'*`` the greedy one
of the online network among its allowed actions (double Q), valued by the target network.

* ``mixer="vdn"``: ``Q_tot`` is the sum of the agents' Q values.
* ``mixer="qmix"``: a monotonic mixing network conditioned on the global state: hypernetworks map the state to the
  weights of a two-layer network over the agents' Q values, kept non-negative (absolute values), so ``dQ_tot/dQ_a
  >= 0``: each agent's greedy action is the team's (the paper's two-step game: QMIX finds the best joint payoff,
  8, where VDN settles for 7).

Agents act epsilon-greedily, each on its own draw (DQN's ``epsilon`` schedule). The replay buffer holds team
transitions (DQN's, with its prioritised and n-step options); checkpoints, evaluation and export (the team's
observation in, every agent's greedy allowed action out) are DQN's.

``agent_rnn=True``: the paper's recurrent agents: a GRU between two layers, hidden width ``rnn_hidden_dim``, the
state ``(agents, rnn_hidden_dim)`` per env carried by the runners across fragments and zeroed at each episode's
start. ``agent_last_action=True`` also feeds each agent its own previous action (one-hot; zeros at an episode's
start), as the paper's agents read it: the state then carries it, ``(agents, rnn_hidden_dim + actions)``; a
replayed window's first step reads the action taken before it (stored with the window). Replay holds episode windows
(:mod:`herdrl.sequence_replay`): segments of ``model.max_seq_len`` steps (set it to the episode length to learn on
whole episodes, as the paper) after up to ``replay_burn_in`` steps of the same episode that only rebuild the state
(no gradient flows into them); ``train_batch_size`` counts windows, ``training_intensity`` segment steps replayed
per env step sampled, and ``replay_buffer_config``'s ``capacity`` env steps (``capacity // max_seq_len`` windows,
each holding ``replay_burn_in + max_seq_len + 1`` observations; ``replay_buffer_size`` reports windows). The target
of each step is the same double-Q target, both networks unrolled over the window from a zero state.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from herdrl.algorithms.dqn import DQN, DQNConfig, DQNLearner
from herdrl.buffers import REPLAY_DEFAULTS
from herdrl.config import MODEL_DEFAULTS, Field, shared_field
from herdrl.env.imports import TEAM_PREFIX
from herdrl.errors import ConfigError
from herdrl.models.encoders import ACTIVATION_MODULES, module_device, to_torch
from herdrl.models.numpy_policy import random_allowed
from herdrl.models.q_network import masked_q
from herdrl.models.recurrent import CarriedState
from herdrl.sequence_replay import EpisodeSequencer, SequenceReplayBuffer


class QMIXConfig(DQNConfig):
    """QMIX/VDN settings (RLlib's key names: ``mixer``, ``mixing_embed_dim``); the rest are DQN's."""

    algo_name = "QMIX"
    #: The env's agents are one team, not policies mapped to agents (``.multi_agent()`` is refused).
    supports_multi_agent = False
    #: Recurrent agents learn from replayed windows unrolled from a zero state (burn-in): runners ship no states.
    reads_sequence_states = False
    FIELDS = {
        "model": shared_field("model", {**MODEL_DEFAULTS, "fcnet_hiddens": [64, 64], "fcnet_activation": "relu"}),
        "lr": shared_field("lr", 5e-4),
        "train_batch_size": shared_field("train_batch_size", 128),
        # (MPE simple_spread, 60k env steps: a hard copy every 200 steps diverged to -191, every 5,000 held -79)
        "target_network_update_freq": Field(5000, (int,), "training", low=1, doc="env steps between updates"),
        "mixer": Field("qmix", (str,), "training", choices=("qmix", "vdn"),
                       doc="qmix: a monotonic mixing network on the global state; vdn: the sum"),
        "mixing_embed_dim": Field(32, (int,), "training", low=1, doc="QMIX's mixing network width"),
        "hypernet_embed_dim": Field(64, (int,), "training", low=1, doc="its hypernetworks' hidden width"),
        "agent_rnn": Field(False, (bool,), "training",
                           doc="recurrent agents (a GRU, as the paper), learned on replayed episode windows"),
        "rnn_hidden_dim": Field(64, (int,), "training", low=1, doc="the agents' GRU width (agent_rnn)"),
        "agent_last_action": Field(False, (bool,), "training",
                                   doc="agent_rnn: each agent also reads its own previous action, as the paper"),
        "replay_burn_in": Field(0, (int,), "training", low=0,
                                doc="agent_rnn: steps before each replayed segment that only rebuild the state"),
    }

    @property
    def is_multi_agent(self) -> bool:
        """False: the env's agents are one team, a single agent to the rest of herdrl."""
        return False

    def validate_algorithm(self) -> None:
        """A team env, no agent mapping, no dueling heads; the env named as ``team:<env>``."""
        super().validate_algorithm()
        if self.policies is not None:
            raise ConfigError("QMIX trains every agent of the env as one team: leave .multi_agent() out")
        if self.dueling:
            raise ConfigError("QMIX has no dueling heads (dueling=False)")
        if self.agent_rnn:
            replay = self.replay_buffer_config
            if replay.get("type", "uniform") != "uniform":
                raise ConfigError("QMIX with agent_rnn replays episode windows uniformly: replay_buffer_config "
                                  "type 'uniform'")
            if self.n_step != 1:
                raise ConfigError("QMIX with agent_rnn learns one-step targets along each window: n_step=1")
            if self.observation_filter != "NoFilter" or self.norm_reward:
                raise ConfigError("QMIX with agent_rnn does not normalise observations or rewards yet: "
                                  "observation_filter='NoFilter', norm_reward=False")
        if self.agent_last_action and not self.agent_rnn:
            raise ConfigError("agent_last_action feeds recurrent agents their previous action: set agent_rnn=True")
        if isinstance(self.env, str) and not self.env.startswith(TEAM_PREFIX):
            self._values["env"] = TEAM_PREFIX + self.env  # (kept so in checkpoints: the team env again)
        elif not isinstance(self.env, str):
            raise ConfigError("QMIX needs its PettingZoo env by name: herdrl.register_env(name, creator), then "
                              ".environment(name)")

    def build_policy_module(self, observation_space: object, action_space: object) -> nn.Module:
        """The agents' shared Q network and the mixer."""
        if not isinstance(observation_space, gym.spaces.Dict) or "state" not in observation_space.spaces:
            raise ConfigError(f"QMIX needs a team env (team:<PettingZoo env>), not one observing {observation_space}")
        if self.agent_rnn:
            return TeamRNNQNetwork(observation_space, action_space, self.model, self.mixer, self.mixing_embed_dim,
                                   self.hypernet_embed_dim, self.rnn_hidden_dim, self.agent_last_action)
        return TeamQNetwork(observation_space, action_space, self.model, self.mixer, self.mixing_embed_dim,
                            self.hypernet_embed_dim)

    def runner_policy(self, module: nn.Module, rng: np.random.Generator) -> object:
        """Each agent epsilon-greedy among its allowed actions."""
        return TeamEpsilonGreedy(module, rng)

    def recurrent_runner_policy(self, module: nn.Module, rng: np.random.Generator, num_envs: int) -> object:
        """Recurrent agents: epsilon-greedy with a state per env."""
        return TeamEpsilonGreedy(module, rng, num_envs)

    def runner_blueprint(self, module: nn.Module) -> object:
        """None: runners act in torch."""
        return None

    @classmethod
    def algo_class(cls) -> type:
        """:class:`QMIX`."""
        return QMIX


def _mlp(sizes: list[int], activation: str = "relu") -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(ACTIVATION_MODULES[activation]())
    return nn.Sequential(*layers)


class QMixer(nn.Module):
    """``Q_tot = w2 . elu(W1 q + b1) + b2`` with ``W1 = |hyper_w1(s)|``, ``w2 = |hyper_w2(s)|`` (monotonic in every
    agent's Q), ``b1 = hyper_b1(s)`` and ``b2`` a state-dependent bias (a two-layer network), as in the paper."""

    def __init__(self, agents: int, state_dim: int, embed_dim: int, hypernet_dim: int) -> None:
        super().__init__()
        self.agents, self.embed_dim = agents, embed_dim
        self.hyper_w1 = _mlp([state_dim, hypernet_dim, agents * embed_dim])
        self.hyper_b1 = nn.Linear(state_dim, embed_dim)
        self.hyper_w2 = _mlp([state_dim, hypernet_dim, embed_dim])
        self.hyper_b2 = _mlp([state_dim, embed_dim, 1])

    def forward(self, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """``q`` (batch, agents), ``state`` (batch, state_dim) -> ``Q_tot`` (batch,)."""
        w1 = self.hyper_w1(state).abs().view(-1, self.agents, self.embed_dim)
        hidden = nn.functional.elu(torch.bmm(q.unsqueeze(1), w1).squeeze(1) + self.hyper_b1(state))
        w2 = self.hyper_w2(state).abs()
        return (hidden * w2).sum(-1) + self.hyper_b2(state).squeeze(-1)


class TeamQNetwork(nn.Module):
    """Every agent's Q values from one network shared by the agents (an agent's input: its flattened observation
    and its one-hot id), and the mixer (None: VDN's sum)."""

    def __init__(self, observation_space: gym.spaces.Dict, action_space: gym.spaces.MultiDiscrete, model: dict,
                 mixer: str, embed_dim: int, hypernet_dim: int) -> None:
        super().__init__()
        self.agents, width = observation_space["obs"].shape
        self.choices = int(action_space.nvec[0])  # each agent's actions
        # Replay stores a transition's actions as a vector, one per agent (the buffer's float32 holds them exactly).
        self.discrete, self.action_dim, self.masked = False, self.agents, True
        if not getattr(self, "recurrent", False):  # (recurrent agents build their own, after the mixer)
            self.agent = _mlp([width + self.agents, *model["fcnet_hiddens"], self.choices], model["fcnet_activation"])
        state_dim = int(np.prod(observation_space["state"].shape))
        self.mixer = QMixer(self.agents, state_dim, embed_dim, hypernet_dim) if mixer == "qmix" else None
        self.register_buffer("ids", torch.eye(self.agents), persistent=False)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Every agent's Q values, (batch, agents, actions)."""
        own = obs["obs"].float()
        ids = self.ids.expand(own.shape[0], -1, -1)
        return self.agent(torch.cat([own, ids], -1)).float()

    def allowed(self, q: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """``q`` with the actions each agent's mask rules out at ``MASKED_Q`` (DQN's masking, per agent)."""
        return masked_q(q, obs["action_mask"])

    def mix(self, q: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """``Q_tot`` (batch,) of the agents' Q values ``q`` (batch, agents) in the observation's state."""
        if self.mixer is None:
            return q.sum(-1)
        return self.mixer(q, obs["state"].float().reshape(len(q), -1))

    def greedy(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each agent's best allowed action, (batch, agents)."""
        return self.allowed(self.forward(obs), obs).argmax(-1)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], explore: bool = False) -> torch.Tensor:
        """Greedy actions (exploration is the runner's epsilon)."""
        return self.greedy(obs)


class TeamRNNQNetwork(TeamQNetwork):
    """The paper's recurrent agents: ``fc -> ReLU -> GRUCell -> fc`` shared by the agents (with their one-hot
    ids); the state ``(batch, agents, hidden)``, zeros at an episode's start. ``last_action``: each agent also reads
    its own previous action, one-hot, carried in the state after the GRU's (``(batch, agents, hidden + actions)``;
    whoever picks the actions writes them in with :meth:`taken`)."""

    recurrent = True

    def __init__(self, observation_space: gym.spaces.Dict, action_space: gym.spaces.MultiDiscrete, model: dict,
                 mixer: str, embed_dim: int, hypernet_dim: int, hidden: int, last_action: bool = False) -> None:
        super().__init__(observation_space, action_space, model, mixer, embed_dim, hypernet_dim)
        width = observation_space["obs"].shape[1]
        self.hidden, self.last_action = hidden, last_action
        self.state_width = hidden + (self.choices if last_action else 0)
        # (registered after the mixer, as ever: optimizer states are restored by parameter position)
        self.fc_in = nn.Linear(width + self.agents + (self.choices if last_action else 0), hidden)
        self.rnn = nn.GRUCell(hidden, hidden)
        self.fc_out = nn.Linear(hidden, self.choices)

    def initial_state(self, batch: int) -> torch.Tensor:
        """Zeros: the state entering an episode's first step, ``(batch, agents, state_width)``."""
        return torch.zeros(batch, self.agents, self.state_width, device=self.fc_out.weight.device)

    def step(self, obs: dict[str, torch.Tensor], state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step for a batch: every agent's Q values ``(batch, agents, actions)`` and the next state (its last
        action part zeros until :meth:`taken` writes the actions in)."""
        own = obs["obs"].float()
        batch = own.shape[0]
        inputs = [own, self.ids.expand(batch, -1, -1)] + ([state[..., self.hidden:]] if self.last_action else [])
        x = torch.relu(self.fc_in(torch.cat(inputs, -1)))
        h = self.rnn(x.reshape(batch * self.agents, -1), state[..., :self.hidden].reshape(batch * self.agents, -1))
        q, h = self.fc_out(h).reshape(batch, self.agents, -1), h.reshape(batch, self.agents, -1)
        return q, torch.cat([h, torch.zeros_like(state[..., self.hidden:])], -1) if self.last_action else h

    def taken(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``state`` with the agents' actions ``(batch, agents)`` written in as their last actions (unchanged
        without ``last_action``)."""
        if not self.last_action:
            return state
        actions = actions.long()  # (-1: no action, an episode's start: zeros)
        picked = nn.functional.one_hot(actions.clamp(min=0), self.choices).to(state.dtype)
        return torch.cat([state[..., :self.hidden], picked * (actions >= 0).unsqueeze(-1)], -1)

    def unroll(self, obs: dict[str, torch.Tensor], detach_at: torch.Tensor | None = None,
               actions: torch.Tensor | None = None, previous: torch.Tensor | None = None) -> torch.Tensor:
        """Q values ``(N, L, agents, actions)`` along N windows of L steps (``obs`` leaves ``(N, L, ...)``), each
        from a zero state (a window never crosses an episode start: :mod:`herdrl.sequence_replay`);
        ``detach_at`` ``(N,)``: the step before which each window's state stops carrying gradients (its burn-in
        only rebuilds the state, as R2D2's); ``actions`` ``(N, L - 1, agents)``: the actions taken, read back as
        last actions (``last_action``); ``previous`` ``(N, agents)``: the actions before each window's first step,
        its first step's last actions (-1: none, a window that begins its episode; ``previous`` None: none for
        every window)."""
        n, steps = obs["obs"].shape[:2]
        if self.last_action and actions is None:
            raise ValueError("agents reading their last action unroll with the actions taken")
        state = self.initial_state(n)
        if self.last_action and previous is not None:
            state = self.taken(state, previous)
        out = []
        for t in range(steps):
            if detach_at is not None and t and bool((detach_at == t).any()):
                state = torch.where((detach_at == t)[:, None, None], state.detach(), state)
            q, state = self.step({"obs": obs["obs"][:, t]}, state)
            if self.last_action and t < steps - 1:
                state = self.taken(state, actions[:, t])
            out.append(q)
        return torch.stack(out, 1)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Refused: recurrent agents run with their state (:meth:`step`, :meth:`unroll`)."""
        raise TypeError("recurrent agents run with their state: use step() or unroll()")

    def greedy_step(self, obs: dict[str, torch.Tensor], state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each agent's best allowed action and the next state (evaluation and export)."""
        q, state = self.step(obs, state)
        greedy = self.allowed(q, obs).argmax(-1)
        return greedy, self.taken(state, greedy)

    # herdrl.policy.Policy's recurrent interface: Q values stand for the distribution inputs, greedy is the action.
    def step_dist_inputs(self, obs: dict[str, torch.Tensor],
                         state: torch.Tensor) -> tuple[torch.Tensor, None, torch.Tensor]:
        """(allowed Q values, None, next state: the greedy actions taken)."""
        q, state = self.step(obs, state)
        q = self.allowed(q, obs)
        return q, None, self.taken(state, q.argmax(-1))

    def forward_exploration(self, obs: dict[str, torch.Tensor],
                            state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The module protocol's acting step (``herdrl.models.protocol``): (allowed Q values, next state)."""
        q, _, state = self.step_dist_inputs(obs, state)
        return q, state

    def act_with_noise(self, q: torch.Tensor, noise: None) -> torch.Tensor:
        """The greedy actions of allowed Q values (a Q network explores by epsilon, in the runners)."""
        return q.argmax(-1)

    def torch_noise(self, q: torch.Tensor) -> None:
        """None: greedy."""
        return None


class TeamEpsilonGreedy(CarriedState):
    """Runner policy: each agent takes its greedy allowed action, or with probability ``epsilon`` (its own draw) a
    uniformly random allowed one; recurrent agents carry a state ``(agents, hidden)`` per env."""

    def __init__(self, module: TeamQNetwork, rng: np.random.Generator, num_envs: int = 0) -> None:
        """``num_envs``: recurrent agents' states to carry (one per env)."""
        self.module, self.rng, self.epsilon = module, rng, 0.0
        self.device = module_device(module)
        self.recurrent = bool(getattr(module, "recurrent", False))
        self.state = module.initial_state(num_envs) if self.recurrent else None

    def noise(self, steps: int, batch: int) -> np.ndarray:
        """Per step, env and agent: a uniform draw (explore?) and one that picks the random allowed action."""
        return self.rng.random((steps, batch, self.module.agents, 2))

    def act(self, obs: Any, explore: bool = True, noise: np.ndarray | None = None) -> np.ndarray:
        """Actions, (batch, agents)."""
        with torch.inference_mode():
            if self.recurrent:  # the state moves one step
                greedy, self.state = self.module.greedy_step(to_torch(obs, self.device), self.state)
                greedy = greedy.cpu().numpy()
            else:
                greedy = self.module.greedy(to_torch(obs, self.device)).cpu().numpy()
        if not explore or self.epsilon <= 0:
            return greedy
        if noise is None:
            noise = self.noise(1, len(greedy))[0]
        mask = np.asarray(obs["action_mask"]).reshape(-1, self.module.choices)
        random = random_allowed(mask, noise[..., 1].reshape(-1)).reshape(greedy.shape)
        actions = np.where(noise[..., 0] < self.epsilon, random, greedy)
        if self.recurrent:  # the agents' last actions are the ones taken, not the greedy ones
            self.state = self.module.taken(self.state, torch.as_tensor(actions, device=self.device))
        return actions


class QMIXLearner(DQNLearner):
    """DQN's learner with the team's TD target: ``Q_tot`` of the taken actions against ``r + discount *
    Q_tot_target(s', a'*)``."""

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Huber loss of the team's TD error, weighted by the importance weights."""
        if self.config.agent_rnn:
            return self.window_loss(batch)
        obs, next_obs = batch["obs"], batch["next_obs"]
        q = self.module(obs).gather(-1, batch["actions"].long().unsqueeze(-1)).squeeze(-1)
        q_tot = self.module.mix(q, obs)
        with torch.no_grad():
            next_target = self.target(next_obs)
            online = self.module if self.config.double_q else self.target
            best = online.allowed(online(next_obs), next_obs).argmax(-1, keepdim=True)
            next_tot = self.target.mix(next_target.gather(-1, best).squeeze(-1), next_obs)
            target = batch["rewards"] + batch["discounts"] * next_tot
        loss = (batch["weights"] * nn.functional.smooth_l1_loss(q_tot, target, reduction="none")).mean()
        return loss, {"loss": loss.detach(), "td_error": (target - q_tot).detach()}

    def window_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Recurrent agents: the same loss on every segment step of the replayed windows (``obs`` ``(N, W+1,
        ...)``, per-step fields ``(N, W)``), both networks unrolled over each window from a zero state; burn-in
        and padding steps carry no loss. TD errors: each window's mean absolute error over its segment."""
        obs = batch["obs"]
        now = {key: value[:, :-1] for key, value in obs.items()}
        after = {key: value[:, 1:] for key, value in obs.items()}
        segment_start = batch["train"].int().argmax(1)  # (no gradient through the burn-in steps)
        q_all = self.module.unroll(obs, segment_start, batch["actions"], batch["prev_actions"])  # (N, W+1, ...)
        q = q_all[:, :-1].gather(-1, batch["actions"].long().unsqueeze(-1)).squeeze(-1)
        q_tot = self._mix_steps(self.module, q, now)
        with torch.no_grad():
            next_target = self.target.unroll(obs, actions=batch["actions"], previous=batch["prev_actions"])[:, 1:]
            chooser = q_all[:, 1:].detach() if self.config.double_q else next_target  # double Q: the online net
            best = self.module.allowed(chooser, after).argmax(-1, keepdim=True)
            next_tot = self._mix_steps(self.target, next_target.gather(-1, best).squeeze(-1), after)
            target = batch["rewards"] + batch["discounts"] * next_tot
        train = batch["train"].float()
        errors = nn.functional.smooth_l1_loss(q_tot, target, reduction="none") * train
        loss = (batch["weights"][:, None] * errors).sum() / train.sum().clamp(min=1.0)
        td = ((target - q_tot).detach().abs() * train).sum(1) / train.sum(1).clamp(min=1.0)
        return loss, {"loss": loss.detach(), "td_error": td}

    @staticmethod
    def _mix_steps(module: TeamQNetwork, q: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """``Q_tot`` ``(N, L)`` of per-step agent values ``q`` ``(N, L, agents)`` in the steps' states."""
        n, steps = q.shape[:2]
        flat = {key: value.reshape(n * steps, *value.shape[2:]) for key, value in obs.items()}
        return module.mix(q.reshape(n * steps, -1), flat).reshape(n, steps)


class QMIX(DQN):
    """QMIX/VDN on the shared runners and DQN's replay loop (episode windows with recurrent agents)."""

    config: QMIXConfig
    learner_class = QMIXLearner

    def setup(self) -> None:
        """The replay buffer; with recurrent agents, the sequencer cutting the runners' episodes into windows."""
        self.sequencer = EpisodeSequencer(int(self.config.model["max_seq_len"]), self.config.replay_burn_in,
                                          self.config.gamma) if self.config.agent_rnn else None
        super().setup()

    def _empty_buffer(self, key: str | None) -> object:
        """DQN's buffer, or a buffer of episode windows (capacity: ``replay_buffer_config`` capacity in steps)."""
        if self.sequencer is None:
            return super()._empty_buffer(key)
        capacity = max(1, int({**REPLAY_DEFAULTS, **self.config.replay_buffer_config}["capacity"])
                       // self.sequencer.seq_len)
        return SequenceReplayBuffer(capacity, self.obs_spec, self.sequencer.window, (self.module.agents,),
                                    np.int64, self.rng)

    def store(self, key: str | None, fragment: Any) -> None:
        """Transitions (DQN's), or the episode windows the fragment completed."""
        if self.sequencer is None:
            return super().store(key, fragment)
        windows = self.sequencer.add(fragment)
        if windows:
            self.streams[key].buffer.add(windows)
        return None
