"""Final policies of rqrl and SB3 on the same episodes: how much of a gap between two 5-episode
last evals the start states alone make.

    python -m tests.bench.bench_sb3 --envs Pendulum-v1 --seeds 0 1 --keep /tmp/keep --loop-repeats 0
    python -m tests.bench.bench_shared_episodes /tmp/keep/* --episodes 100 --json out.json

Every policy plays the same ``--episodes`` episodes: a fresh env of its run's env id reset with
seeds ``--first-seed`` + i, acting deterministically (rqrl's ``final.pt`` through
:func:`rqrl.load`, ``act(obs)``; SB3's ``.zip`` through its class's ``load``, ``predict(obs,
deterministic=True)``). Per policy it prints the mean return over all episodes, and the median
[min, max] of the means of consecutive groups of 5 (what bench_sb3's last eval averages): the
spread a 5-episode eval has from the start states alone.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

GROUP = 5  # episodes per eval, as bench_sb3.EVAL_EPISODES


def group_means(returns: list[float], size: int = GROUP) -> list[float]:
    """Means of consecutive groups of ``size`` returns (a partial last group is dropped).

    Raises:
        ValueError: fewer than ``size`` returns.
    """
    if len(returns) < size:
        raise ValueError(f"{len(returns)} episode returns: need at least {size} for one group")
    return [float(np.mean(returns[i:i + size])) for i in range(0, len(returns) - size + 1, size)]


def _actor(path: Path) -> tuple[str, Callable[[np.ndarray], Any]]:
    """(env id, act) of a kept policy: ``rqrl_ENV_sSEED.pt`` or ``sb3_ENV_sSEED.zip``."""
    m = re.fullmatch(r"rqrl_(.+)_s\d+\.pt|sb3_(.+)_s\d+\.zip", path.name)
    if m is None:
        raise ValueError(f"{path}: not a bench_sb3 --keep file (rqrl_ENV_sSEED.pt or sb3_ENV_sSEED.zip)")
    env_id = m.group(1) or m.group(2)
    if m.group(1):
        import rqrl

        agent = rqrl.load(path)
        return env_id, agent.act
    import stable_baselines3

    from tests.bench.bench_sb3 import algo_of

    model = getattr(stable_baselines3, algo_of(env_id).upper()).load(path, device="cpu")
    return env_id, lambda obs: model.predict(obs, deterministic=True)[0]


def play(path: Path, episodes: int, first_seed: int) -> dict[str, Any]:
    """The returns of the policy at ``path`` on episodes reset with seeds first_seed .. first_seed + episodes - 1."""
    import gymnasium as gym

    env_id, act = _actor(path)
    env = gym.make(env_id)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=first_seed + i)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    means = group_means(returns)
    return {"policy": path.name, "env": env_id, "episodes": episodes, "first_seed": first_seed,
            "mean": float(np.mean(returns)), "group_means": means, "returns": returns}


def main(argv: Optional[list[str]] = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policies", nargs="+", type=Path)
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--first-seed", type=int, default=10_000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = [play(p, args.episodes, args.first_seed) for p in sorted(args.policies)]
    print(f"| policy | mean over {args.episodes} episodes | 5-episode means: median [min, max] |")
    print("|---|---:|---|")
    for r in rows:
        g = r["group_means"]
        print(f"| {r['policy']} | {r['mean']:.1f} | {statistics.median(g):.1f} [{min(g):.1f}, {max(g):.1f}] |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
