"""Several agents, several policies: which agent plays which policy, and the module that holds them all.

``.multi_agent(policies=..., policy_mapping_fn=..., policies_to_train=...)`` takes RLlib's names:

* ``policies``: policy ids (``{"main", "opponent"}``), or a dict ``id -> None`` or ``id -> {"observation_space":
  ..., "action_space": ..., "config": {...}}`` (spaces default to those of the agents the policy plays; ``config``:
  this policy's own learning keys, e.g. ``{"lr": 1e-4}`` or a schedule) or ``id -> PolicySpec(...)`` (RLlib's);
* ``policy_mapping_fn(agent_id, episode, **kwargs) -> policy id``, called when an agent first appears in an
  episode (its policy is kept for the episode); ``episode`` is an :class:`EpisodeInfo`. Instead of a function:
  ``"shared"`` (every agent plays the one policy: parameter sharing), ``"per_agent"`` (each agent its own
  policy, named as the agent; without ``policies``, those policies are made, with each agent's spaces),
  ``"self_play"`` (below) or a dict ``agent_id -> policy id``. Default: the one
  policy if there is one, else ``"per_agent"`` when the policy ids are the agent ids;
* ``policies_to_train``: the policies that learn (default: all but self-play snapshots); the others act with the
  weights they have (fixed opponents, frozen snapshots).

Self-play: ``self_play={"main": ["main_v1", "main_v2"]}`` copies ``main``'s weights into ``main_v1`` every
``self_play_interval`` iterations, after moving ``main_v1``'s into ``main_v2`` (the newest snapshots, oldest
last); map opponents to the snapshots to train against earlier versions of yourself. The mapping ``"self_play"``
does that for the one policy of ``self_play``: in episode ``i`` of an env copy, agent ``i % n`` (of the env's
``n`` possible agents) plays the learning policy, so it plays every side in turn, and the other agents play
snapshot ``(i // n) % len(snapshots)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from torch import nn

from herdrl.errors import ConfigError

#: The policy a multi-agent run gets when it names none (RLlib's name).
DEFAULT_POLICY = "default_policy"
MAPPING_NAMES = ("shared", "per_agent", "self_play")


#: Centralised critics (``centralized_critic=True``, MAPPO): the observation leaf holding the global state, beside
#: the agent's own leaves (a Dict observation's) or beside ``"own_observation"`` (any other observation).
GLOBAL_STATE, OWN_OBSERVATION = "global_state", "own_observation"


def with_global_state(space: gym.Space, state_space: gym.Space) -> gym.spaces.Dict:
    """An agent's observation space with the global state beside it: what a centralised critic's policy stores
    and its critic reads (its actor reads :func:`actor_observation_space`)."""
    if isinstance(space, gym.spaces.Dict):
        if GLOBAL_STATE in space.spaces or list(space.spaces) == [OWN_OBSERVATION]:
            raise ConfigError(f"centralized_critic: the agents' observations have a leaf named '{GLOBAL_STATE}' or "
                              f"only '{OWN_OBSERVATION}', the names it gives the global state and the agent's own")
        return gym.spaces.Dict({**space.spaces, GLOBAL_STATE: state_space})
    return gym.spaces.Dict({OWN_OBSERVATION: space, GLOBAL_STATE: state_space})


def actor_observation_space(space: gym.Space) -> gym.Space:
    """The agent's own observation space inside one :func:`with_global_state` made (any other space as it is)."""
    if not (isinstance(space, gym.spaces.Dict) and GLOBAL_STATE in space.spaces):
        return space
    rest = {key: sub for key, sub in space.spaces.items() if key != GLOBAL_STATE}
    return rest[OWN_OBSERVATION] if list(rest) == [OWN_OBSERVATION] else gym.spaces.Dict(rest)


class OwnObservationNormalizer:
    """A centralised critic's run keeps its observation statistics on the observation with the global state beside
    the agent's own (:func:`with_global_state`); its actor acts on the agent's own observation alone. This reads
    the run's statistics (live: the same object) for those leaves, named as the own observation names them (an
    own observation that is not a Dict sits under ``own_observation`` in the run's)."""

    def __init__(self, normalizer: Any, actor_space: gym.Space) -> None:
        from herdrl.obs import leaf_spaces

        self.run, self.clip_obs = normalizer, normalizer.clip_obs
        self.leaves = list(leaf_spaces(actor_space))
        self.single = self.leaves == [""]

    @property
    def observations(self) -> bool:
        """Whether the observations are filtered."""
        return self.run.observations

    @staticmethod
    def _run_name(leaf: str) -> str:
        return f"{OWN_OBSERVATION}/{leaf}" if leaf else OWN_OBSERVATION

    def normalize(self, obs: Any) -> Any:
        """The agent's own raw observations (stored form, any leading dims) as its actor reads them."""
        if self.single:
            return self.run.normalize({OWN_OBSERVATION: obs})[OWN_OBSERVATION]
        done = self.run.normalize({self._run_name(leaf): value for leaf, value in obs.items()})
        return {leaf: done[self._run_name(leaf)] for leaf in obs}

    def _obs_scales(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """(mean, 1/std) per filtered leaf of the own observation (as :class:`herdrl.filters.Normalizer`'s)."""
        scales = self.run._obs_scales()
        return {leaf: scales[self._run_name(leaf)] for leaf in self.leaves if self._run_name(leaf) in scales}


def actor_normalizer(normalizer: Any, space: gym.Space) -> Any:
    """The statistics a policy's actor normalises its own observations with, out of the run's on ``space`` (a
    policy's observation space; the run's own normaliser where the actor reads the same leaves by the same
    names: no centralised critic, or an own observation that is a Dict beside the global state)."""
    if normalizer is None or not (isinstance(space, gym.spaces.Dict) and OWN_OBSERVATION in space.spaces
                                  and GLOBAL_STATE in space.spaces):
        return normalizer
    return OwnObservationNormalizer(normalizer, actor_observation_space(space))


def with_state_value(raw: Any, state: np.ndarray, space: gym.Space) -> dict[str, Any]:
    """An agent's raw observation with the global state beside it, as :func:`with_global_state` lays it out."""
    if isinstance(space, gym.spaces.Dict):
        return {**raw, GLOBAL_STATE: state}
    return {OWN_OBSERVATION: raw, GLOBAL_STATE: state}


class PolicySpec(NamedTuple):
    """RLlib's policy spec: ``PolicySpec(config={"lr": 1e-4})``; ``policy_class`` must be None (herdrl builds the
    algorithm's own policy)."""

    policy_class: Any = None
    observation_space: gym.Space | None = None
    action_space: gym.Space | None = None
    config: dict[str, Any] | None = None


#: Keys a policy's ``config`` may not set: what all policies share (how the batch is cut, what runners step).
SHARED_KEYS = ("train_batch_size", "train_batch_size_per_learner", "minibatch_size", "num_epochs", "model",
               # the networks runners build (by the run's config), the runners' exploration, an iteration's
               # sampling and what checkpoints keep: one for the run
               "twin_q", "dueling", "exploration_noise", "min_sample_timesteps_per_iteration",
               "store_buffer_in_checkpoints",
               # the policy network's own shape (value normalisation's statistics are part of its weights)
               "value_normalization")


def policy_config(config: Any, pid: str) -> Any:
    """The config policy ``pid`` learns with: the run's, with the policy's own ``config`` keys (checked)."""
    overrides = (config.policies or {}).get(pid, {}).get("config") or {}
    if not overrides:
        return config
    own = config.copy()
    fields = own.fields()
    for key, value in overrides.items():
        name = own.aliases().get(key, key)
        field = fields.get(name)
        if field is None or field.group != "training" or name in SHARED_KEYS:
            why = "is not a config key" if field is None else "is shared by every policy of the run"
            raise ConfigError(f"policy '{pid}' config key '{key}' {why}; a policy's config takes the algorithm's "
                              f"learning keys (lr, gamma, entropy_coeff, replay_buffer_config, ...) but not "
                              f"{', '.join(SHARED_KEYS)}")
        own._values[name] = field.check(f"policy '{pid}' {key}", value)
    own.schedules()  # a named decay without steps: one line
    return own


@dataclass(frozen=True)
class EpisodeInfo:
    """What a ``policy_mapping_fn`` learns about the episode an agent appears in. ``id_`` is unique in the run and
    the same in a rerun with the same seed; ``episode_index % 2`` alternates sides between episodes."""

    id_: str
    worker_index: int  # the runner (0: in the driver)
    env_index: int  # the env copy within the runner
    episode_index: int  # episodes this env copy began before this one


def normalize_policies(policies: Any) -> dict[str, dict[str, Any]]:
    """``policies`` in any accepted form -> ``{id: {"observation_space": ..., "action_space": ...}}`` (spaces
    only where given); ConfigError for anything else."""
    if isinstance(policies, (set, frozenset, list, tuple)):
        policies = {pid: None for pid in policies}
    if not isinstance(policies, dict) or not policies:
        raise ConfigError(f"config key 'policies' got {policies!r}; expected policy ids (a set or list of names) or "
                          "a dict id -> None or {'observation_space': ..., 'action_space': ...}")
    out: dict[str, dict[str, Any]] = {}
    for pid, spec in policies.items():
        if not isinstance(pid, str) or not pid or "." in pid or "/" in pid:
            raise ConfigError(f"policy id {pid!r} must be a non-empty string without '.' or '/'")
        spec = {} if spec is None else spec
        if isinstance(spec, tuple) and not isinstance(spec, PolicySpec) and len(spec) == 4:
            spec = PolicySpec(*spec)  # RLlib's (policy_class, observation_space, action_space, config)
        if isinstance(spec, PolicySpec):
            if spec.policy_class is not None:
                raise ConfigError(f"policy '{pid}': PolicySpec(policy_class=...) is not taken; herdrl builds "
                                  "the algorithm's own policy (bring a network with herdrl.register_encoder)")
            spec = {k: v for k, v in spec._asdict().items() if k != "policy_class" and v is not None}
        if not isinstance(spec, dict) or set(spec) - {"observation_space", "action_space", "config"}:
            raise ConfigError(f"policy '{pid}' got spec {spec!r}; expected None, PolicySpec(...) or a dict with "
                              "observation_space, action_space and/or config")
        for key, space in spec.items():
            if key != "config" and space is not None and not isinstance(space, gym.Space):
                raise ConfigError(f"policy '{pid}' {key} got {space!r}; expected a gymnasium space")
        if spec.get("config") is not None and not isinstance(spec["config"], dict):
            raise ConfigError(f"policy '{pid}' config got {spec['config']!r}; expected a dict of learning keys")
        out[pid] = {key: value for key, value in spec.items() if value is not None and value != {}}
    return out


def agent_ids(env: Any, env_config: dict | None = None) -> list[str]:
    """The possible agents of a multi-agent env (one copy made to ask, then closed): the policies
    ``policy_mapping_fn="per_agent"`` makes when no ``policies`` are given."""
    from herdrl.env.multi_agent import make_agent_env

    agent_env = make_agent_env(env, env_config)
    try:
        return list(agent_env.possible_agents)
    finally:
        agent_env.close()


def trained_policies(config: Any) -> list[str]:
    """The ids of the policies that learn, sorted: every learner updates them in this order."""
    policies = config.policies or {}
    if config.policies_to_train is not None:
        return sorted(config.policies_to_train)
    snapshots = {pid for copies in (config.self_play or {}).values() for pid in copies}
    return sorted(pid for pid in policies if pid not in snapshots)


def validate_multi_agent(config: Any) -> None:
    """Cross-key rules of ``.multi_agent()``; normalises ``policies`` in place."""
    if not getattr(config, "supports_multi_agent", False):
        raise ConfigError(f"{config.algo_name} does not train multi-agent runs: use PPO, A2C, TRPO, IMPALA, APPO, "
                          "DQN, SAC, TD3 or DDPG")
    config._values["policies"] = policies = normalize_policies(config.policies)
    mapping = config.policy_mapping_fn
    if not (mapping is None or callable(mapping) or mapping in MAPPING_NAMES or isinstance(mapping, dict)):
        raise ConfigError(f"config key 'policy_mapping_fn' got {mapping!r}; expected a function (agent_id, episode, "
                          "**kwargs) -> policy id, a dict agent_id -> policy id, 'shared' or 'per_agent'")
    if mapping == "shared" and len(policies) != 1:
        raise ConfigError(f"policy_mapping_fn='shared' needs exactly one policy, got {sorted(policies)}")
    if mapping == "self_play" and len(config.self_play or {}) != 1:
        raise ConfigError("policy_mapping_fn='self_play' needs self_play={policy: [snapshot, ...]} with one policy")
    names = config.policies_to_train
    if names is not None and not set(names) <= set(policies):
        raise ConfigError(f"config key 'policies_to_train' got {names!r}; expected a list of policy ids from "
                          f"{sorted(policies)}")
    if names is not None:
        config._values["policies_to_train"] = sorted(names)  # JSON (checkpoints) has no sets
    for source, copies in (config.self_play or {}).items():
        copies = [copies] if isinstance(copies, str) else copies
        unknown = [pid for pid in [source, *copies] if pid not in policies]
        if unknown or not copies:
            raise ConfigError(f"self_play {source!r}: {list(copies)!r} must name policies of 'policies' "
                              f"({sorted(policies)}): the policy that learns -> its snapshots")
        config._values["self_play"][source] = list(copies)
    if not trained_policies(config):
        raise ConfigError("no policy to train: policies_to_train is empty (or every policy is a snapshot)")
    if config.model["lstm_use_prev_action"] or config.model["lstm_use_prev_reward"]:
        raise ConfigError("model lstm_use_prev_action/lstm_use_prev_reward are not built for multi-agent runs yet")
    if config.centralized_critic and not getattr(config, "supports_centralized_critic", False):
        raise ConfigError(f"centralized_critic=True is for PPO (MAPPO), A2C and TRPO, not {config.algo_name}")
    for pid in policies:
        policy_config(config, pid)  # each policy's own keys are known learning keys with good values


class PolicyMapper:
    """``policy_mapping_fn`` in any of its forms, checked at each call."""

    def __init__(self, mapping: Any, policies: list[str], agents: list[str],
                 self_play: dict[str, list[str]] | None = None) -> None:
        self.policies, self.agents = policies, agents
        self.self_play = next(iter((self_play or {}).items()), None)
        if mapping is None:
            if len(policies) == 1:
                mapping = "shared"
            elif set(agents) <= set(policies):
                mapping = "per_agent"
            else:
                raise ConfigError(f"{len(policies)} policies {sorted(policies)} for agents {agents}: set "
                                  "policy_mapping_fn (a function, a dict agent -> policy, or 'per_agent')")
        self.mapping = mapping
        self._worker_kwarg = callable(mapping) and _takes(mapping, "worker")

    def __call__(self, agent: str, episode: EpisodeInfo) -> str:
        """The policy ``agent`` plays in ``episode``."""
        if self.mapping == "shared":
            pid = self.policies[0]
        elif self.mapping == "per_agent":
            pid = agent
        elif self.mapping == "self_play":
            learner, snapshots = self.self_play
            turn, n = episode.episode_index, len(self.agents)
            pid = learner if self.agents.index(agent) == turn % n else snapshots[(turn // n) % len(snapshots)]
        elif isinstance(self.mapping, dict):
            pid = self.mapping.get(agent)
        else:
            kwargs = {"worker": None} if self._worker_kwarg else {}
            pid = self.mapping(agent, episode, **kwargs)
        if pid not in self.policies:
            raise ConfigError(f"policy_mapping_fn mapped agent {agent!r} to {pid!r}, which is not a policy; "
                              f"policies: {sorted(self.policies)}")
        return pid


def _takes(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def policy_spaces(config: Any, env: Any) -> tuple[dict[str, gym.Space], dict[str, gym.Space]]:
    """Each policy's (observation space, action space): given in its spec, else those of the agents it plays
    (asked of the mapping with a probe episode); all agents of one policy must share them."""
    policies = config.policies
    mapper = PolicyMapper(config.policy_mapping_fn, list(policies), env.possible_agents, config.self_play)
    probe = EpisodeInfo("probe", 0, 0, 0)
    found: dict[str, tuple[str, gym.Space, gym.Space]] = {}
    for agent in env.possible_agents:
        pid = mapper(agent, probe)
        spaces = (env.observation_space(agent), env.action_space(agent))
        if pid in found and found[pid][1:] != spaces and not {"observation_space", "action_space"} & set(policies[pid]):
            raise ConfigError(f"agents {found[pid][0]!r} and {agent!r} both map to policy {pid!r} but have different "
                              "spaces: map them to separate policies, or give the policy its spaces")
        found.setdefault(pid, (agent, *spaces))
    agent_spaces: list[tuple[gym.Space, gym.Space]] = []
    for agent in env.possible_agents:
        spaces = (env.observation_space(agent), env.action_space(agent))
        if spaces not in agent_spaces:
            agent_spaces.append(spaces)
    obs_spaces, act_spaces = {}, {}
    for pid, spec in policies.items():
        if pid in found:
            _, obs, act = found[pid]
        elif len(agent_spaces) == 1:  # a policy no probe reached (an opponent picked per episode): any agent's
            obs, act = agent_spaces[0]
        elif {"observation_space", "action_space"} <= set(spec):
            obs, act = spec["observation_space"], spec["action_space"]
        else:
            raise ConfigError(f"policy {pid!r}: no agent maps to it in a probe episode and the agents' spaces "
                              "differ: give it {'observation_space': ..., 'action_space': ...}")
        obs_spaces[pid] = spec.get("observation_space", obs)
        act_spaces[pid] = spec.get("action_space", act)
    return obs_spaces, act_spaces


class MultiAgentModule(nn.ModuleDict):
    """One module per policy, by policy id; its weights are named ``<policy id>.<weight>``."""

    recurrent = False
