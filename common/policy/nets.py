"""Torch building blocks shared by the algorithms: observation encoding, MLPs, Adam, weight I/O.

Encoders (:func:`encoder`): a flat observation goes straight into the algorithm's MLP; an image
observation (``spec.obs_kind == "image"``, common/spaces.py) first goes through the conv torso
of ``policy.model.conv`` (default: the Nature DQN torso of Mnih et al. 2015, 32x8/4, 64x4/2,
64x3/1, ReLU) and is flattened. Images travel and are stored as uint8; :func:`obs_tensor`
moves them to the device as uint8 and only there makes them float32 in [0, 1].

Every array of a sampled batch reaches the policy's device through :func:`to_device`: on CUDA
it is staged in pinned (page-locked) host memory and copied without blocking the host, so the
copy overlaps the Python that builds the next tensors; on the CPU it is ``torch.as_tensor``.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common.spaces import SpaceSpec, conv_out_hw


def mlp(sizes: list[int], activate_last: bool = True) -> nn.Sequential:
    """Linear layers ``sizes[0] -> sizes[1] -> ...`` with ReLU between (and after the last if asked)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or activate_last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def to_device(x: np.ndarray | torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x`` (any shape) as a tensor of ``dtype`` (default: ``x``'s own) on ``device``.

    CPU device: exactly ``torch.as_tensor(x, dtype=dtype, device=device)`` (no pinning: without
    CUDA it fails, and a host-to-host copy gains nothing). CUDA device: a host array is cast on
    the host only if that shrinks it (float64 -> float32), otherwise after the copy (bool or
    uint8 -> float32 crosses the bus at 1 byte a value, not 4), pinned, and copied with
    ``non_blocking=True``. Torch's pinned-memory cache keeps the staging block alive until the copy
    on the stream is done, and kernels queued on the same stream see the copied values.
    """
    if device.type != "cuda":
        return torch.as_tensor(x, dtype=dtype, device=device)
    t = torch.as_tensor(x)
    if t.device.type == "cpu":
        if dtype is not None and dtype.itemsize < t.dtype.itemsize:
            t = t.to(dtype)
        t = t.pin_memory().to(device, non_blocking=True)
    return t.to(device=device, dtype=dtype)


def obs_tensor(spec: SpaceSpec, obs: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Stored observations -> encoder input: one-hot float32 (B, n) for Discrete, flattened
    float32 (B, obs_dim) for a Box, float32 (B, C, H, W) in [0, 1] for an image or grid (uint8
    (B, *O) copied to ``device`` as uint8, then divided there by ``spec.image_high``: 255 for
    pixels, the Box's high for a grid)."""
    if spec.obs_kind == "discrete":
        idx = to_device(obs, device, torch.int64)
        return F.one_hot(idx, spec.obs_n).to(torch.float32)
    if spec.obs_kind == "image":
        x = to_device(obs, device)  # stays uint8 through the copy: 4x fewer bytes than float32
        if spec.obs_layout == "hw":
            x = x.unsqueeze(1)
        elif spec.obs_layout == "hwc":
            x = x.permute(0, 3, 1, 2)
        return x.to(torch.float32).mul_(1.0 / spec.image_high)
    x = to_device(obs, device, torch.float32)
    return x.reshape(x.shape[0], -1)


class ConvTorso(nn.Module):
    """Convs ``[[channels, kernel, stride], ...]`` with ReLU, flattened: float32 (B, C, H, W) -> (B, out_dim)."""

    def __init__(self, chw: tuple[int, int, int], conv: list[list[int]]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = chw[0]
        for out, k, st in conv:
            layers += [nn.Conv2d(c, int(out), int(k), int(st)), nn.ReLU()]
            c = int(out)
        self.net = nn.Sequential(*layers, nn.Flatten())
        h, w = conv_out_hw(chw[1:], conv)
        self.out_dim = c * h * w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BoardTorso(nn.Module):
    """A board game's flat observation, ``[board (H*W*C values, row-major, planes last), rest]``:
    :class:`ConvTorso` over the board, flattened, with ``rest`` (e.g. legal-action flags) beside
    it: float32 (B, H*W*C + rest) -> (B, conv_out + rest). Convs see a line of pieces the same
    wherever it lies on the board, which an MLP over the flat cells must learn cell by cell."""

    def __init__(self, hwc: tuple[int, int, int], obs_dim: int, conv: list[list[int]]) -> None:
        super().__init__()
        self.hwc, self.cells = tuple(int(x) for x in hwc), int(np.prod(hwc))
        h, w, c = self.hwc
        self.torso = ConvTorso((c, h, w), conv)
        self.out_dim = self.torso.out_dim + obs_dim - self.cells

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        board = x[:, : self.cells].reshape(-1, *self.hwc).permute(0, 3, 1, 2)
        return torch.cat([self.torso(board), x[:, self.cells:]], dim=1)


def mirror_board(x: torch.Tensor, hwc: tuple[int, int, int]) -> torch.Tensor:
    """Left-right mirrors of flat board observations, float32 (B, H*W*C + W) -> the same shape:
    the board (row-major, planes last) flipped along its width and the W per-column flags after it
    reversed. In a game whose rules are the same mirrored (Connect Four, common/games.py) the
    mirrored observation is the same position, where column c's move is column W - 1 - c's."""
    h, w, c = hwc
    cells = h * w * c
    board = x[:, :cells].reshape(-1, h, w, c).flip(2).reshape(-1, cells)
    return torch.cat([board, x[:, cells:].flip(1)], dim=1)


def encoder(spec: SpaceSpec, model_cfg: Any, hidden: list[int]) -> tuple[nn.Module, int]:
    """The observation encoder of an algorithm: ``(module, output size)``.

    Flat observations: ``mlp([obs_dim, *hidden])``; with ``model_cfg.board`` set,
    :class:`BoardTorso` first. Images: :class:`ConvTorso` of ``model_cfg.conv`` then
    ``mlp([torso_out, *hidden])`` (the Nature DQN's 512-unit layer is ``hidden=[512]``). The
    module takes :func:`obs_tensor` output.
    """
    model_cfg = model_cfg or {}
    conv = [list(layer) for layer in model_cfg.get("conv") or []]
    if spec.obs_kind == "image":
        torso: nn.Module = ConvTorso(spec.image_chw, conv)
    elif model_cfg.get("board"):
        torso = BoardTorso(tuple(model_cfg["board"]), spec.obs_dim, conv)
    else:
        return mlp([spec.obs_dim, *hidden]), (hidden[-1] if hidden else spec.obs_dim)
    out = int(torso.out_dim)
    return nn.Sequential(torso, mlp([out, *hidden])), (hidden[-1] if hidden else out)


def frozen_copy(module: nn.Module) -> nn.Module:
    """A target network: a copy of ``module`` (same weights, same device) that takes no gradients."""
    return copy.deepcopy(module).requires_grad_(False)


def adam(params: Any, lr: float) -> torch.optim.Optimizer:
    """Adam, fused where this torch build supports it (one kernel instead of a loop per tensor)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr)


def get_weights(module: nn.Module) -> dict[str, np.ndarray]:
    """``module``'s state as float32 numpy arrays on the CPU (copies: training does not change them later).
    A CPU float32 tensor is copied by numpy, half the cost of torch's ``to(copy=True)`` per tensor
    on the small nets a learner publishes every few train iterations."""
    return {k: v.detach().numpy().copy() if v.device.type == "cpu" and v.dtype == torch.float32
            else v.detach().to("cpu", torch.float32, copy=True).numpy() for k, v in module.state_dict().items()}


def set_weights(module: nn.Module, weights: dict[str, np.ndarray]) -> None:
    """Load float arrays keyed like ``module.state_dict()``.

    Raises:
        ValueError: a missing, unexpected or wrongly shaped tensor, by name.
    """
    own = module.state_dict()
    missing, extra = set(own) - set(weights), set(weights) - set(own)
    if missing or extra:
        raise ValueError(f"policy weights do not match the model: missing {sorted(missing)}, unexpected {sorted(extra)}")
    for k, v in weights.items():
        if tuple(np.shape(v)) != tuple(own[k].shape):
            raise ValueError(f"policy weight {k!r} has shape {tuple(np.shape(v))}, model expects {tuple(own[k].shape)}")
    module.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()})
