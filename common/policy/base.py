"""The policy seam: one object, four modes (see common/policy/__init__.py for the loop)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from easydict import EasyDict


class Policy(ABC):
    """A policy exposes ``learn_mode``, ``collect_mode``, ``eval_mode`` and ``command_mode``.

    Subclasses set ``config`` (their defaults, merged under the user's ``policy`` section) and
    build only the fields listed in ``enable_field``, so the commander never allocates networks.
    """

    config: dict[str, Any] = {}

    def __init__(self, cfg: EasyDict, enable_field: tuple[str, ...] = ("learn", "collect", "eval", "command")) -> None:
        self._cfg = cfg
        self._enable_field = tuple(enable_field)

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        import copy

        return copy.deepcopy(cls.config)

    def _mode(self, name: str) -> Any:
        if name not in self._enable_field:
            raise AttributeError(f"policy mode {name!r} was not enabled (enable_field={self._enable_field})")
        return self

    @property
    def learn_mode(self) -> "Policy":
        return self._mode("learn")

    @property
    def collect_mode(self) -> "Policy":
        return self._mode("collect")

    @property
    def eval_mode(self) -> "Policy":
        return self._mode("eval")

    @property
    def command_mode(self) -> "Policy":
        return self._mode("command")

    @abstractmethod
    def get_setting_collect(self, info: dict[str, Any]) -> dict[str, Any]:
        """Command mode: collect settings (e.g. ``{"eps": float}``) from ``info["envstep"]`` (env steps)."""

    @abstractmethod
    def publishable_state(self) -> dict[str, np.ndarray]:
        """Learn mode: the acting network's weights as float32 numpy arrays, for collectors."""

    @abstractmethod
    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Collect/eval mode: load weights produced by :meth:`publishable_state`."""


def create_policy(cfg: EasyDict, enable_field: tuple[str, ...] = ("learn", "collect", "eval", "command"), **kwargs: Any) -> Policy:
    """Build the policy named by ``cfg.create.policy.type`` (default ``dqn``) from the full config.

    ``enable_field=("command",)`` returns the torch-free command mode from ``COMMAND_REGISTRY``.

    Raises:
        KeyError: unknown policy type (names it and lists the known ones).
    """
    from common.registry import COMMAND_REGISTRY, POLICY_REGISTRY, import_names

    create = cfg.get("create") or {}
    ptype = create.get("policy", {}).get("type", "dqn")
    import_names(create.get("policy", {}).get("import_names", []))
    if tuple(enable_field) == ("command",):
        return COMMAND_REGISTRY.build(ptype, cfg.policy)  # no network, no torch import
    return POLICY_REGISTRY.build(ptype, cfg.policy, enable_field=enable_field, **kwargs)
