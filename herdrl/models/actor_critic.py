"""Actor-critic: an encoder (``herdrl.models.encoders``) with a policy head for the action space's distribution
(``herdrl.models.distributions``: categorical, Gaussian, several of them for MultiDiscrete, MultiBinary and
Tuple) and a value head."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from herdrl.errors import ConfigError
from herdrl.models.distributions import ActionDistribution
from herdrl.models.encoders import LegacyNames, build_encoder, has_image, head, module_device, to_torch
from herdrl.models.numpy_policy import ACTIVATIONS, MLPBlueprint, MLPWeights, NumpyPolicy
from herdrl.obs import obs_len

logger = logging.getLogger(__name__)

#: The observation leaf that says which Discrete actions are allowed (1) and ruled out (0), as PettingZoo's
#: classic games have it: ``{"observation": ..., "action_mask": ...}``.
ACTION_MASK = "action_mask"
#: A ruled-out action's logit: its probability underflows to exactly 0 in float32, and no inf or NaN appears in
#: log-probabilities, entropies or KLs (0 * MASKED_LOGIT is 0).
MASKED_LOGIT = -1e9


def action_mask_size(observation_space: gym.Space, action_space: gym.Space) -> int | None:
    """The number of actions an ``action_mask`` observation leaf covers; None when there is none. A mask needs a
    Discrete action space of its size (ConfigError otherwise)."""
    if not (isinstance(observation_space, gym.spaces.Dict) and ACTION_MASK in observation_space.spaces):
        return None
    mask = observation_space.spaces[ACTION_MASK]
    if not isinstance(action_space, gym.spaces.Discrete) or tuple(getattr(mask, "shape", ())) != (action_space.n,):
        raise ConfigError(f"observation leaf 'action_mask' {mask} needs a Discrete action space of as many actions, "
                          f"the env has {action_space}")
    return int(action_space.n)


class ValueNormalizer(nn.Module):
    """Running mean and variance of a critic's value targets (MAPPO's value normalisation): the value head
    predicts targets standardised by them, and the critic's values are de-standardised, so GAE and bootstrapping
    see returns as they are while the head's regression target stays near unit scale whatever the rewards'."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def observe(self, targets: torch.Tensor, global_sums: Callable[[list[float]], list[float]] | None = None) -> None:
        """Merge a batch of value targets into the running statistics (``herdrl.filters.RunningStats``: Chan et
        al.'s parallel update, in float64). ``global_sums`` (learners each holding a share of the batch): sums
        over every share, so that every rank merges the whole batch's moments."""
        from herdrl.filters import RunningStats

        stats = RunningStats()
        count = float(self.count)
        stats.count, stats.mean, stats.m2 = count, self.mean.cpu().numpy(), self.var.cpu().numpy() * count
        targets = targets.detach().double().reshape(-1).cpu().numpy()
        sums = global_sums or (lambda values: values)
        # Two passes (over every share): the batch's mean, then the squared deviations from it.
        n, total = sums([float(len(targets)), float(targets.sum())])
        mean = total / n if n else 0.0
        stats.merge_parts(n, np.array(mean), np.array(sums([float(np.square(targets - mean).sum())])[0]))
        if stats.count > count:
            self.mean.fill_(float(stats.mean))
            self.var.fill_(float(stats.var))
            self.count.fill_(stats.count)

    #: The variance's floor (MAPPO's ValueNorm's): near-constant early targets must not blow the first real return
    #: up into a huge standardised target.
    MIN_VAR = 1e-2

    def std(self) -> torch.Tensor:
        """The targets' running standard deviation (floored at ``sqrt(MIN_VAR)``)."""
        return self.var.clamp_min(self.MIN_VAR).sqrt()

    def denormalize(self, head_out: torch.Tensor) -> torch.Tensor:
        """Values in return units from the head's standardised output."""
        return (head_out * self.std() + self.mean).to(head_out.dtype)


class ActorCritic(LegacyNames):
    """Policy and value networks on encoders sized by RLlib's ``model`` config keys.

    The observation space picks the encoder (MLP ``fcnet_hiddens`` for vectors, a CNN for images, one per
    leaf for Dict/Tuple). ``vf_share_layers`` puts both heads on one encoder (default: shared for image
    observations, as the Nature/CleanRL/SB3 Atari networks, separate otherwise); ``free_log_std`` (Box
    actions) learns a state-independent log std instead of a second output per action dim.
    """

    #: Weight names before encoders existed (checkpoint format <= 2) -> today's.
    LEGACY_KEYS = {"pi_body.": "pi_encoder.mlp.", "vf_body.": "vf_encoder.mlp."}

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict) -> None:
        super().__init__()
        self.dist = ActionDistribution(action_space)
        self.discrete = self.dist.discrete
        self.action_dim = int(action_space.n) if self.discrete else self.dist.action_width
        gaussian = self.dist.gaussian_dim
        self.free_log_std = bool(model_config["free_log_std"]) and gaussian > 0
        share = model_config.get("vf_share_layers")
        if share is None:  # images: one CNN for both heads; "flat" (format <= 2) never shared by default
            share = has_image(observation_space) and model_config.get("obs_encoding", "auto") != "flat"

        self.pi_encoder = build_encoder(observation_space, model_config)
        self.vf_encoder = None if share else build_encoder(observation_space, model_config)
        feature_dim = self.pi_encoder.out_dim
        head_out = self.dist.num_inputs - (gaussian if self.free_log_std else 0)
        self.pi_head = head(feature_dim, head_out, 0.01)  # small: near-uniform initial policy
        self.vf_head = head(feature_dim, 1, 1.0)
        self.log_std = nn.Parameter(torch.full((gaussian,), float(model_config.get("log_std_init", 0.0)))) \
            if self.free_log_std else None
        #: Whether observations carry an ``action_mask`` leaf that rules actions out (PettingZoo's convention).
        self.masked = action_mask_size(observation_space, action_space) is not None
        #: ``value_normalization``: the value head's targets standardised by running statistics (see
        #: :class:`ValueNormalizer`); the learners update them and scale the value loss by :meth:`value_loss_scale`.
        self.value_normalizer = ValueNormalizer() if model_config.get("value_normalization") else None

    #: The module protocol (``herdrl.models.protocol``): a plain actor-critic keeps no state.
    recurrent = False

    def initial_state(self, batch: int) -> None:
        """None: no state (see :class:`~herdrl.models.protocol.PolicyModule`)."""
        return None

    def forward_exploration(self, obs: Any, state: None = None) -> tuple[torch.Tensor, None]:
        """One acting step: (distribution inputs, no state)."""
        return self.dist_inputs(obs), None

    def forward_train(self, obs: Any, state: None = None, starts: None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(distribution inputs, values) for a batch of observations (:meth:`forward`)."""
        return self(obs)

    def forward_value(self, obs: Any, state: None = None) -> torch.Tensor:
        """The values of a batch of observations."""
        return self.value(obs)

    def greedy_step(self, obs: Any, state: None = None) -> tuple[torch.Tensor, None]:
        """The most likely actions, no state (export's and ``Policy``'s stateful call on a stateless module)."""
        return self.greedy(obs), None

    # ----------------------------------------------------------- learner side
    def forward(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (distribution inputs, values) for a batch of observations (as stored: ``herdrl.obs``)."""
        pi_features = self.pi_encoder(obs)
        vf_features = pi_features if self.vf_encoder is None else self.vf_encoder(obs)
        dist_inputs = self._with_log_std(self.pi_head(pi_features))
        return self.apply_mask(dist_inputs, obs), self.values_from_features(vf_features)

    def values_from_features(self, features: torch.Tensor) -> torch.Tensor:
        """State values from the critic's features (in return units: de-standardised with value normalisation)."""
        values = self.vf_head(features).squeeze(-1).float()
        return values if self.value_normalizer is None else self.value_normalizer.denormalize(values)

    def observe_value_targets(self, targets: torch.Tensor, values: torch.Tensor | None = None,
                              global_sums: Callable[[list[float]], list[float]] | None = None) -> Any:
        """With value normalisation, merge a batch's value targets into its statistics (before its gradient
        steps, as MAPPO does); nothing without. ``values`` (computed under the statistics as they were: PPO's old
        values, which its value clip compares with) come back as the same head outputs de-standardised by the new
        ones, so a change of statistics alone never moves a value past the clip. ``global_sums``: see
        :meth:`ValueNormalizer.observe`."""
        norm = self.value_normalizer
        if norm is None:
            return values
        mean, std = norm.mean.clone(), norm.std()
        norm.observe(targets, global_sums)
        if values is None:
            return None
        return ((values.double() - mean) / std * norm.std() + norm.mean).to(values.dtype)

    def value_loss_scale(self) -> torch.Tensor | float:
        """What the squared value error is multiplied by: 1 / the targets' variance with value normalisation (the
        error of the head's standardised output), else 1."""
        return 1.0 if self.value_normalizer is None else (1.0 / self.value_normalizer.std() ** 2).float()

    def dist_inputs(self, obs: Any) -> torch.Tensor:
        """Every parameter of the action distribution for a batch of observations: logits, or a
        Gaussian's means followed by its log stds (the free log std included, so a stored copy is frozen)."""
        return self.apply_mask(self._with_log_std(self.pi_head(self.pi_encoder(obs))), obs)

    def forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        """RLlib's RLModule call: ``{"obs": observations}`` -> ``{"action_dist_inputs": ...}`` (no gradient), for
        scripts that act with ``algo.get_module()``; a recurrent module also takes ``"state_in"`` (its initial
        state when left out) and returns ``"state_out"``."""
        with torch.no_grad():
            if not self.recurrent:
                return {"action_dist_inputs": self.dist_inputs(batch["obs"])}
            obs = batch["obs"]
            state = batch.get("state_in")
            if state is None:
                state = self.initial_state(len(next(iter(obs.values())) if isinstance(obs, dict) else obs))
            dist_inputs, state = self.forward_exploration(obs, state)
            return {"action_dist_inputs": dist_inputs, "state_out": state}

    def load_state_dict(self, state_dict: dict, strict: bool = True, assign: bool = False) -> Any:
        """As torch's (old names too), with value normalisation's statistics optional: a checkpoint written without
        it starts them fresh, one written with it, read by a run without it, leaves them out (the head's weights
        then read in the units it learned them in: a warning says so)."""
        prefix = "value_normalizer."
        saved = any(key.startswith(prefix) for key in state_dict)
        if self.value_normalizer is None and saved:
            logger.warning("herdrl: the checkpoint's critic was trained with value_normalization, this run has it "
                           "off: its value head's outputs are standardised returns until it relearns them")
            state_dict = {key: value for key, value in state_dict.items() if not key.startswith(prefix)}
        elif self.value_normalizer is not None and not saved:
            state_dict = {**state_dict, **{prefix + key: value for key, value in
                                           ValueNormalizer().state_dict().items()}}
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def apply_mask(self, logits: torch.Tensor, obs: Any) -> torch.Tensor:
        """Logits of the actions an ``action_mask`` leaf rules out set to :data:`MASKED_LOGIT` (probability 0:
        never sampled, never greedy, no part of the entropy); the logits as they are without a mask."""
        if not self.masked:
            return logits
        return logits.masked_fill(obs[ACTION_MASK] == 0, MASKED_LOGIT)

    def _with_log_std(self, head_out: torch.Tensor) -> torch.Tensor:
        # float32 even under bf16 autocast: log-probabilities and their ratios need its precision.
        head_out = head_out.float()
        # The free log std is appended to the head's output rather than read from the live parameter later:
        # distribution inputs kept from before an update (TRPO's old policy, PPO's behaviour policy) must
        # describe that distribution, not the one the parameter describes now.
        if not self.free_log_std:
            return head_out
        return torch.cat([head_out, self.log_std.expand(*head_out.shape[:-1], -1)], dim=-1)

    def value(self, obs: Any) -> torch.Tensor:
        """State values V(obs)."""
        encoder = self.pi_encoder if self.vf_encoder is None else self.vf_encoder
        return self.values_from_features(encoder(obs))

    @staticmethod
    def _mean_log_std(dist_inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A Box action space's Gaussian means and log stds."""
        mean, log_std = dist_inputs.chunk(2, dim=-1)
        return mean, log_std

    def log_prob_entropy(self, dist_inputs: torch.Tensor,
                         actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability of stored ``actions`` and the entropy, per sample."""
        return self.dist.log_prob_entropy(dist_inputs, actions)

    def kl(self, old_inputs: torch.Tensor, new_inputs: torch.Tensor) -> torch.Tensor:
        """KL(old || new) per sample, between the distributions two sets of head outputs describe."""
        return self.dist.kl(old_inputs, new_inputs)

    def policy_parameters(self) -> list[nn.Parameter]:
        """The parameters that shape the action distribution (body, head, free log std)."""
        params = [*self.pi_encoder.parameters(), *self.pi_head.parameters()]
        return params + ([self.log_std] if self.log_std is not None else [])

    def value_parameters(self) -> list[nn.Parameter]:
        """The value function's own parameters (its head only when the encoder is shared)."""
        body = [] if self.vf_encoder is None else list(self.vf_encoder.parameters())
        return body + list(self.vf_head.parameters())

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The most likely action (index, or the Gaussian's mean) for a batch of observations."""
        return self.act_with_noise(self.dist_inputs(obs), None)

    def act_with_noise(self, dist_inputs: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """Stored actions from distribution inputs and pre-drawn noise (``None``: the most likely action).

        ``noise`` is what the distribution's ``draw_noise`` draws: Gumbel noise for logits (argmax of logits +
        Gumbel samples the softmax), standard normal for Gaussians. Runners draw it from their own seeded generator.
        """
        return self.dist.act_with_noise(dist_inputs, noise)

    @torch.no_grad()
    def act(self, obs: Any, explore: bool = True) -> torch.Tensor:
        """Sample (``explore``, with torch's global generator) or pick the most likely action."""
        dist_inputs = self.dist_inputs(obs)
        return self.act_with_noise(dist_inputs, self.torch_noise(dist_inputs) if explore else None)

    def torch_noise(self, dist_inputs: torch.Tensor) -> torch.Tensor:
        """Exploration noise for ``act_with_noise`` from torch's global generator (Gumbel, then normal)."""
        lead = dist_inputs.shape[:-1]
        gumbel = -torch.log(-torch.log(torch.rand(*lead, self.dist.num_logits).clamp_min(1e-12)))
        return torch.cat([gumbel, torch.randn(*lead, self.dist.gaussian_dim)], -1).to(dist_inputs.device)


class CentralCriticActorCritic(ActorCritic):
    """MAPPO's network: the actor reads the agent's own observation, the critic that and the global state
    (``herdrl.multi_agent.with_global_state``: the observation space holds both; the MAPPO paper's agent-specific
    global state). The actor's weights are named as a plain :class:`ActorCritic`'s; the critic has its own encoder
    (never shared: the two read different inputs)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict) -> None:
        actor_space = self.own_space(observation_space)
        super().__init__(actor_space, action_space, {**model_config, "vf_share_layers": False})
        self.vf_encoder = build_encoder(observation_space, model_config)
        self.vf_head = head(self.vf_encoder.out_dim, 1, 1.0)
        self._wrapped = own_wrapper(actor_space)

    @staticmethod
    def own_space(observation_space: gym.Space) -> gym.Space:
        """The agent's own observation space inside one with the global state (ConfigError without it)."""
        from herdrl.multi_agent import GLOBAL_STATE, actor_observation_space

        actor_space = actor_observation_space(observation_space)
        if actor_space is observation_space:
            raise ConfigError(f"a centralised critic needs the observation with its '{GLOBAL_STATE}' leaf, got "
                              f"{observation_space}")
        return actor_space

    def actor_input(self, obs: Any) -> Any:
        """The agent's own observation out of one with the global state (an observation without it as it is:
        a trained actor acts on its own observations alone, in evaluation and export)."""
        return own_observation(obs, self._wrapped)

    def forward(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(distribution inputs from the actor's view, values from the critic's)."""
        return self.dist_inputs(obs), self.value(obs)

    def dist_inputs(self, obs: Any) -> torch.Tensor:
        """The actor's distribution inputs, from the agent's own observation."""
        return super().dist_inputs(self.actor_input(obs))

    def value(self, obs: Any) -> torch.Tensor:
        """V(own observation, global state)."""
        return self.values_from_features(self.vf_encoder(obs))


def own_wrapper(actor_space: gym.Space) -> str | None:
    """The key an agent's own observation sits under beside the global state (None: a Dict's own leaves)."""
    from herdrl.multi_agent import OWN_OBSERVATION

    return OWN_OBSERVATION if not isinstance(actor_space, gym.spaces.Dict) else None


def own_observation(obs: Any, wrapped: str | None) -> Any:
    """The agent's own observation out of one with the global state (see :func:`own_wrapper`); one without it as
    it is."""
    from herdrl.multi_agent import GLOBAL_STATE

    if not isinstance(obs, dict) or GLOBAL_STATE not in obs:
        return obs
    if wrapped is not None:
        return obs[wrapped]
    return {key: value for key, value in obs.items() if key != GLOBAL_STATE}


class TorchPolicy:
    """Runner-side policy for modules without a numpy twin: torch inference, same interface as NumpyPolicy.

    Noise comes from the runner's seeded numpy generator, as for NumpyPolicy, so seeded runs reproduce on
    any process and a restarted runner does not replay its predecessor's draws.
    """

    def __init__(self, module: ActorCritic, rng: np.random.Generator) -> None:
        self.module = module
        self.rng = rng
        self.device = module_device(module)  # a GPU with num_gpus_per_env_runner: data crosses once each way

    def noise(self, steps: int, batch: int) -> np.ndarray:
        """Exploration noise for a whole fragment (see :meth:`ActionDistribution.draw_noise`)."""
        return self.module.dist.draw_noise(self.rng, steps, batch)

    @torch.inference_mode()
    def act(self, obs: Any, explore: bool = True, noise: np.ndarray | None = None) -> np.ndarray:
        """Actions for a batch of stored observations (``noise``: one step of :meth:`noise`): one forward pass."""
        if explore and noise is None:
            noise = self.noise(1, obs_len(obs))[0]
        dist_inputs = self.module.dist_inputs(to_torch(obs, self.device))
        noise = torch.from_numpy(noise).to(self.device) if explore else None
        return self.module.act_with_noise(dist_inputs, noise).cpu().numpy()

    @torch.inference_mode()
    def act_logp(self, obs: Any, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sampled actions and their log-probabilities under this policy (the behaviour policy V-trace needs)."""
        dist_inputs = self.module.dist_inputs(to_torch(obs, self.device))
        actions = self.module.act_with_noise(dist_inputs, torch.from_numpy(noise).to(self.device))
        return actions.cpu().numpy(), self.module.log_prob_entropy(dist_inputs, actions)[0].cpu().numpy()


def mlp_blueprint(module: nn.Module, encoder: nn.Module, head: nn.Linear, *, kind: str, action_dim: int,
                  log_std: nn.Parameter | None = None, params: dict[str, Any] | None = None) -> MLPBlueprint | None:
    """``head(encoder(obs))`` of ``module`` as an :class:`MLPBlueprint` (keys: ``module``'s state-dict keys), for an
    MLP on one Box or Discrete leaf with a tanh, relu or linear activation, on the CPU; None for anything else
    (CNNs, Dict observations, custom encoders, a runner's GPU: those act in torch)."""
    spec = encoder.numpy_input_spec()
    if spec is None or encoder.activation not in ACTIVATIONS or head.weight.device.type != "cpu":
        return None
    names = {id(p): name for name, p in module.named_parameters()}
    linears = [m for m in encoder.mlp if isinstance(m, nn.Linear)]
    return MLPBlueprint(
        input=spec, activation=encoder.activation,
        layers=tuple((names[id(m.weight)], names[id(m.bias)]) for m in linears),
        head=(names[id(head.weight)], names[id(head.bias)]), log_std=None if log_std is None else names[id(log_std)],
        action_dim=action_dim, shapes={name: tuple(p.shape) for name, p in module.named_parameters()}, kind=kind,
        params=params or {})


def box_scaling(module: nn.Module) -> dict[str, list[float]]:
    """A tanh actor's scaling into its Box (``action_scale``, ``action_bias`` buffers) as blueprint params."""
    return {"scale": module.action_scale.cpu().tolist(), "bias": module.action_bias.cpu().tolist()}


def weight_views(module: nn.Module, blueprint: MLPBlueprint) -> MLPWeights:
    """The blueprint's MLP on views of ``module``'s weights: loading the module updates it."""
    state = module.state_dict(keep_vars=True)
    return MLPWeights(blueprint, {key: state[key].detach().numpy() for key in blueprint.keys()})


def numpy_blueprint(module: nn.Module) -> MLPBlueprint | None:
    """An :class:`ActorCritic`'s numpy twin as plain data: an MLP (see :func:`mlp_blueprint`), Discrete or Box
    actions, no action mask, no LSTM; None for anything else (its runners act in torch)."""
    if not isinstance(module, ActorCritic) or isinstance(module, CentralCriticActorCritic) \
            or getattr(module, "recurrent", False) or module.masked \
            or len(module.dist.parts) != 1 or not (module.dist.discrete or not module.dist.num_logits):
        return None
    return mlp_blueprint(module, module.pi_encoder, module.pi_head, kind="actor_critic", action_dim=module.action_dim,
                         log_std=module.log_std)


def numpy_twin(module: nn.Module, rng: np.random.Generator) -> NumpyPolicy | None:
    """A :class:`NumpyPolicy` on views of ``module``'s weights (loading the module updates it); None where
    ``module`` has no numpy twin."""
    blueprint = numpy_blueprint(module)
    return None if blueprint is None else NumpyPolicy(weight_views(module, blueprint), module.dist, rng)
