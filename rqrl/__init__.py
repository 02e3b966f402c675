"""rqrl from Python: load a trained policy and act with it, or run the main job.

The loop this serves::

    import gymnasium as gym
    import rqrl

    result = rqrl.train("deploy/configs/cartpole_dqn.py", seed=3)   # as `rqrl train ... --seed 3`
    agent = rqrl.load(result.run_dir / "final.pt")
    env = gym.make(agent.env_id)
    obs, _ = env.reset(seed=0)
    while True:
        obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
        if terminated or truncated:
            break

``rqrl.load`` reads a run's ``final.pt`` or ``best.pt`` (common/policy/export.py) with
``torch.load(weights_only=True)`` and rebuilds the policy from the algorithm, config and spaces
the file carries, as ``rqrl eval`` does; ``rqrl.train`` runs the ``rqrl train`` command (its own
process: it owns signals, a private Redis and the worker processes) and returns the run's
summary.json. The three planes (``coordinator``, ``workers``, ``common``) stay the packages the
commands use; this facade is all a user's script needs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

__all__ = ["Agent", "TrainResult", "load", "train"]


class Agent:
    """A trained policy, built for acting only (no optimiser, no target network).

    Attributes:
        algorithm: the algorithm's registered name (``"dqn"``, ``"ppo"``, ``"sac"``, ...).
        env_id: the gymnasium id it was trained on.
        config: the run's compiled config (EasyDict).
        spec: the env's spaces as rqrl describes them (common.spaces.SpaceSpec).
        train_iter: the policy version (train iterations) of the weights; None for a bare state_dict.
    """

    def __init__(self, policy: Any, train_iter: Optional[int]) -> None:
        from common.policy import algorithm_of

        self._policy = policy
        self.config = policy.cfg
        self.spec = policy.spec
        self.algorithm = algorithm_of(self.config).name
        self.env_id = str(self.config.env.env_id)
        self.train_iter = train_iter

    def act(self, obs: Any, deterministic: bool = True, rng: Optional[np.random.Generator] = None) -> np.ndarray:
        """The env action for one observation, or a batch of actions for a batch of them.

        Args:
            obs: one observation of the env's observation space (shape ``spec.obs_shape``), or a
                batch (B, *obs_shape), e.g. from a gymnasium vector env.
            deterministic: True (default) acts greedily / with the mean action; False acts as the
                run's evals did (``policy.eval``: a DQN's epsilon, a PPO's sampling when
                ``policy.eval.sample`` is set), drawing from ``rng``.
            rng: the randomness of ``deterministic=False``; default a fresh unseeded generator.

        Returns:
            ``env.step``'s action: an int64 scalar (Discrete) or a float32 (A,) array (Box) for one
            observation; with a leading batch axis for a batch.

        Raises:
            ValueError: ``obs`` has neither the observation's shape nor a batch of it (names both).
        """
        a = np.asarray(obs)
        shape = tuple(self.spec.obs_shape)
        single = a.shape == shape
        if not single and a.shape[1:] != shape:
            raise ValueError(f"observation of shape {a.shape} for env {self.env_id!r}: expected {shape} "
                             f"or a batch (B, {', '.join(map(str, shape))})".replace(", )", ")"))
        batch = self.spec.obs_batch(a[None] if single else a)
        policy = self._greedy if deterministic else self._policy
        actions = policy.act_eval(batch, rng if rng is not None else np.random.default_rng())
        return actions[0] if single else actions

    @property
    def _greedy(self) -> Any:
        """The policy with the eval randomness switched off (built once, on first use)."""
        if not hasattr(self, "_greedy_policy"):
            self._greedy_policy = _build(_without_eval_randomness(self.config), self.spec,
                                         self._policy.get_weights())
        return self._greedy_policy


def _without_eval_randomness(cfg: Any) -> Any:
    """``cfg`` with the eval settings that add randomness turned off: an epsilon of 0 and no
    sampling, wherever the algorithm's ``policy.eval`` has those keys."""
    from common.config import apply_overrides

    ev = cfg.policy.get("eval") or {}
    off = [f"policy.eval.{k}={v}" for k, v in (("eps", 0.0), ("sample", False)) if k in ev]
    return apply_overrides(cfg, off) if off else cfg


def _build(cfg: Any, spec: Any, weights: dict[str, np.ndarray]) -> Any:
    from common.policy import create_policy

    policy = create_policy(cfg, spec, modes=("eval",), device="cpu")
    policy.set_weights(weights)
    return policy


def load(path: str | os.PathLike) -> Agent:
    """The policy saved in a run's ``final.pt`` / ``best.pt``, ready to act (on the CPU).

    Raises:
        coordinator.evaluate.EvalError: not such a file (a learner checkpoint, a bare
            state_dict, a corrupt or non-finite file: the message names it), or its env's
            spaces no longer match the ones it was trained on.
    """
    from common import spaces
    from common.config import compile_config
    from coordinator.evaluate import EvalError, load_saved

    saved = load_saved(path)
    if saved.config is None or saved.spaces is None:
        raise EvalError(f"{path}: a bare state_dict holds no config or spaces to rebuild its policy from; "
                        "load a run's final.pt or best.pt")
    cfg = compile_config({k: v for k, v in saved.config.items() if k != "create"}, saved.config.get("create"))
    spec = spaces.SpaceSpec.from_dict(dict(saved.spaces, env_id=cfg.env.env_id))
    try:
        spaces.check_model(cfg, spec)
        policy = _build(cfg, spec, {k: v.detach().float().numpy() for k, v in saved.weights.items()})
    except (ValueError, KeyError) as e:
        raise EvalError(f"{path}: {e}") from None
    return Agent(policy, saved.train_iter)


@dataclass
class TrainResult:
    """What ``rqrl train`` left: its exit code (0: converged), the run folder and its summary.json."""

    exit_code: int
    run_dir: Optional[Path]
    summary: dict[str, Any]


def train(config: str | os.PathLike, *, cwd: str | os.PathLike = ".", collectors: Optional[int] = None,
          redis_url: Optional[str] = None, name: Optional[str] = None, **overrides: Any) -> TrainResult:
    """Run ``rqrl train CONFIG`` to its end and return what it left.

    Args:
        config: a config file (``deploy/configs/*.py``).
        cwd: the folder the run folder goes below (``{cwd}/{exp_name}/{run_name}/``).
        collectors, redis_url, name: as ``--collectors``, ``--redis-url``, ``--name``.
        overrides: config keys, each as ``--set KEY=VALUE`` (``seed=3``; dotted keys through a
            dict: ``**{"policy.learn.batch_size": 64}``); values are Python literals.

    Returns:
        The exit code, as ``rqrl train``'s (0 converged; 2 stopped at a budget; 1 an error: a
        refused config or Redis, tasks that failed in a row; 130 interrupted),
        the run folder (None when no run started) and its summary.json ({} when none).

    Its output (progress line, closing block) goes to this process's stdout / stderr.
    """
    # -P: the run's folder is not put first on sys.path, so a user's common.py there cannot
    # shadow rqrl's own package of that name.
    argv = [sys.executable, "-P", "-m", "coordinator.cli", "train", str(Path(config).resolve())]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value!r}"]
    for flag, value in (("--collectors", collectors), ("--redis-url", redis_url), ("--name", name)):
        if value is not None:
            argv += [flag, str(value)]
    folder = Path(cwd)
    before = _run_folders(folder)
    code = subprocess.run(argv, cwd=folder, stdin=subprocess.DEVNULL).returncode
    made = sorted(_run_folders(folder) - before, key=lambda p: p.stat().st_mtime)
    run_dir = made[-1] if made else None
    summary_path = run_dir / "summary.json" if run_dir else None
    summary = json.loads(summary_path.read_text()) if summary_path and summary_path.is_file() else {}
    return TrainResult(code, run_dir, summary)


def _run_folders(folder: Path) -> set[Path]:
    """Every ``{exp_name}/{run_name}`` folder below ``folder`` (a run folder holds ``log/``).

    The ``{exp_name}/latest`` link is left out: it names a run folder already in the set.
    """
    return {p.parent for p in folder.glob("*/*/log") if p.is_dir() and not p.parent.is_symlink()}
