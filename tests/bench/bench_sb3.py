"""rqrl against Stable-Baselines3 with rl-zoo's hyperparameters: same env, env-step budget, seeds and
greedy evals; last eval and CPU seconds per 1,000 env steps of each side.

    pip install -e ".[bench]"      # stable-baselines3 + rl-zoo3 (never in the main install)
    python -m tests.bench.bench_sb3 --envs MountainCar-v0 LunarLander-v3 --seeds 0 1 --json out.json

Each side runs as a process tree of its own in a cgroup (v1 ``cpuacct``, as root; else the
waited-for children's rusage, which misses what a side's own children do not wait for, and the
output says which): its CPU seconds are everything it did, imports, evals, Redis and the
background teardown of ``rqrl train`` included, divided by the env-step budget.

- rqrl: the env's config in :data:`CONFIGS` (its preset, or for CartPole and Acrobot, whose presets
  have DI-engine's numbers, a config with rl-zoo's; Pendulum keeps its DI-engine preset, which
  scored higher in rqrl than rl-zoo's SAC numbers; two collector workers and one for evals as
  ``rqrl train`` starts them; each row records its ``config`` and the file's sha256), ``--seed S``, an unreachable stop value, the
  budget as ``commander.max_env_step``, an eval every ``--eval-every`` env steps on 5 greedy
  episodes (DQN: ``policy.eval.eps=0``, and SB3's plain-max target, ``policy.learn.double=False``,
  unless ``--double``; SAC evals play the mean action); its last eval is the closing eval at the
  budget (summary.json ``final_eval``); ``--rqrl-arg`` adds arguments (``--deterministic``: one
  collector, synchronous, as one process) and ``--rqrl-config`` trains another config file on the
  env. The DQN configs copy rl-zoo's numbers; Pendulum's SAC
  preset is DI-engine's (hidden 128, batch 128, 1,000 random env steps first), not rl-zoo's.
- SB3: rl-zoo3's ``hyperparams/dqn.yml`` entry for the env (``sac.yml`` for Pendulum-v1, SB3's
  ``SAC``; ``policy_kwargs`` as rl-zoo reads it), ``seed=S``, the same budget, and SB3's ``EvalCallback`` every ``--eval-every`` env steps
  on 5 deterministic episodes of a fresh env; ``--sb3-threads`` torch threads (default 1, as
  rqrl's learner and collectors: on a busy 2-core box torch's default of one per core spent
  5.65 CPU s per 1k env steps on MountainCar, much of it in threads waiting for each other).

Issue 34's goal: rqrl's median last eval >= SB3's; issue 35's: rqrl's CPU s per 1k env steps <= SB3's.
Each rqrl run also prints its learner process's share of the CPU (summary.json ``learner_cpu_s``;
the rest is the collectors, evals, coordinator, Redis and start-up), the learner's scheduler
and data waits, and the CPU of each part (:class:`ProcessCpu`: the cgroup's processes sampled
with psutil every 0.5 s, by :func:`process_kind`). After the runs, the learner task's loop is timed against the bare in-process loop
on each config (tests/bench/bench_learner_loop.py; ``--loop-repeats 0`` skips it): issue 35's
"learner train iters/s ÷ the in-process loop's", without the CPU the other processes take.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")
EVAL_EPISODES = 5
# rqrl's config beside SB3, per env: the env's preset where that is rl-zoo's numbers, else a config
# with rl-zoo's numbers (CartPole's and Acrobot's presets are DI-engine's, tuned to pass their stop
# value fast; Pendulum's rl-zoo numbers scored lower in rqrl than its DI-engine preset, SB3_WHY).
CONFIGS = {"MountainCar-v0": "mountaincar_dqn.py", "LunarLander-v3": "lunarlander_dqn.py",
           "CartPole-v1": "cartpole_dqn_zoo.py", "Acrobot-v1": "acrobot_dqn_zoo.py", "Pendulum-v1": "pendulum_sac.py"}
# The algorithm of each env's config: rl-zoo's hyperparams file and SB3's class of that name.
ALGOS = {"Pendulum-v1": "sac"}


def algo_of(env_id: str) -> str:
    """``dqn``, or the algorithm :data:`ALGOS` names for ``env_id``."""
    return ALGOS.get(env_id, "dqn")


def zoo_table(algo: str) -> dict[str, Any]:
    """rl-zoo3's ``hyperparams/{algo}.yml``."""
    import rl_zoo3
    import yaml

    return yaml.safe_load((Path(rl_zoo3.__file__).parent / "hyperparams" / f"{algo}.yml").read_text())


def zoo_kwargs(entry: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """SB3 ``DQN(...)`` / ``SAC(...)`` keyword arguments and the budget (env steps) from an rl-zoo
    ``dqn.yml`` / ``sac.yml`` entry: ``n_timesteps`` is the budget, ``policy_kwargs`` a ``dict(...)`` string as rl-zoo
    writes it; the other keys pass as they are.

    Raises:
        ValueError: an entry key that rl-zoo handles outside the algorithm (env wrappers,
            normalisation, frame stacks), which this benchmark does not reproduce (names it).
    """
    kwargs = dict(entry)
    budget = int(float(kwargs.pop("n_timesteps")))
    for key in ("env_wrapper", "normalize", "frame_stack", "n_envs", "callback", "vec_env_wrapper"):
        if key in kwargs:
            raise ValueError(f"rl-zoo key {key!r} is not reproduced by this benchmark")
    if isinstance(kwargs.get("policy_kwargs"), str):
        # rl-zoo evaluates this string from its own package data; dict literals only here.
        kwargs["policy_kwargs"] = eval(kwargs["policy_kwargs"], {"__builtins__": {}}, {"dict": dict})  # noqa: S307
    return kwargs, budget


def _process(pid: str) -> Any:
    """psutil's handle of ``pid``, None when it is gone already."""
    import psutil

    try:
        return psutil.Process(int(pid))
    except psutil.NoSuchProcess:
        return None


# A worker's role in its title: ``rqrl learner1 {ns}`` as forked, ``rq:worker:{exp}-learner1-{pid}: ...``
# once RQ names it.
_ROLE = re.compile(r"(?:^rqrl |-)(learner|collector)\d*[ -]")


def process_kind(cmdline: list[str]) -> str:
    """Which part of ``rqrl train`` a process is, from its command line or title: ``learner``
    (every rank), ``collectors`` (the eval worker included), ``coordinator``, ``redis``, or
    ``launcher`` (``rqrl train`` itself and anything else)."""
    title = " ".join(cmdline)
    if "redis-server" in title:
        return "redis"
    if title.startswith("rqrl coordinator"):
        return "coordinator"
    role = _ROLE.search(title) if title.startswith(("rq:worker:", "rqrl ")) else None
    if role is not None:
        return "learner" if role.group(1) == "learner" else "collectors"
    return "launcher"


class ProcessCpu:
    """CPU seconds of a cgroup's processes by :func:`process_kind`, sampled every ``every_s``
    seconds from a thread: a process counts with its last reading, so one that ends between two
    samples loses at most ``every_s`` of its CPU."""

    def __init__(self, group: Path, every_s: float = 0.5) -> None:
        import psutil

        self._group, self._every_s, self._psutil = group, every_s, psutil
        self._last: dict[int, tuple[str, float]] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self._every_s):
            self._sample()

    def _sample(self) -> None:
        try:
            pids = (self._group / "cgroup.procs").read_text().split()
        except OSError:
            return
        for proc in filter(None, map(_process, pids)):
            pid = proc.pid
            try:
                t = proc.cpu_times()
                kind = self._last[pid][0] if pid in self._last else "launcher"
                if kind == "launcher":  # a forked worker takes its title a moment after the fork
                    kind = process_kind(proc.cmdline())
                self._last[pid] = (kind, t.user + t.system)
            except self._psutil.Error:
                continue

    def stop(self) -> dict[str, float]:
        """Stop sampling, after one last reading of the processes still there; CPU seconds by kind."""
        self._done.set()
        self._thread.join()
        self._sample()
        by: dict[str, float] = {}
        for kind, cpu in self._last.values():
            by[kind] = by.get(kind, 0.0) + cpu
        return {k: round(v, 1) for k, v in by.items()}


def run_measured(cmd: list[str], cwd: Path, timeout_s: float, env: Optional[dict] = None,
                 split: bool = False) -> dict[str, Any]:
    """Run ``cmd`` to its end and its process tree's end: exit code, wall seconds and CPU seconds
    (cgroup ``cpuacct.usage`` of the whole tree, else the waited-for children's rusage); with
    ``split`` and a cgroup also ``cpu_by_process``, the tree's CPU by :func:`process_kind`."""
    group = CGROUP_ROOT / f"rqrl-bench-{os.getpid()}-{time.monotonic_ns()}"
    try:
        group.mkdir()
    except OSError:
        group = None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    if group is not None:
        # The shell joins the group before it execs the command, so every descendant is counted.
        cmd = ["sh", "-c", f'echo $$ > "{group}/cgroup.procs" && exec "$@"', "sh", *cmd]
    sampler = ProcessCpu(group) if group is not None and split else None
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.monotonic() - t0
    by_process: dict[str, float] = {}
    if group is not None:
        import psutil

        deadline = time.monotonic() + 120
        # rqrl train's background teardown outlives it: wait for every process left in the group.
        while (pids := (group / "cgroup.procs").read_text().split()) and time.monotonic() < deadline:
            psutil.wait_procs([p for p in map(_process, pids) if p is not None],
                              timeout=max(0.1, deadline - time.monotonic()))
        cpu, how = int((group / "cpuacct.usage").read_text()) / 1e9, "cgroup"
        if sampler is not None:
            by_process = sampler.stop()
        group.rmdir()
    else:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu, how = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), "rusage"
    return {"rc": proc.returncode, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cpu_by": how,
            "tail": (proc.stdout + proc.stderr)[-2000:], **({"cpu_by_process": by_process} if by_process else {})}


def rqrl_side(env_id: str, seed: int, budget: int, eval_every: int, double: bool, work: Path,
              extra: tuple[str, ...] = (), config: Optional[Path] = None, keep: Optional[Path] = None) -> dict[str, Any]:
    exp = f"bench_sb3_{env_id.replace('-', '_').lower()}"
    config = config or REPO / "deploy" / "configs" / CONFIGS[env_id]
    cmd = [sys.executable, "-m", "coordinator.cli", "train", str(config), "--seed", str(seed),
           "--set", f"env.env_id={env_id}", "--set", f"exp_name={exp}", "--set", "env.stop_value=1e9",
           "--set", f"commander.max_env_step={budget}", "--set", "commander.max_wall_seconds=0",
           "--set", f"commander.eval_every_env_step={eval_every}", "--set", "commander.eval_every_train_iter=0",
           "--set", "commander.eval_interval=0", "--set", f"env.n_evaluator_episode={EVAL_EPISODES}"]
    if algo_of(env_id) == "dqn":  # greedy evals (SAC's evals play the mean action already)
        cmd += ["--set", "policy.eval.eps=0.0", "--set", f"policy.learn.double={double}"]
    cmd += list(extra)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = run_measured(cmd, work, timeout_s=max(1800, budget / 20), env=env, split=True)
    run = work / exp / "latest"
    if keep is not None and (run / "final.pt").is_file():
        shutil.copyfile(run / "final.pt", keep / f"rqrl_{env_id}_s{seed}.pt")
    summary = json.loads((run / "summary.json").read_text())
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines() if line.strip()]
    scored = [e for e in evals if e.get("reward_mean") is not None]
    # The file's content too: a config edited after a run must not pass for what that run trained.
    out.update(config=config.relative_to(REPO).as_posix() if config.is_relative_to(REPO) else str(config),
               config_sha256=hashlib.sha256(config.read_bytes()).hexdigest(),
               envstep=summary["envstep"], train_iter=summary["train_iter"], learner_cpu_s=summary.get("learner_cpu_s"),
               learner_train_iter_per_sec=summary.get("learner_train_iter_per_sec"),
               learner_sched_wait_share=summary.get("learner_sched_wait_share"),
               learner_wait_share=summary.get("learner_wait_share"),
               last_eval=scored[-1]["reward_mean"] if scored else None,
               last_eval_envstep=scored[-1].get("envstep") if scored else None, evals=len(scored))
    return out


def sb3_side(env_id: str, seed: int, budget: int, eval_every: int, threads: int, work: Path,
             keep: Optional[Path] = None) -> dict[str, Any]:
    result = work / f"sb3_{env_id}_{seed}.json"
    cmd = [sys.executable, "-m", "tests.bench.bench_sb3", "--sb3-child", env_id, "--seeds", str(seed),
           "--eval-every", str(eval_every), "--budget", str(budget), "--sb3-threads", str(threads),
           "--json", str(result), *(["--keep", str(keep)] if keep is not None else [])]
    # SB3's learn() makes its log folder under SB3_LOGDIR, else a new /tmp/SB3-<time> left behind.
    out = run_measured(cmd, REPO, timeout_s=3600, env=dict(os.environ, SB3_LOGDIR=str(work)))
    if out["rc"] == 0:
        out.update(json.loads(result.read_text()))
    return out


def sb3_child(env_id: str, seed: int, eval_every: int, budget: int, threads: int, result: Path,
              keep: Optional[Path] = None) -> None:
    """Train SB3's DQN or SAC (:func:`algo_of`) with rl-zoo's hyperparameters and write the evals to
    ``result`` (and, with ``keep``, the model to ``keep/sb3_{env_id}_s{seed}.zip``)."""
    import gymnasium as gym
    import stable_baselines3
    import torch
    from stable_baselines3.common.callbacks import EvalCallback
    from stable_baselines3.common.monitor import Monitor

    torch.set_num_threads(threads)
    algo = algo_of(env_id)
    kwargs, zoo_budget = zoo_kwargs(zoo_table(algo)[env_id])
    budget = budget or zoo_budget
    policy = kwargs.pop("policy")
    model = getattr(stable_baselines3, algo.upper())(policy, gym.make(env_id), seed=seed, verbose=0, **kwargs)
    evals: list[dict[str, float]] = []

    class Record(EvalCallback):
        def _on_step(self) -> bool:
            go = super()._on_step()
            if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
                evals.append({"envstep": self.num_timesteps, "reward_mean": float(self.last_mean_reward)})
            return go

    model.learn(budget, callback=Record(Monitor(gym.make(env_id)), eval_freq=eval_every,
                                        n_eval_episodes=EVAL_EPISODES, deterministic=True, verbose=0))
    if keep is not None:
        model.save(keep / f"sb3_{env_id}_s{seed}.zip")
    result.write_text(json.dumps({"envstep": int(model.num_timesteps), "last_eval": evals[-1]["reward_mean"],
                                  "last_eval_envstep": evals[-1]["envstep"], "evals": len(evals), "budget": budget,
                                  "curve": evals}))


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=["MountainCar-v0", "LunarLander-v3"], choices=sorted(CONFIGS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--eval-every", type=int, default=10_000, help="env steps between evals (both sides)")
    ap.add_argument("--budget", type=int, default=0, help="env steps (default: rl-zoo's n_timesteps)")
    ap.add_argument("--double", action="store_true", help="rqrl with its double-DQN target (SB3 has none)")
    ap.add_argument("--sb3-threads", type=int, default=1, help="torch threads of the SB3 side")
    ap.add_argument("--sides", nargs="+", default=["rqrl", "sb3"], choices=["rqrl", "sb3"])
    ap.add_argument("--rqrl-config", default=None, help="the rqrl side's config file instead of the env's in CONFIGS")
    ap.add_argument("--rqrl-arg", action="append", default=[], metavar="ARG",
                    help="one more argument of the rqrl side's rqrl train (repeat it), e.g. --rqrl-arg=--deterministic")
    ap.add_argument("--loop-repeats", type=int, default=16,
                    help="blocks per side of the learner-loop part (tests/bench/bench_learner_loop.py); 0: skip it")
    ap.add_argument("--keep", default=None, metavar="DIR",
                    help="keep each run's final policy in DIR (rqrl_ENV_sSEED.pt, sb3_ENV_sSEED.zip) for "
                         "tests/bench/bench_shared_episodes.py")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sb3-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.sb3_child:
        sb3_child(args.sb3_child, args.seeds[0], args.eval_every, args.budget, args.sb3_threads, Path(args.json),
                  Path(args.keep) if args.keep else None)
        return {}
    config = Path(args.rqrl_config).resolve() if args.rqrl_config else None
    keep = Path(args.keep).resolve() if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    # Recorded so the results page can refuse a run that is not the preset's (results.add_sb3).
    rqrl_args = args.rqrl_arg + (["--rqrl-config", args.rqrl_config] if config else [])
    out: dict[str, Any] = {"load_average_start": os.getloadavg(), "double": args.double,
                           "sb3_threads": args.sb3_threads, "rqrl_args": rqrl_args, "runs": []}
    for env_id in args.envs:
        budget = args.budget or zoo_kwargs(zoo_table(algo_of(env_id))[env_id])[1]
        for seed in args.seeds:
            for side in args.sides:  # one after the other: the sides never share the cores
                with tempfile.TemporaryDirectory(prefix="rqrl-bench-sb3-") as tmp:
                    row = (rqrl_side(env_id, seed, budget, args.eval_every, args.double, Path(tmp),
                                     tuple(args.rqrl_arg), config, keep) if side == "rqrl"
                           else sb3_side(env_id, seed, budget, args.eval_every, args.sb3_threads, Path(tmp), keep))
                row.update(env=env_id, seed=seed, side=side, budget=budget,
                           cpu_s_per_1k=round(row["cpu_s"] / budget * 1000, 2), load_average=os.getloadavg())
                out["runs"].append(row)
                print(f"{env_id:<15} seed {seed} {side:<4} rc {row['rc']}  last eval {row.get('last_eval')} "
                      f"at {row.get('last_eval_envstep')}  CPU {row['cpu_s']} s ({row['cpu_by']}) = "
                      f"{row['cpu_s_per_1k']} s per 1k env steps  wall {row['wall_s']} s"
                      + (f"  (learner {row['learner_cpu_s']} s, {row['learner_cpu_s'] / row['cpu_s']:.0%}; "
                         f"rest {row['cpu_s'] - row['learner_cpu_s']:.1f} s; learner sched wait "
                         f"{row.get('learner_sched_wait_share')}, data wait {row.get('learner_wait_share')})"
                         if row.get("learner_cpu_s") else "")
                      + ("  CPU s by process: " + ", ".join(f"{k} {v}" for k, v in sorted(row["cpu_by_process"].items()))
                         if row.get("cpu_by_process") else ""), flush=True)
    print("\n| env | budget | rqrl last eval (median) | SB3 last eval (median) | rqrl CPU s / 1k | SB3 CPU s / 1k | ratio |")
    print("|---|---|---|---|---|---|---|")
    for env_id in args.envs:
        rows = {s: [r for r in out["runs"] if r["env"] == env_id and r["side"] == s and reached_budget(r)]
                for s in ("rqrl", "sb3")}
        med = {s: (statistics.median([r["last_eval"] for r in rs if r.get("last_eval") is not None] or [float("nan")]),
                   statistics.median([r["cpu_s_per_1k"] for r in rs] or [float("nan")])) for s, rs in rows.items()}
        ratio = med["rqrl"][1] / med["sb3"][1] if med["sb3"][1] == med["sb3"][1] and med["sb3"][1] else float("nan")
        print(f"| {env_id} | {rows['rqrl'][0]['budget'] if rows['rqrl'] else '-'} | {med['rqrl'][0]:.1f} | "
              f"{med['sb3'][0]:.1f} | {med['rqrl'][1]:.2f} | {med['sb3'][1]:.2f} | {ratio:.2f} |")
    if args.loop_repeats > 0 and "rqrl" in args.sides:
        # Issue 35's other figure, in the same run: the learner task's loop against the bare
        # in-process loop on each preset (tests/bench/bench_learner_loop.py).
        from tests.bench import bench_learner_loop

        out["learner_loop"] = []
        for env_id in args.envs:
            res = bench_learner_loop.measure(CONFIGS[env_id].removesuffix(".py"), repeats=args.loop_repeats)
            bench_learner_loop.report(res)
            out["learner_loop"].append(res)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


def reached_budget(row: dict[str, Any]) -> bool:
    """Whether a run row ran to its budget: exit 0, or rqrl's 2 (the unreachable stop value not met)."""
    return row["rc"] == 0 or (row["side"] == "rqrl" and row["rc"] == 2)


if __name__ == "__main__":
    result = main()
    sys.exit(0 if all(reached_budget(r) for r in result.get("runs", [])) else 1)
