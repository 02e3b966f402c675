"""Algorithms as plug-ins (see common/policy/base.py for the contract and the loops it serves).

Registering an algorithm is one entry: its package path in :data:`ALGORITHMS` (or
:func:`register_algorithm` from a module named in ``create_config.policy.import_names``).
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

from easydict import EasyDict

from common.policy.base import Algorithm, Policy

DEFAULT_ALGORITHM = "dqn"  # create_config.policy.type when a config names none

# name -> package whose __init__ (torch-free) defines ``ALGORITHM``
ALGORITHMS: dict[str, str] = {
    "dqn": "common.policy.dqn",
    "impala": "common.policy.impala",
    "ppo": "common.policy.ppo",
    "sac": "common.policy.sac",
}


def register_algorithm(name: str, package: str) -> None:
    """Make ``create_config.policy.type = name`` load the :class:`Algorithm` in ``package``.ALGORITHM.

    Raises:
        KeyError: ``name`` is already registered to another package.
    """
    if ALGORITHMS.get(name, package) != package:
        raise KeyError(f"algorithm {name!r} is already registered to {ALGORITHMS[name]!r}")
    ALGORITHMS[name] = package


def get_algorithm(name: str) -> Algorithm:
    """The torch-free :class:`Algorithm` registered as ``name``.

    Raises:
        KeyError: unknown name (lists the known ones), or a package without ``ALGORITHM``.
    """
    if name not in ALGORITHMS:
        raise KeyError(f"unknown policy type {name!r}; known: {sorted(ALGORITHMS)}")
    module = importlib.import_module(ALGORITHMS[name])
    algo = getattr(module, "ALGORITHM", None)
    if not isinstance(algo, Algorithm):
        raise KeyError(f"policy type {name!r}: module {ALGORITHMS[name]!r} defines no ALGORITHM")
    return algo


def algorithm_of(cfg: EasyDict) -> Algorithm:
    """The algorithm a compiled config names (``cfg.create.policy.type``)."""
    create = cfg.get("create") or {}
    return get_algorithm(create.get("policy", {}).get("type", DEFAULT_ALGORITHM))


def create_policy(cfg: EasyDict, spec: Any, modes: tuple[str, ...] = ("learn", "collect", "eval"),
                  device: Optional[str] = None) -> Policy:
    """Build the config's policy (imports torch) for env spaces ``spec`` (common/spaces.py).

    Raises:
        KeyError: unknown policy type.
        TypeError: the class is not a :class:`Policy` subclass, leaves one of its abstract methods
            out, or skips ``Policy.__init__`` (the attributes the workers read would be missing).
    """
    module, _, cls = algorithm_of(cfg).policy_class.partition(":")
    policy = getattr(importlib.import_module(module), cls)(cfg, spec, modes, device)
    if not isinstance(policy, Policy):
        raise TypeError(f"{module}:{cls} does not subclass common.policy.base.Policy, the contract the workers rely on")
    missing = [a for a in ("cfg", "spec", "modes", "device") if not hasattr(policy, a)]
    if missing:
        raise TypeError(f"{module}:{cls} has no {', '.join(missing)}: its __init__ must call Policy.__init__")
    return policy


__all__ = ["ALGORITHMS", "DEFAULT_ALGORITHM", "Algorithm", "Policy", "algorithm_of", "create_policy", "get_algorithm", "register_algorithm"]
