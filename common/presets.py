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
import importlib.util
from dataclasses import dataclass
from pathlib import Path

# The repository's deploy/configs/ (rqrl is installed from its checkout: pip install -e .).
CONFIG_DIR = Path(__file__).resolve().parents[1] / "deploy" / "configs"

# The module each pip extra brings (box2d's is Box2D; the others are named as their extra).
EXTRA_MODULE = {"box2d": "Box2D", "atari": "ale_py", "mujoco": "mujoco", "minatar": "minatar", "league": "pettingzoo"}


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

    @property
    def missing_extra(self) -> str:
        """The pip extra this preset needs and this environment lacks (``""``: none)."""
        if self.extra and importlib.util.find_spec(EXTRA_MODULE[self.extra]) is None:
            return self.extra
        return ""


PRESETS: tuple[Preset, ...] = (
    Preset("CartPole-v1", "dqn", "cartpole_dqn.py", "classic control"),
    Preset("CartPole-v1", "ppo", "cartpole_ppo.py", "classic control"),
    Preset("CartPole-v1", "impala", "cartpole_impala.py", "classic control"),
    Preset("Acrobot-v1", "dqn", "acrobot_dqn.py", "classic control"),
    Preset("MountainCar-v0", "dqn", "mountaincar_dqn.py", "classic control"),
    Preset("Pendulum-v1", "sac", "pendulum_sac.py", "classic control"),
    Preset("LunarLander-v3", "dqn", "lunarlander_dqn.py", "classic control", "box2d"),
    Preset("MinAtar/Breakout-v1", "dqn", "minatar_breakout_dqn.py", "MinAtar", "minatar"),
    Preset("MinAtar/Breakout-v1", "impala", "minatar_breakout_impala.py", "MinAtar", "minatar"),
    Preset("MinAtar/SpaceInvaders-v1", "ppo", "minatar_space_invaders_ppo.py", "MinAtar", "minatar"),
    Preset("MinAtar/SpaceInvaders-v1", "impala", "minatar_space_invaders_impala.py", "MinAtar", "minatar"),
    Preset("ALE/Pong-v5", "dqn", "pong_dqn.py", "Atari", "atari"),
    Preset("ALE/Breakout-v5", "ppo", "breakout_ppo.py", "Atari", "atari"),
    Preset("ALE/Breakout-v5", "impala", "breakout_impala.py", "Atari", "atari"),
    Preset("HalfCheetah-v5", "sac", "halfcheetah_sac.py", "MuJoCo", "mujoco"),
    Preset("Hopper-v5", "sac", "hopper_sac.py", "MuJoCo", "mujoco"),
    Preset("rqrl/ConnectFour-v0", "ppo", "connect_four_ppo.py", "two-player games", "league"),
)


class NoPreset(ValueError):
    """No preset fits ``--env`` / ``--algo``; the message lists the presets."""


def goal(preset: Preset) -> str:
    """What ends a run of ``preset``: ``stop 195, 300 s`` (its ``env.stop_value`` and the budget
    that its ``commander`` sets: env steps, train iterations or wall seconds; ``no budget``)."""
    from common.config import load_config  # the config's own imports: not for the Makefile's look-up

    cfg = load_config(preset.path)
    c = cfg.commander
    budgets = [f"{_count(c.max_env_step)} env steps" if c.max_env_step else "",
               f"{_count(c.max_train_iter)} train iters" if c.max_train_iter else "",
               f"{c.max_wall_seconds:g} s" if c.max_wall_seconds else ""]
    return f"stop {cfg.env.stop_value:g}, " + (" or ".join(b for b in budgets if b) or "no budget")


def _count(n: int) -> str:
    """``100k``, ``5M``, ``1,500``: a budget in the README's words."""
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n:,}"


def listing() -> str:
    """The presets as aligned text, one env id a line: its algorithms (the default first), what
    ends a run (:func:`goal`, per algorithm where they differ), and the pip extra it needs where
    this environment does not have it installed."""
    ids = list(dict.fromkeys(p.env_id for p in PRESETS))
    width = max(len(i) for i in ids)
    lines = []
    for env_id in ids:
        mine = [p for p in PRESETS if p.env_id == env_id]
        goals = [goal(p) for p in mine]
        if len(set(goals)) == 1:
            algos = ", ".join(f"{p.algo} ({p.config})" for p in mine) + f"; {goals[0]}"
        else:
            algos = ", ".join(f"{p.algo} ({p.config}; {g})" for p, g in zip(mine, goals))
        missing = mine[0].missing_extra
        extra = f"   [needs the {missing} extra: pip install -e \".[{missing}]\"]" if missing else ""
        lines.append(f"  {env_id:<{width}}  {algos}{extra}")
    return "\n".join(lines)


def _not_registered(env_id: str) -> str:
    """Why gymnasium's registry surely lacks ``env_id`` (its own words), or ``""`` where it may have
    it: a ``namespace/`` or ``module:`` id registers on import, so only plain ids are looked up."""
    if "/" in env_id or ":" in env_id:
        return ""
    import gymnasium as gym

    try:
        gym.spec(env_id)
    except gym.error.Error as e:
        return str(e)
    return ""


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
        missing = _not_registered(env_id)
        other = (f"rqrl train deploy/configs/cartpole_dqn.py --set env.env_id=ID --set env.stop_value=... "
                 f"(not with {env_id!r}: {missing})" if missing else
                 f"rqrl train deploy/configs/cartpole_dqn.py --set env.env_id={env_id} --set env.stop_value=...")
        raise NoPreset(f"no preset for --env {env_id!r}{hint} Presets (--env ID [--algo NAME]):\n{listing()}\n"
                       f"Any other gymnasium env trains from a config file: {other}")
    if algo is None:
        return mine[0]
    for p in mine:
        if p.algo == algo.lower():
            return p
    have = ", ".join(p.algo for p in mine)
    raise NoPreset(f"no {algo!r} preset for --env {env_id!r} (it has: {have}). Presets (--env ID [--algo NAME]):\n"
                   f"{listing()}\nOr start from another algorithm's config file with --set env.env_id={env_id}")


def extra_for(target: str) -> str:
    """The pip extra that ``make train`` installs for ``target``: a preset's env id (``--env``) or a
    config file (matched to a preset by its file name); ``""`` for none (CartPole) or a config of
    the user's own (a run that needs an extra names it at start)."""
    if any(p.env_id == target for p in PRESETS):
        return find(target).extra
    name = Path(target).name
    return next((p.extra for p in PRESETS if p.config == name), "")


if __name__ == "__main__":
    # The Makefile asks before any environment exists: this module imports the standard library only.
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "--extra":
        sys.exit("usage: python -m common.presets --extra ENV_ID|CONFIG_FILE")
    print(extra_for(sys.argv[2]))

