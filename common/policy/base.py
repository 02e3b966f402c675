"""The algorithm seam: everything the workers and the coordinator call, and nothing more.

An algorithm is a package ``common/policy/<name>/`` whose ``__init__`` (no torch) defines an
:class:`Algorithm`, and whose torch module defines a :class:`Policy` subclass. The loops they
serve, with ``E`` envs, ``B`` rows and ``*O`` the stored observation shape::

    # commander (coordinator/commander.py), once per collector task; torch-free
    setting = algorithm.collect_setting(cfg.policy, {"envstep": n, "train_iter": i, "collectors": k})

    # collector task (workers/collector.py)
    policy = create_policy(cfg, spec, modes=("collect",))
    policy.set_weights(weights)                          # whenever a newer policy version is published
    adder = policy.make_adder(E, setting)
    env_action, record = policy.act(obs, setting, rng)   # obs (E, *O) -> env actions (E, ...), record {k: (E, ...)}
    rows = adder.add(obs, record, reward, next_obs, terminated, truncated)   # {field: (B, ...)} or None
    rows = adder.flush(obs)                              # at the end of the task: bootstrap, not terminal

    # eval task (workers/collector.py) and ``rqrl eval``; rng seeded from the task's / the eval's seed
    env_action = policy.act_eval(obs, rng)               # obs (E, *O) -> env actions (E, ...)

    # learner task (workers/learner.py); how batches are formed is ``algorithm.data_source``, a
    # registered source (common/sources.py):
    #   "replay"     rows sampled from a replay buffer (off-policy: DQN, SAC)
    #   "on_policy"  exactly the rows produced by the current policy version (PPO); older ones are dropped
    #   "consume_once"  every row once, oldest first, collectors never waiting for a version (IMPALA)
    info = policy.learn(batch)                           # batch {field: (B, ...)} per policy.schema() -> {str: float}
    weights = policy.get_weights()                       # {name: float32 ndarray}, published as a new version
    state = policy.state_dict(); policy.load_state_dict(state)   # checkpoints (torch tensors)

Every array of a chunk, and of a batch, follows :meth:`Policy.schema`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

import numpy as np
from easydict import EasyDict

from common.sources import SOURCES
from common.space_spec import SpaceSpec

MODES = ("learn", "collect", "eval")

Schema = dict[str, tuple[tuple[int, ...], np.dtype]]


@dataclass(frozen=True)
class Algorithm:
    """The torch-free half of an algorithm: what the coordinator needs.

    Attributes:
        name: the ``create_config.policy.type`` it is registered under.
        data_source: the name of a registered data source (common/sources.py: ``"replay"``,
            ``"on_policy"`` or one a module registered first), which says how the learner forms
            batches and what collectors do after a chunk.
        policy_class: ``"module:Class"`` of its :class:`Policy`, imported only where torch is.
        config: its defaults for the config's ``policy`` section (merged over the system
            defaults of common/config.py; only the algorithm's own hyperparameters).
        collect_setting: ``(cfg.policy, info) -> dict`` handed to each collector task, e.g.
            ``{"eps": 0.42}``; ``info`` has ``envstep`` (env steps), ``train_iter`` and
            ``collectors`` (collector tasks allowed at once). Plain JSON values only.
        check_setting: ``(setting) -> None``; raises ValueError naming a bad key of a collect
            setting (a hand-enqueued task is refused before it runs).
        check_config: ``(policy section, a plain dict) -> None``; raises ValueError naming a bad
            ``policy.*`` key (the config check turns it into a ConfigError before any launch).
        action_kinds: the action spaces it can act in (``"discrete"``, ``"box"``;
            :class:`common.spaces.SpaceSpec`), checked against the env before anything is launched.
    """

    name: str
    data_source: str
    policy_class: str
    config: dict[str, Any] = field(default_factory=dict)
    collect_setting: Callable[[EasyDict, dict[str, Any]], dict[str, Any]] = lambda cfg, info: {}
    check_setting: Callable[[dict[str, Any]], None] = lambda setting: None
    check_config: Callable[[dict[str, Any]], None] = lambda policy: None
    action_kinds: tuple[str, ...] = ("discrete", "box")

    def __post_init__(self) -> None:
        if self.data_source not in SOURCES:
            raise ValueError(f"algorithm {self.name!r}: data_source must be a registered data source "
                             f"({sorted(SOURCES)}; common/sources.py), got {self.data_source!r}")


class Adder(Protocol):
    """Turns per-step records of ``E`` envs into chunk rows (dicts of ``(B, ...)`` arrays per the schema)."""

    def add(self, obs: np.ndarray, record: dict[str, np.ndarray], reward: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, truncated: np.ndarray) -> Optional[dict[str, np.ndarray]]:
        """One vector-env step. ``next_obs`` is the true next observation (the final one where an
        episode ended); ``reward`` float (E,); ``terminated`` / ``truncated`` bool (E,).
        Returns the rows that became complete, or None."""

    def flush(self, obs: np.ndarray) -> Optional[dict[str, np.ndarray]]:
        """Emit every pending step; the rollout stopped at ``obs`` (a truncation, not a terminal state)."""


class Policy(ABC):
    """One algorithm's networks and math (see the module docstring for the loops).

    Args:
        cfg: the full compiled config (``cfg.policy`` holds the algorithm's section).
        spec: the env's spaces (common/space_spec.py).
        modes: which of ``learn`` / ``collect`` / ``eval`` to build; collectors never build
            optimisers, eval never builds target networks.
        device: torch device name; default ``cuda`` when ``policy.cuda`` and CUDA exists, else ``cpu``.

    Attributes the workers read (set here: a subclass calls ``super().__init__``):
        cfg, spec, modes: the arguments.
        device: the ``torch.device`` the networks live on (checkpoints are loaded onto it).

    Raises:
        ValueError: an unknown mode.
    """

    def __init__(self, cfg: EasyDict, spec: SpaceSpec, modes: tuple[str, ...] = MODES,
                 device: Optional[str] = None) -> None:
        unknown = set(modes) - set(MODES)
        if unknown:
            raise ValueError(f"unknown policy modes {sorted(unknown)}; known: {MODES}")
        from common.device import pick_device  # torch: the torch-free Algorithm side never builds a Policy

        self.cfg = cfg
        self.spec = spec
        self.modes = tuple(modes)
        self.device = pick_device(cfg, device)

    @abstractmethod
    def schema(self) -> Schema:
        """Field name -> (per-row shape, dtype) of the chunks this policy's adder emits."""

    @abstractmethod
    def act(self, obs: np.ndarray, setting: dict[str, Any], rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Collect mode: actions for ``obs`` (E, *O) with exploration per ``setting``.

        Returns:
            ``(env_action, record)``: what ``env.step`` takes (E,) or (E, A), and the per-env
            arrays the adder stores (e.g. the action index, its log-probability, a value).
        """

    @abstractmethod
    def act_eval(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Eval mode: env actions (E,) or (E, A) for ``obs`` (E, *O), per the algorithm's
        ``policy.eval`` settings: greedy / the mean action, or with a little randomness from
        ``rng`` (a DQN's epsilon, a PPO's sampling) so an eval cannot stall in a state the
        deterministic policy never leaves (an Atari game that waits for FIRE). With the same
        weights, observations and ``rng`` state the actions are the same.
        """

    @abstractmethod
    def make_adder(self, env_num: int, setting: dict[str, Any]) -> Adder:
        """Collect mode: a fresh adder for ``env_num`` envs."""

    @abstractmethod
    def learn(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        """Learn mode: one train iteration on ``batch`` (arrays per :meth:`schema`); returns scalars."""

    @abstractmethod
    def get_weights(self) -> dict[str, np.ndarray]:
        """The acting network's weights, float32 arrays on the CPU (what collectors load)."""

    @abstractmethod
    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load :meth:`get_weights` output.

        Raises:
            ValueError: a missing, unexpected or wrongly shaped tensor (named).
        """

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Learn-mode state for checkpoints (tensors and plain values, ``torch.load(weights_only=True)``-safe)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""

    def optimizers(self) -> list[Any]:
        """Learn mode: every ``torch.optim.Optimizer`` that :meth:`learn` steps. A data-parallel
        learner group averages gradients before each one's step (workers/ddp.py), so one left out
        would train each rank apart. The default finds them among the policy's attributes and in
        the dicts, lists and tuples those hold; override it when they live elsewhere."""
        import torch

        return list({id(v): v for _, v in _members(self) if isinstance(v, torch.optim.Optimizer)}.values())

    def modules(self) -> dict[str, Any]:
        """Every ``torch.nn.Module`` of the policy by name (``model``, ``target_model``, ...), whose
        gradients and weights are checked for NaN / inf after each train iteration
        (common/finite.py). Found like :meth:`optimizers`; override it when they live elsewhere."""
        import torch

        found: dict[str, Any] = {}
        seen: set[int] = set()
        for name, v in _members(self):
            if isinstance(v, torch.nn.Module) and id(v) not in seen:
                seen.add(id(v))
                found[name] = v
        return found


def _members(policy: Policy) -> list[tuple[str, Any]]:
    """``policy``'s attributes (a leading ``_`` dropped from the name) and the values of the dicts,
    lists and tuples among them (``name.key`` / ``name.i``)."""
    out: list[tuple[str, Any]] = []
    for name, value in vars(policy).items():
        name = name.lstrip("_")
        out.append((name, value))
        if isinstance(value, dict):
            out += [(f"{name}.{k}", v) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            out += [(f"{name}.{i}", v) for i, v in enumerate(value)]
    return out
