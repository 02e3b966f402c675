"""Tuned presets: ``rqrl train --env ID [--algo NAME]`` picks a config file by env id.

Each preset is a shipped config file under ``deploy/configs/``; the file's docstring cites where
its hyperparameters come from (rl-zoo, CleanRL, DI-engine, the MinAtar paper) and what stops a
run (``env.stop_value``, and a budget where the published runs have one). An env id's first
preset below is the one ``--env`` takes without ``--algo``. tests/unit/test_presets.py builds
every preset, checks its env's spaces against its network and that the table agrees with the
files.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

# The repository's deploy/configs/ (rqrl is installed from its checkout: pip install -e .).
CONFIG_DIR = Path(__file__).resolve().parents[1] / "deploy" / "configs"


@dataclass(frozen=True)
class Preset:
    """One tuned config.

    Attributes:
        env_id: the gymnasium id, exactly as ``env.env_id`` in the file.
        algo: the algorithm (``create_config.policy.type`` in the file).
        config: the file's name in ``deploy/configs/``.
        family: the env's group (for listings and docs/results.md).
        extra: the pip extra its env needs (``""``: none beyond the base install).
    """

    env_id: str
    algo: str
    config: str
    family: str
    extra: str = ""

    @property
    def path(self) -> Path:
        return CONFIG_DIR / self.config


PRESETS: tuple[Preset, ...] = (
    Preset("CartPole-v1", "dqn", "cartpole_dqn.py", "classic control"),
    Preset("CartPole-v1", "ppo", "cartpole_ppo.py", "classic control"),
    Preset("Acrobot-v1", "dqn", "acrobot_dqn.py", "classic control"),
    Preset("MountainCar-v0", "dqn", "mountaincar_dqn.py", "classic control"),
    Preset("Pendulum-v1", "sac", "pendulum_sac.py", "classic control"),
    Preset("LunarLander-v3", "dqn", "lunarlander_dqn.py", "classic control", "box2d"),
    Preset("MinAtar/Breakout-v1", "dqn", "minatar_breakout_dqn.py", "MinAtar", "minatar"),
    Preset("MinAtar/SpaceInvaders-v1", "ppo", "minatar_space_invaders_ppo.py", "MinAtar", "minatar"),
    Preset("ALE/Pong-v5", "dqn", "pong_dqn.py", "Atari", "atari"),
    Preset("ALE/Breakout-v5", "ppo", "breakout_ppo.py", "Atari", "atari"),
    Preset("HalfCheetah-v5", "sac", "halfcheetah_sac.py", "MuJoCo", "mujoco"),
    Preset("Hopper-v5", "sac", "hopper_sac.py", "MuJoCo", "mujoco"),
)


class NoPreset(ValueError):
    """No preset fits ``--env`` / ``--algo``; the message lists the presets."""


def listing() -> str:
    """The presets as aligned text, one env id a line: its algorithms (the default first), extra."""
    ids = list(dict.fromkeys(p.env_id for p in PRESETS))
    width = max(len(i) for i in ids)
    lines = []
    for env_id in ids:
        mine = [p for p in PRESETS if p.env_id == env_id]
        algos = ", ".join(f"{p.algo} ({p.config})" for p in mine)
        extra = f"   [needs the {mine[0].extra} extra]" if mine[0].extra else ""
        lines.append(f"  {env_id:<{width}}  {algos}{extra}")
    return "\n".join(lines)


def find(env_id: str, algo: str | None = None) -> Preset:
    """The preset for ``env_id`` (and ``algo``; without it the env's first preset).

    Raises:
        NoPreset: no preset for that env id (with the closest ids), or none with that algorithm
            for it; the message lists every preset and how to train any other env (a config file
            with ``--set env.env_id=...``).
    """
    mine = [p for p in PRESETS if p.env_id == env_id]
    if not mine:
        ids = list(dict.fromkeys(p.env_id for p in PRESETS))
        near = difflib.get_close_matches(env_id, ids, n=1, cutoff=0.5)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise NoPreset(f"no preset for --env {env_id!r}{hint} Presets (--env ID [--algo NAME]):\n{listing()}\n"
                       "Any other gymnasium env trains from a config file: "
                       f"rqrl train deploy/configs/cartpole_dqn.py --set env.env_id={env_id} --set env.stop_value=...")
    if algo is None:
        return mine[0]
    for p in mine:
        if p.algo == algo.lower():
            return p
    have = ", ".join(p.algo for p in mine)
    raise NoPreset(f"no {algo!r} preset for --env {env_id!r} (it has: {have}). Presets (--env ID [--algo NAME]):\n"
                   f"{listing()}\nOr start from another algorithm's config file with --set env.env_id={env_id}")
