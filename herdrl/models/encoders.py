"""Encoders: a batch of observations of any space -> a batch of feature vectors. Models are encoder + heads.

The observation space picks the encoder (one place decides, for every algorithm):

* each **image** leaf (a Box of rank 3, HWC or CHW, or a uint8/bool Box of rank 2 — a single channel) goes
  through a CNN: the Nature-DQN stack for frames of 36 pixels and more, a small one (MinAtar's) below,
  ``conv_filters`` to choose your own, ``conv_type="impala"`` for the IMPALA ResNet; then the dense layers
  ``post_fcnet_hiddens`` (default: 512 Nature, 256 IMPALA, 128 small);
* every other leaf is flattened: floats as they are, integer/bool Boxes scaled into [0, 1] by their bounds
  (RAM bytes / 255), Discrete and MultiDiscrete one-hot, MultiBinary as 0/1;
* the leaves' features are concatenated and go through the MLP ``fcnet_hiddens`` — except when the whole
  observation is one image, where the CNN and its dense layers are the encoder (the Nature network).

Observations arrive as stored (``herdrl.obs``): uint8 frames are converted to floats here, on the device the
module lives on. ``custom_encoder`` swaps all of this for your own module (see :func:`herdrl.register_encoder`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from herdrl.obs import IMAGE_MIN_SIDE, image_layout, leaf_spaces, nest  # noqa: F401 - names used here before
from herdrl.registry import ENCODERS

ACTIVATION_MODULES: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU,
    "silu": nn.SiLU, "swish": nn.SiLU, "linear": nn.Identity,
}
NATURE_FILTERS = [[32, 8, 4], [64, 4, 2], [64, 3, 1]]  # Mnih et al. 2015, as SB3 and CleanRL
SMALL_FILTERS = [[16, 3, 1]]  # Young & Tian 2019 (MinAtar)
NATURE_MIN_SIDE = 36  # the Nature stack needs at least 36 x 36 pixels
IMPALA_CHANNELS = [16, 32, 32]  # Espeholt et al. 2018

# ------------------------------------------------------------------------------------ spaces
#: Integer observations are scaled into [0, 1] by their bounds only when the range is at most this (RAM bytes,
#: pixel values); wider ones (counters, ids declared up to 2**63) go in as they are.
MAX_SCALED_RANGE = 2**16


def _pixel_scale(space: gym.Box) -> float:
    """What one pixel value is divided by: the Box's high for integer frames with a small finite range (uint8
    0-255: 255), 1 for floats and bools (taken as they come)."""
    if np.issubdtype(space.dtype, np.floating) or space.dtype == np.bool_:
        return 1.0
    high = float(np.max(space.high))
    return high if np.isfinite(high) and 0 < high <= MAX_SCALED_RANGE else 1.0


def encoding_differs(space: gym.Space) -> bool:
    """Whether today's encoders read ``space`` differently from checkpoint format <= 2's flat encoding (an image
    leaf gets a CNN, an integer Box leaf is scaled)."""
    return any(image_layout(leaf) is not None or (isinstance(leaf, gym.spaces.Box) and leaf.dtype != np.bool_
                                                   and not np.issubdtype(leaf.dtype, np.floating))
               for leaf in leaf_spaces(space).values())


def has_image(space: gym.Space) -> bool:
    """Whether any leaf of ``space`` is an image (the CNN path)."""
    return any(image_layout(leaf) is not None for leaf in leaf_spaces(space).values())


def _init(layer: nn.Module, gain: float = math.sqrt(2)) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def head(in_dim: int, out_dim: int, gain: float) -> nn.Linear:
    """An output layer: orthogonal init with ``gain`` (0.01 for a near-uniform initial policy), zero bias."""
    return _init(nn.Linear(in_dim, out_dim), gain)


def mlp_body(in_dim: int, hiddens: list[int], activation: str) -> nn.Sequential:
    """Linear + activation layers; orthogonal init (gain sqrt 2), zero biases."""
    layers: list[nn.Module] = []
    for size in hiddens:
        layers += [_init(nn.Linear(in_dim, size)), ACTIVATION_MODULES[activation]()]
        in_dim = size
    return nn.Sequential(*layers)


# ------------------------------------------------------------------------------------ leaves
class _Flatten(nn.Module):
    """A non-image leaf -> float features (no parameters); ``scale=False`` takes integer Boxes as they are."""

    def __init__(self, space: gym.Space, scale: bool = True) -> None:
        super().__init__()
        self.kind = type(space).__name__
        if isinstance(space, gym.spaces.Discrete):
            self.n = self.out_dim = int(space.n)
            self.register_buffer("offset", torch.tensor(int(space.start)), persistent=False)
        elif isinstance(space, gym.spaces.MultiDiscrete):
            nvec = np.asarray(space.nvec).reshape(-1)
            self.sizes = [int(n) for n in nvec]
            self.out_dim = int(nvec.sum())
            self.register_buffer("offset", torch.as_tensor(np.asarray(space.start).reshape(-1), dtype=torch.long),
                                 persistent=False)
        else:
            self.out_dim = int(np.prod(space.shape))
            self.scaled = False
            if scale and isinstance(space, gym.spaces.Box) and not np.issubdtype(space.dtype, np.floating) \
                    and space.dtype != np.bool_:
                # Integer Box (RAM bytes): into [0, 1] by its bounds, dimension by dimension, where the range is
                # small; other dimensions (counters, ids, unbounded) as they are.
                low, high = space.low.astype(np.float64).reshape(-1), space.high.astype(np.float64).reshape(-1)
                small = np.isfinite(low) & np.isfinite(high) & (high > low) & (high - low <= MAX_SCALED_RANGE)
                self.scaled = bool(small.any())
                offset, inv_range = np.where(small, low, 0.0), np.where(small, 1.0 / np.where(small, high - low, 1.0),
                                                                         1.0)
                self.register_buffer("low", torch.tensor(offset, dtype=torch.float32), persistent=False)
                self.register_buffer("inv_range", torch.tensor(inv_range, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "Discrete":
            return nn.functional.one_hot(x.long() - self.offset, self.n).float()
        if self.kind == "MultiDiscrete":
            index = (x.reshape(x.shape[0], -1).long() - self.offset).unbind(-1)
            return torch.cat([nn.functional.one_hot(i, n).float() for i, n in zip(index, self.sizes, strict=True)], -1)
        x = x.reshape(x.shape[0], -1).float()
        return (x - self.low) * self.inv_range if self.scaled else x


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = _init(nn.Conv2d(channels, channels, 3, padding=1))
        self.conv1 = _init(nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def _impala_stack(in_channels: int) -> nn.Sequential:
    """IMPALA's ResNet: per stage a 3x3 conv, a 3x3 max-pool of stride 2 and two residual blocks."""
    layers: list[nn.Module] = []
    for channels in IMPALA_CHANNELS:
        layers += [_init(nn.Conv2d(in_channels, channels, 3, padding=1)), nn.MaxPool2d(3, 2, padding=1),
                   _Residual(channels), _Residual(channels)]
        in_channels = channels
    return nn.Sequential(*layers, nn.ReLU())


def _conv_stack(in_channels: int, filters: list, activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for spec in filters:
        out, kernel, stride = spec[0], spec[1], spec[2]
        padding = spec[3] if len(spec) > 3 else 0
        layers += [_init(nn.Conv2d(in_channels, out, kernel, stride, padding)), ACTIVATION_MODULES[activation]()]
        in_channels = out
    return nn.Sequential(*layers)


class ImageEncoder(nn.Module):
    """One image leaf -> features: a CNN, flattened, then dense layers. Takes uint8/bool/float frames, HWC or CHW."""

    def __init__(self, space: gym.Box, model_config: dict) -> None:
        super().__init__()
        channels, height, width, self.layout = image_layout(space)
        self.shape = (channels, height, width)
        self.scale = 1.0 / _pixel_scale(space)
        filters = model_config.get("conv_filters")
        impala = model_config.get("conv_type", "default") == "impala"
        if impala:
            self.convs = _impala_stack(channels)
            dense = [256]
        else:
            if filters is None:
                filters = NATURE_FILTERS if min(height, width) >= NATURE_MIN_SIDE else SMALL_FILTERS
            self.convs = _conv_stack(channels, filters, model_config.get("conv_activation", "relu"))
            dense = [512] if filters is NATURE_FILTERS else [128] if filters is SMALL_FILTERS else []
        post = model_config.get("post_fcnet_hiddens")
        dense = list(dense if post is None else post)
        with torch.no_grad():
            try:
                flat = self.convs(torch.zeros(1, channels, height, width)).numel()
            except RuntimeError as exc:
                from herdrl.errors import ConfigError

                raise ConfigError(f"conv_filters {filters} do not fit images of {height} x {width} pixels "
                                  f"({str(exc).splitlines()[0]}); use fewer or smaller filters") from None
        self.dense = mlp_body(flat, dense, model_config.get("conv_activation", "relu"))
        self.out_dim = dense[-1] if dense else flat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "HWC":
            x = x.permute(0, 3, 1, 2)
        elif self.layout == "SHWC":
            x = x.permute(0, 1, 4, 2, 3)
        x = x.reshape(x.shape[0], *self.shape)  # HW: one channel; SHWC/SCHW: stack x channels (still uint8)
        # To float on this device. When gradients are computed, in channels-last memory (the same NCHW tensor,
        # strided as NHWC; HWC frames already are): oneDNN's convolutions, forward and backward, then train 1.5x
        # (Nature) to 1.9x (IMPALA ResNet) faster on a CPU at minibatch 256. Inference keeps the frames' own
        # layout: a runner's small batches (8-32 envs) act 2-5% faster on it. Results differ only by float
        # rounding, and flatten below reads NCHW order either way.
        layout = torch.channels_last if torch.is_grad_enabled() else torch.preserve_format
        x = x.to(torch.float32, memory_format=layout)
        if self.scale != 1.0:  # integer frames: a new tensor, scaled in place into [0, 1]
            x = x.mul_(self.scale)
        return self.dense(self.convs(x).flatten(1))


# ------------------------------------------------------------------------------------ the encoder
class Encoder(nn.Module):
    """Observations -> features: every leaf encoded (CNN for images, flattened otherwise), concatenated, then
    the MLP ``mlp`` (``fcnet_hiddens``; none when the whole observation is one image)."""

    def __init__(self, space: gym.Space, model_config: dict, mlp: bool = True) -> None:
        super().__init__()
        self.space = space
        self.names = list(leaf_spaces(space))
        self.single = self.names == [""]
        # "flat" (checkpoints of format <= 2): every leaf flattened as it is, no CNN, no scaling.
        flat = model_config.get("obs_encoding", "auto") == "flat"
        self.leaves = nn.ModuleList(
            ImageEncoder(leaf, model_config) if not flat and image_layout(leaf) is not None
            else _Flatten(leaf, scale=not flat) for leaf in leaf_spaces(space).values())
        feature_dim = sum(leaf.out_dim for leaf in self.leaves)
        self.activation = model_config["fcnet_activation"]
        one_image = self.single and isinstance(self.leaves[0], ImageEncoder)
        hiddens = [] if one_image or not mlp else list(model_config["fcnet_hiddens"])
        self.mlp = mlp_body(feature_dim, hiddens, self.activation)
        self.out_dim = hiddens[-1] if hiddens else feature_dim

    def features(self, obs: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        """The leaves' features, concatenated (before the MLP)."""
        if self.single:
            return self.leaves[0](obs)
        return torch.cat([leaf(obs[name]) for name, leaf in zip(self.names, self.leaves, strict=True)], dim=-1)

    def forward(self, obs: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        return self.mlp(self.features(obs))

    def numpy_input_spec(self) -> tuple | None:
        """For the runners' numpy twins: what :meth:`features` does as plain data (see
        :func:`herdrl.models.numpy_policy.input_function`), for an observation that is one float Box or one
        Discrete (what small MLP policies see); None otherwise (use torch)."""
        if not self.single:
            return None
        leaf = self.leaves[0]
        if not isinstance(leaf, _Flatten) or leaf.kind not in ("Box", "Discrete") or getattr(leaf, "scaled", False):
            return None
        return ("Discrete", int(leaf.n), int(leaf.offset)) if leaf.kind == "Discrete" else ("Box", int(leaf.out_dim))

    def numpy_input(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """:meth:`numpy_input_spec` as a numpy function; None where there is none."""
        from herdrl.models.numpy_policy import input_function

        spec = self.numpy_input_spec()
        return None if spec is None else input_function(spec)


class CustomEncoder(nn.Module):
    """A registered encoder (see :func:`herdrl.register_encoder`), given observations in the space's own structure."""

    def __init__(self, space: gym.Space, model_config: dict) -> None:
        super().__init__()
        from herdrl.errors import ConfigError

        name = model_config["custom_encoder"]
        if name not in ENCODERS:
            raise ConfigError(f"model key 'custom_encoder' names '{name}', which is not registered: call "
                              f"herdrl.register_encoder('{name}', factory) in a module you pass to --import")
        self.space = space
        self.names = list(leaf_spaces(space))
        self.net = ENCODERS[name](space, dict(model_config.get("custom_encoder_config") or {}))
        out_dim = getattr(self.net, "out_dim", None)
        if not isinstance(out_dim, int) or out_dim <= 0:
            raise ConfigError(f"custom encoder '{name}' has no int attribute out_dim > 0 (got {out_dim!r})")
        self.out_dim = out_dim

    def forward(self, obs: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        return self.net(nest(self.space, obs))

    def numpy_input_spec(self) -> None:
        """Custom encoders run in torch."""
        return None

    def numpy_input(self) -> None:
        """Custom encoders run in torch."""
        return None


def pytorch_default_init(module: nn.Module) -> nn.Module:
    """Draw every Linear and Conv2d layer of ``module`` again with PyTorch's default init (Kaiming-uniform weights,
    uniform biases; d3rlpy's layers keep it) in place of herdrl's orthogonal one (model ``init="pytorch"``). A
    custom encoder's layers keep the init its factory gave them."""
    custom = {id(layer) for encoder in module.modules() if isinstance(encoder, CustomEncoder)
              for layer in encoder.modules()}
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)) and id(layer) not in custom:
            layer.reset_parameters()
    return module


def build_encoder(space: gym.Space, model_config: dict, mlp: bool = True) -> Encoder | CustomEncoder:
    """The encoder the observation space and ``model_config`` call for (``mlp=False``: leaves only, as SAC's
    critics take them before adding the action)."""
    if model_config.get("custom_encoder"):
        return CustomEncoder(space, model_config)
    return Encoder(space, model_config, mlp)


def torch_device(num_gpus: float, key: str = "num_gpus") -> torch.device:
    """``cuda`` when the setting ``key`` asks for GPUs and torch sees one (Ray gives an actor only its own GPUs);
    a clear error when torch sees none; else the CPU."""
    if num_gpus <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        from herdrl.errors import ConfigError

        raise ConfigError(f"{key}={num_gpus:g} but torch sees no GPU (torch {torch.__version__}); "
                          f"set {key}=0 or install a CUDA build of torch")
    return torch.device("cuda")


def module_device(module: nn.Module) -> torch.device:
    """Where a module's parameters live (the CPU for a module without any)."""
    return next(iter(module.parameters()), torch.empty(0)).device


# A read-only batch (an aggregator's share, read where it lies in the object store) is shared, not copied: the
# learner only reads its batch (encoders make new tensors). Torch would warn that it cannot forbid writes to it.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning,
                        module=__name__)


def to_torch(obs: np.ndarray | dict[str, np.ndarray], device: torch.device | str = "cpu",
             non_blocking: bool = False) -> torch.Tensor | dict[str, torch.Tensor]:
    """A stored batch (``herdrl.obs``) as tensors on ``device``, dtypes kept (frames cross as uint8). To a GPU the
    batch goes through pinned memory with a non-blocking copy (the copy overlaps what the GPU is still doing)."""
    if isinstance(obs, dict):
        return {k: to_torch(v, device, non_blocking) for k, v in obs.items()}
    tensor = torch.as_tensor(obs)
    if torch.device(device).type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device, non_blocking=non_blocking)


class LegacyNames(nn.Module):
    """A network whose weights had other names before encoders existed (checkpoint format <= 2): its
    ``LEGACY_KEYS`` map an old key prefix to today's, and ``load_state_dict`` takes either."""

    LEGACY_KEYS: dict[str, str] = {}

    def load_state_dict(self, state_dict: dict, strict: bool = True, assign: bool = False) -> Any:
        """As torch's, also taking weights saved under the old names."""
        state_dict = legacy_keys(state_dict, self.LEGACY_KEYS, self.state_dict())
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


def legacy_keys(state: dict[str, Any], renames: dict[str, str], expected: Any) -> dict[str, Any]:
    """Weights saved before encoders existed (checkpoint format <= 2) under today's names: ``renames`` maps an
    old key prefix to its new one; keys already in ``expected`` are left alone."""
    if all(key in expected for key in state):
        return state
    out = {}
    for key, value in state.items():
        if key not in expected:
            for old, new in renames.items():
                if key.startswith(old):
                    key = new + key[len(old):]
                    break
        out[key] = value
    return out
