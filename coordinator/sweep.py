"""``rqrl sweep CONFIG --seeds 0-4``: the seeds of one config as concurrent runs on one Redis and
one shared worker fleet, then a table and a plot across seeds.

Each seed is an ordinary run (``./{exp_name}/{run_name}/``, its own coordinator and Redis key
namespace, see coordinator/runs.py). The fleet: one ``rq worker learner`` per seed (a learner
task lasts its run) and ``--collectors`` + 1 ``rq worker collector`` (the extra one for eval
tasks, which go to the front of the queue). Fair share: each run may hold at most
``collectors // seeds`` (at least 1) collector tasks at once (``commander.collector_task_space``).

When every run has ended, each run's ``final.pt`` is re-evaluated on ``--eval-episodes`` fresh
episodes (episode seeds no run used), and the sweep folder ``./{exp_name}/sweep-{UTC time}/``
gets ``sweep.json`` and ``sweep.md`` (per seed: exit, time to solve, env steps, train
iterations, re-eval mean ± std; median and min-max across seeds) and ``sweep.png`` (eval return
against env steps: mean over the seeds and their min-max band).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import redis
from easydict import EasyDict

from common import events, keys, streams
from coordinator import runs
from coordinator.launcher import Launcher, Progress, _coordinator_main

# Episode seeds of the re-evaluation: far from the small seeds training and its evals use.
REEVAL_SEED_BASE = 1_000_000


def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` -> [0, 1, 2, 3, 4]; ``"1,3,7"`` and mixes like ``"0-2,9"`` too.

    Raises:
        ValueError: not a list of non-negative integers and ranges, a range going down, or a
            seed given twice.
    """
    seeds: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ValueError(f"--seeds {text!r}: {part!r} is not N or N-M") from None
        if a < 0 or b < a:
            raise ValueError(f"--seeds {text!r}: {part!r} must be non-negative and not go down")
        seeds.extend(range(a, b + 1))
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: a seed is given twice")
    return seeds


def _spread(values: list[float]) -> dict[str, Optional[float]]:
    """Median, min and max of ``values`` (None each when empty)."""
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": float(statistics.median(values)), "min": float(min(values)), "max": float(max(values))}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Across seeds: how many solved, and median / min / max of time to solve (seconds, solved
    runs only), env steps and train iterations (solved runs only, when any solved; else all
    runs) and the re-evaluation mean of final.pt (every run that has one)."""
    solved = [r for r in rows if r["solved"]]
    pool = solved or rows
    return {
        "seeds": len(rows), "solved": len(solved),
        "time_to_solve_s": _spread([r["wall_seconds"] for r in solved]),
        "env_steps": _spread([float(r["envstep"]) for r in pool]),
        "train_iter": _spread([float(r["train_iter"]) for r in pool]),
        "reeval_mean": _spread([r["reeval_mean"] for r in rows if r["reeval_mean"] is not None]),
        "figures_over": "solved runs" if solved else "all runs (none solved)",
    }


def git_commit(checkout: Optional[Path] = None) -> Optional[str]:
    """The short commit of rqrl's checkout (``checkout``: a folder in another one), with ``-dirty``
    when tracked files differ from it: a sweep of uncommitted code must not pass for the commit's.
    None outside a git checkout."""
    cwd = checkout or Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd,
                              capture_output=True, text=True, timeout=5).stdout.strip()
        if not head:
            return None
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                 capture_output=True, text=True, timeout=5).stdout.strip()
        return f"{head}-dirty" if changed else head
    except (OSError, subprocess.SubprocessError):
        return None


def machine(gpu: Optional[str] = None, commit: Optional[str] = None) -> dict[str, Any]:
    """What the sweep ran on, for sweep.json and docs/results.md: CPU model and count, memory
    (GiB), load average at the end (1 min; a busy machine slows every run), OS, Python and torch
    versions, the GPU (None: none was used; the learner trains on CUDA only with policy.cuda) and
    rqrl's commit (``commit``, else the checkout's now; None outside a git checkout)."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        mem_gib = None
    return {"cpu": cpu, "cpus": os.cpu_count(), "memory_gib": mem_gib, "load_1min": round(os.getloadavg()[0], 2),
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "torch": torch.__version__.split("+")[0], "gpu": gpu, "commit": commit or git_commit()}


def _fmt(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def render_markdown(title: str, rows: list[dict[str, Any]], summary: dict[str, Any], stop_value: Any,
                    episodes: int) -> str:
    """The table as markdown: one row per seed, then median [min, max] across seeds."""
    lines = [f"## {title}", "",
             f"stop_value {stop_value}; final.pt re-evaluated on {episodes} fresh episodes per seed.", "",
             "| seed | run | exit | solved | time to solve (s) | env steps | train iters | re-eval of final.pt |",
             "| ---: | --- | ---: | :---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        reeval = "-" if r["reeval_mean"] is None else f"{r['reeval_mean']:.1f} ± {r['reeval_std']:.1f}"
        lines.append(f"| {r['seed']} | {r['run_name']} | {r['exit_code']} | {'yes' if r['solved'] else 'no'} | "
                     f"{_fmt(r['wall_seconds']) if r['solved'] else '-'} | {r['envstep']:,} | {r['train_iter']:,} | "
                     f"{reeval} |")

    def cell(key: str, spec: str) -> str:
        s = summary[key]
        return "-" if s["median"] is None else f"{format(s['median'], spec)} [{format(s['min'], spec)}, {format(s['max'], spec)}]"

    lines += ["", f"Across seeds, median [min, max] ({summary['figures_over']} for time, env steps, train iters):", "",
              "| solved | time to solve (s) | env steps | train iters | re-eval of final.pt |",
              "| :---: | ---: | ---: | ---: | ---: |",
              f"| {summary['solved']}/{summary['seeds']} | {cell('time_to_solve_s', '.1f')} | {cell('env_steps', ',.0f')} "
              f"| {cell('train_iter', ',.0f')} | {cell('reeval_mean', '.1f')} |"]
    return "\n".join(lines) + "\n"


def band(curves: list[list[tuple[float, float]]], points: int = 200) -> tuple[list[float], list[float], list[float], list[float]]:
    """Mean and min-max of eval return across runs on a common env-step grid.

    Args:
        curves: per run, ``(env steps, reward_mean)`` points in any order.
        points: grid size, from 0 to the largest env step of any run.

    Returns:
        ``(grid, mean, lo, hi)``: each run is interpolated linearly between its evals and counts
        only within its own env-step range (a run that solved early does not pull the mean
        after its end); grid points no run covers are dropped.
    """
    import numpy as np

    curves = [sorted(c) for c in curves if c]
    if not curves:
        return [], [], [], []
    top = max(c[-1][0] for c in curves)
    grid = np.linspace(0.0, top, points)
    stack = np.full((len(curves), points), np.nan)
    for i, c in enumerate(curves):
        x, y = np.array([p[0] for p in c]), np.array([p[1] for p in c])
        inside = (grid >= x[0]) & (grid <= x[-1])
        stack[i, inside] = np.interp(grid[inside], x, y)
    keep = ~np.all(np.isnan(stack), axis=0)
    stack, grid = stack[:, keep], grid[keep]
    return (grid.tolist(), np.nanmean(stack, axis=0).tolist(), np.nanmin(stack, axis=0).tolist(),
            np.nanmax(stack, axis=0).tolist())


def plot_sweep(curves: dict[int, list[tuple[float, float]]], stop_value: Optional[float], path: Path, title: str) -> Path:
    """``sweep.png``: eval return against env steps, mean across seeds with a min-max band, and
    each seed's evals as a thin line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    grid, mean, lo, hi = band(list(curves.values()))
    for seed, c in sorted(curves.items()):
        c = sorted(c)
        ax.plot([p[0] for p in c], [p[1] for p in c], linewidth=0.8, alpha=0.45, label=f"seed {seed}")
    if grid:
        ax.fill_between(grid, lo, hi, alpha=0.2, color="tab:blue", linewidth=0, label="min-max across seeds")
        ax.plot(grid, mean, color="tab:blue", linewidth=2, label=f"mean of {len(curves)} seeds")
    else:
        ax.text(0.5, 0.5, "no evaluations", transform=ax.transAxes, ha="center", va="center", color="gray")
    if stop_value is not None:
        ax.axhline(float(stop_value), color="tab:red", linestyle="--", linewidth=1, label=f"stop value {float(stop_value):g}")
    ax.set_xlim(left=0)
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval episode return")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small", framealpha=0.6)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def run_curve(run_dir: Path) -> list[tuple[float, float]]:
    """``(env steps, eval reward_mean)`` of each eval in a run folder's ``evals.jsonl`` that
    finished an episode (the others have no reward and no point), in file order."""
    path = run_dir / "evals.jsonl"
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.is_file() else []
    return [(float(r["envstep"]), reward) for r in rows
            if (reward := events.episode_figure(r, "reward_mean")) is not None]


def sweep_line(progress: dict[int, Progress], seconds: float) -> str:
    """The sweep's progress line: per seed its env steps and last eval reward, each labelled
    (``-``: no eval yet, or the last one finished no episode), then the sweep's wall time."""
    def ev(p: Progress) -> str:
        return "-" if p.eval is None else f"{p.eval:g}"

    stop = next(iter(progress.values())).stop_value if progress else None
    return (" | ".join(f"seed {s}: {p.envstep:,} env steps, eval {ev(p)}" for s, p in progress.items())
            + (f" (stop_value {stop:g})" if stop is not None else "") + f" | {seconds:.0f} s")


class Sweep(Launcher):
    """Runs the seeds of one config at once on one Redis and one worker fleet (module docstring).

    Args:
        cfg: the compiled config (any seed: exp_name, stop_value and the eval slot are read).
        config_path: the config file handed to every coordinator.
        redis_url: an existing Redis, or None for a private one.
        collectors: collector tasks at once across the sweep.
        coordinator_args: extra arguments for every ``python -m coordinator`` (``--set``).
        seeds: one run per seed.
        eval_episodes: episodes of the re-evaluation of each final.pt (0: none).
    """

    def __init__(self, cfg: EasyDict, config_path: str, redis_url: Optional[str], collectors: int,
                 coordinator_args: list[str], seeds: list[int], eval_episodes: int = 20, out_dir: str = ".",
                 started_at: Optional[float] = None) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.sweep_dir = runs.reserve_free_dir(Path(out_dir) / cfg.exp_name, f"sweep-{stamp}")
        super().__init__(cfg, config_path, redis_url, collectors, coordinator_args, self.sweep_dir.name, out_dir,
                         started_at=started_at)
        self.log_dir = self.sweep_dir / "log"  # the fleet's and the coordinators' output
        self.seeds = seeds
        self.share = max(1, collectors // len(seeds))
        self.eval_episodes = eval_episodes
        self.run_names = {s: runs.reserve_run_dir(self.out_dir, cfg.exp_name, s).name for s in seeds}
        self.codes: dict[int, Optional[int]] = {s: None for s in seeds}
        self.commit = git_commit()  # the code the runs start with (the checkout may move on meanwhile)

    def _namespaces(self) -> list[str]:
        return [keys.namespace(self.cfg.exp_name, r) for r in self.run_names.values()]

    def _run(self) -> int:
        url, env, extra, conn = self._prepare()
        config_path = str(Path(self.config_path).resolve())
        for s, run_name in self.run_names.items():
            self._fork(f"coordinator-s{s}", _coordinator_main,
                       [config_path, "--out-dir", ".", "--run-name", run_name, "--seed", str(s),
                        "--started-at", repr(self.started_at), *self.coordinator_args,
                        f"--set=commander.collector_task_space={self.share}"], env, extra)
        # One learner worker per run (each run's learner task). RQ hands any run's task to any
        # collector worker: each keeps the envs of every run of the sweep (workers/live_envs.py).
        env["RQRL_ENV_CACHE_RUNS"] = str(max(2, len(self.seeds)))
        self._start_workers(env, extra, len(self.seeds), "sweep-")
        print(f"sweep of seeds {self.seeds}: runs {', '.join(self.run_names.values())} in ./{self.cfg.exp_name}/, "
              f"up to {self.share} collector tasks each; logs in {self.log_dir}/", file=sys.stderr)
        self._follow_all(conn)
        # A run that converged (0) or used up its budget (2) is a result; any other exit a failure.
        return 0 if all(c in (0, 2) for c in self.codes.values()) else 1

    def _follow_all(self, conn: redis.Redis) -> None:
        """Until every coordinator exits: one progress line per run, from their events streams
        (one XREAD BLOCK on all of them)."""
        progress = {s: Progress(float(self.cfg.env.stop_value)) for s in self.seeds}
        streams_of = {keys.events(keys.namespace(self.cfg.exp_name, r)): s for s, r in self.run_names.items()}
        last = {k: "0" for k in streams_of}
        t0, next_print = time.time(), 0.0
        while any(c is None for c in self.codes.values()):
            try:
                reply = conn.xread(dict(last), count=500, block=500)
            except redis.RedisError as e:
                print(f"redis error while following the sweep: {e}", file=sys.stderr)
                reply = []
            for stream, entries in reply or []:
                name = stream.decode() if isinstance(stream, bytes) else stream
                for entry_id, raw in entries:
                    last[name] = entry_id
                    ev = streams.decode_fields(raw)
                    if float(ev.get("ts", 0)) >= t0 - 1:
                        progress[streams_of[name]].update(ev)
            for s in self.seeds:
                proc = self.children[f"coordinator-s{s}"]
                if self.codes[s] is None and proc.poll() is not None:
                    self.codes[s] = proc.returncode
                    print(f"seed {s} ({self.run_names[s]}) ended with exit code {proc.returncode}", file=sys.stderr)
            if time.time() >= next_print:
                next_print = time.time() + 5.0
                print(sweep_line(progress, time.time() - t0), file=sys.stderr)

    def report(self) -> dict[str, Any]:
        """Re-evaluate each final.pt, write sweep.json / sweep.md / sweep.png; returns sweep.json's content."""
        import torch

        from coordinator.evaluate import EvalError, evaluate_checkpoint

        torch.set_num_threads(1)  # one observation at a time (as rqrl eval): threads only add overhead
        rows, curves = [], {}
        for s, run_name in self.run_names.items():
            run_dir = self.out_dir / self.cfg.exp_name / run_name
            summary_path = run_dir / "summary.json"
            summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
            row = {"seed": s, "run_name": run_name, "exit_code": self.codes[s], "status": summary.get("status", ""),
                   "solved": summary.get("exit_code") == 0 and bool(summary.get("converged")),
                   "wall_seconds": summary.get("wall_seconds"), "envstep": int(summary.get("envstep") or 0),
                   "train_iter": int(summary.get("train_iter") or 0), "reeval_mean": None, "reeval_std": None,
                   "reeval_episodes": 0, "last_eval_reward_mean": summary.get("last_eval_reward_mean"),
                   "best_eval_reward_mean": summary.get("best_eval_reward_mean")}
            final = run_dir / "final.pt"
            if self.eval_episodes > 0 and final.is_file():
                print(f"re-evaluating seed {s}'s final.pt on {self.eval_episodes} fresh episodes ...", file=sys.stderr,
                      flush=True)
                try:
                    res = evaluate_checkpoint(final, episodes=self.eval_episodes, seed=REEVAL_SEED_BASE + 1000 * s)
                    row.update(reeval_mean=res.mean, reeval_std=res.std, reeval_episodes=len(res.returns))
                except EvalError as e:
                    row["status"] += f"; re-eval failed: {e}"
            rows.append(row)
            curves[s] = run_curve(run_dir)
        summary = summarize(rows)
        title = f"{self.cfg.exp_name} ({self.cfg.env.env_id}), seeds {','.join(map(str, self.seeds))}"
        gpu = None
        if self.cfg.policy.cuda and torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
        out = {"exp_name": self.cfg.exp_name, "env_id": self.cfg.env.env_id, "stop_value": self.cfg.env.stop_value,
               "algo": self.cfg.create.policy.type, "config": Path(self.config_path).name,
               "overrides": [a.removeprefix("--set=") for a in self.coordinator_args if a.startswith("--set=")],
               "budget": {k: self.cfg.commander[k] for k in ("max_env_step", "max_train_iter", "max_wall_seconds")},
               "collectors": self.collectors, "sweep_wall_seconds": round(time.time() - self.started_at, 1),
               "machine": machine(gpu, self.commit), "eval_episodes": self.eval_episodes, "runs": rows, "summary": summary}
        (self.sweep_dir / "sweep.json").write_text(json.dumps(out, indent=2) + "\n")
        md = render_markdown(title, rows, summary, self.cfg.env.stop_value, self.eval_episodes)
        (self.sweep_dir / "sweep.md").write_text(md)
        plot_sweep(curves, self.cfg.env.stop_value, self.sweep_dir / "sweep.png", title)
        print(md + f"\nwritten: {self.sweep_dir}/sweep.md, sweep.json, sweep.png", flush=True)
        return out
