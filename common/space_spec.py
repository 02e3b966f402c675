"""The plain data a policy is built for: :class:`SpaceSpec`, an env's observation and action spaces
(read from the env by common/spaces.py, which says what is supported and how images are laid out).

Its own module so that the policy contract (common/policy/base.py) and the code that reads and checks
an env's spaces against the config's algorithm (common/spaces.py) both import it without importing
each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


class SpaceError(ValueError):
    """An env space rqrl cannot train on, or a config that disagrees with the env (one line)."""


@dataclass(frozen=True)
class SpaceSpec:
    """Plain-data description of an env's spaces (see common/spaces.py's module docstring).

    Attributes:
        env_id: the gymnasium id the spaces came from (for error messages).
        obs_kind: ``"box"``, ``"image"`` or ``"discrete"``.
        obs_shape: the per-step observation shape as stored (``()`` for a Discrete observation).
        obs_n: number of values of a Discrete observation (0 for a Box).
        obs_start: ``start`` of a Discrete observation.
        action_kind: ``"discrete"`` or ``"box"``.
        action_n: number of discrete actions (0 for a Box).
        action_start: ``start`` of a Discrete action space.
        action_dim: size of a Box action (0 for Discrete).
        action_low / action_high: Box bounds, one float per action dimension.
        obs_layout: ``"hw"``, ``"chw"`` or ``"hwc"`` for an image observation, else ``""``.
        image_high: the stored value that means 1.0 for an image (the Box's largest ``high``:
            255 for pixels, 1 for a binary grid); unused otherwise.
    """

    env_id: str
    obs_kind: str
    obs_shape: tuple[int, ...]
    obs_n: int
    obs_start: int
    action_kind: str
    action_n: int
    action_start: int
    action_dim: int
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    obs_layout: str = ""  # last, with defaults: bundles saved before images (or grids) load unchanged
    image_high: float = 255.0

    @property
    def obs_dim(self) -> int:
        """Input size of an MLP: one-hot size of a Discrete obs, else the flattened Box size."""
        return self.obs_n if self.obs_kind == "discrete" else int(np.prod(self.obs_shape, dtype=np.int64))

    @property
    def obs_dtype(self) -> np.dtype:
        """Stored dtype: int64 for Discrete, uint8 for images, float32 for other Boxes."""
        return np.dtype({"discrete": np.int64, "image": np.uint8}.get(self.obs_kind, np.float32))

    @property
    def image_chw(self) -> tuple[int, int, int]:
        """An image observation's (channels, height, width), whatever its stored layout."""
        s = self.obs_shape
        if self.obs_layout == "hw":
            return 1, s[0], s[1]
        if self.obs_layout == "hwc":
            return s[2], s[0], s[1]
        return s[0], s[1], s[2]

    @property
    def model_action_shape(self) -> int:
        """``policy.model.action_shape``: the number of discrete actions, or the Box's size."""
        return self.action_n if self.action_kind == "discrete" else self.action_dim

    @property
    def model_obs_shape(self) -> int | list[int]:
        """``policy.model.obs_shape``: an int for flat observations, else the shape as a list."""
        if self.obs_kind == "discrete":
            return self.obs_n
        if len(self.obs_shape) <= 1:  # a scalar Box is one feature
            return int(self.obs_shape[0]) if self.obs_shape else 1
        return list(self.obs_shape)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpaceSpec":
        kw = dict(d)
        for k in ("obs_shape", "action_low", "action_high"):
            kw[k] = tuple(kw[k])
        return cls(**kw)

    def obs_batch(self, obs: np.ndarray) -> np.ndarray:
        """Observations of a vector env as stored in chunks: float32 (E, *obs_shape), uint8
        (E, *obs_shape) for images (no copy when already uint8; bool grids become 0/1), or int64 (E,).

        Raises:
            SpaceError: an integer grid holds a value outside [0, 255] (it would wrap in uint8).
        """
        if self.obs_kind == "discrete":
            return np.asarray(obs, dtype=np.int64) - self.obs_start
        a = np.asarray(obs)
        if self.obs_kind == "image" and a.dtype.kind in "iu" and a.dtype != np.uint8 and a.size and (
                a.min() < 0 or a.max() > 255):
            raise SpaceError(f"env {self.env_id!r}: an observation holds {a.min()}..{a.max()}, outside its "
                             f"integer grid's [0, 255]")
        return np.asarray(a, dtype=self.obs_dtype)
