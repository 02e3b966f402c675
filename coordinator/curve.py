"""Learning curves: eval reward against env steps and against wall time, as a PNG.

* :func:`plot_curve` draws a list of eval points (what the coordinator keeps, or what
  :func:`evals_from_events` rebuilds from Redis) with :func:`build_figure` and saves it;
* ``rqrl curve --exp EXP[/RUN]`` draws the curve of a run (an experiment's latest one) from its
  own record: the run folder's ``evals.jsonl`` (written by the coordinator as evals finish;
  ``--run-dir`` names the folder), or, only when ``--redis-url`` / ``$RQRL_REDIS_URL`` names the
  run's Redis, ``rqrl:{exp}:evals`` there (``{exp}`` = the run's namespace ``EXP/RUN``; every
  eval result, never capped) or, for a run without that list, its ``rqrl:{exp}:events`` stream,
  saying so when that stream was trimmed.

An eval point is a dict (a record of ``evals.jsonl`` / ``rqrl:{exp}:evals`` is one)::

    {"envstep": int, "reward_mean": float, "reward_std": float, "time": float (unix seconds),
     "policy_version": int (optional; ``train_iter`` in records written before the name),
     "wall_seconds": float (optional: the run's clock, pauses
     before a resume not counted; drawn on the wall-time axis when every point has it)}

An eval that finished no episode has no ``reward_mean``: it is not drawn (the title counts it).

matplotlib runs on its Agg canvas (no display, no pyplot global state), imported lazily.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

REQUIRED = ("envstep", "time")


def _clean(evals: Iterable[dict[str, Any]]) -> list[dict[str, float]]:
    """The points to draw, oldest first: an eval that finished no episode (no ``reward_mean``, or
    one that is not a finite number) has nothing to draw and is left out."""
    from common.events import episode_figure, figure

    out = []
    for i, ev in enumerate(evals):
        reward = episode_figure(ev, "reward_mean")
        if reward is None:
            continue
        point = {"reward_mean": reward, "reward_std": episode_figure(ev, "reward_std") or 0.0}
        for k in REQUIRED:
            if k not in ev:
                raise ValueError(f"eval point {i} has no {k!r} (needs {', '.join(REQUIRED)} and reward_mean)")
            try:
                point[k] = float(ev[k])
            except (TypeError, ValueError):
                raise ValueError(f"eval point {i}: {k!r} = {ev[k]!r} is not a number") from None
        if figure(ev, "wall_seconds") is not None:
            point["wall_seconds"] = float(ev["wall_seconds"])
        out.append(point)
    return sorted(out, key=lambda p: p["time"])


def without_reward(evals: Iterable[dict[str, Any]]) -> int:
    """How many of ``evals`` finished no episode (no reward to draw)."""
    from common.events import episode_figure

    return sum(episode_figure(ev, "reward_mean") is None for ev in evals)


def _time_axis(seconds: list[float]) -> tuple[list[float], str]:
    span = max(seconds) if seconds else 0.0
    if span >= 2 * 3600:
        return [s / 3600 for s in seconds], "h"
    if span >= 600:
        return [s / 60 for s in seconds], "min"
    return seconds, "s"


def plot_curve(evals: list[dict[str, Any]], stop_value: Optional[float], path: str | Path,
               t0: Optional[float] = None, title: Optional[str] = None) -> Path:
    """Draw eval ``reward_mean`` (± ``reward_std`` band) against env steps and wall time; save a PNG.

    Args:
        evals, stop_value, t0, title: as :func:`build_figure`.
        path: the PNG to write (parent folders are created).

    Returns:
        ``Path(path)``.

    Raises:
        ValueError: a point lacks a field or has a non-numeric one (names the point and field).
    """
    fig = build_figure(evals, stop_value, t0=t0, title=title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def build_figure(evals: list[dict[str, Any]], stop_value: Optional[float], t0: Optional[float] = None,
                 title: Optional[str] = None) -> Any:
    """The curve as a matplotlib ``Figure`` (1200x450 px; axes: env steps, wall time), not saved.

    Args:
        evals: eval points (see module docstring), in any order; an empty list draws empty axes
            with a "no evaluations" note.
        stop_value: drawn as a dashed horizontal line on both plots (``None``: no line).
        t0: unix seconds where the wall-time axis starts (default: the first eval's ``time``).
        title: figure title (default ``"eval reward"``).

    Raises:
        ValueError: a point lacks a field or has a non-numeric one (names the point and field).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    evals = list(evals)
    points = _clean(evals)
    empty = without_reward(evals)
    fig = Figure(figsize=(12, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax_step, ax_time = fig.subplots(1, 2)
    mean = [p["reward_mean"] for p in points]
    lo = [p["reward_mean"] - p["reward_std"] for p in points]
    hi = [p["reward_mean"] + p["reward_std"] for p in points]
    if points and all("wall_seconds" in p for p in points):
        # The run's own clock (the coordinator's records): a resumed run's pause is not counted.
        secs, unit = _time_axis([p["wall_seconds"] for p in points])
        since = "since start"
    else:
        base = t0 if t0 is not None else (points[0]["time"] if points else 0.0)
        secs, unit = _time_axis([p["time"] - base for p in points])
        since = "since the first eval" if t0 is None else "since start"
    xs = {ax_step: ([p["envstep"] for p in points], "env steps"),
          ax_time: (secs, f"wall time {since} ({unit})")}
    for ax, (x, label) in xs.items():
        if points:
            ax.fill_between(x, lo, hi, alpha=0.25, color="tab:blue", linewidth=0, label="± std")
            ax.plot(x, mean, marker="o", markersize=3, color="tab:blue", label="eval reward mean")
        else:
            ax.text(0.5, 0.5, "no evaluations", transform=ax.transAxes, ha="center", va="center", color="gray")
        if stop_value is not None:
            ax.axhline(float(stop_value), color="tab:red", linestyle="--", linewidth=1,
                       label=f"stop value {float(stop_value):g}")
        if points and min(x) >= 0:
            ax.set_xlim(left=0)
        ax.set_xlabel(label)
        ax.set_ylabel("episode return")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize="small")
    ax_step.set_title("reward vs env steps")
    ax_time.set_title("reward vs wall time")
    best = f", best {max(mean):g}" if mean else ""
    none = f"; {empty} more finished no episode" if empty else ""
    fig.suptitle(f"{title or 'eval reward'} ({len(points)} evals{best}{none})")
    fig.tight_layout()
    return fig


def evals_from_events(conn: Any, exp: str, page: int = 5000) -> tuple[list[dict[str, Any]], Optional[float]]:
    """Eval points of experiment ``exp`` rebuilt from its ``rqrl:{exp}:events`` stream.

    Each ``finished`` event with ``eval_flag`` true is one point: ``reward_mean``,
    ``reward_std`` (absent when the eval finished no episode), ``time`` = its ``ts``,
    ``policy_version``; ``envstep`` is the
    ``consumed_env_steps`` of the latest ``learner_info`` event before it (0 if none).

    Returns:
        ``(points, t0)``: points in stream order and the ``ts`` of the stream's first event
        (``None`` for an empty stream).
    """
    from common import keys, streams
    from common.events import consumed_env_steps, episode_figure

    stream = keys.events(exp)
    points: list[dict[str, Any]] = []
    seen: set[str] = set()
    envstep = 0
    t0: Optional[float] = None
    start = "-"
    while True:
        entries = conn.xrange(stream, min=start, max="+", count=page)
        for entry_id, raw in entries:
            ev = streams.decode_fields(raw)
            ts = ev.get("ts")
            if t0 is None and isinstance(ts, (int, float)) and not isinstance(ts, bool):
                t0 = float(ts)
            etype = ev.get("type")
            if etype == "learner_info":
                try:
                    envstep = consumed_env_steps(ev, envstep)
                except (TypeError, ValueError):
                    pass  # a malformed report: the points keep the last count
            elif etype == "finished" and ev.get("eval_flag") is True:
                tid = str(ev.get("task_id", entry_id))
                if tid in seen:  # a task's duplicate report
                    continue
                try:
                    point = {"envstep": envstep, "time": float(ev["ts"]), "policy_version": int(ev.get("policy_version", 0))}
                except (KeyError, TypeError, ValueError):
                    continue  # a malformed entry: the coordinator drops it too
                reward = episode_figure(ev, "reward_mean")
                if reward is not None:  # else the eval finished no episode: a point without a reward
                    point.update(reward_mean=reward, reward_std=episode_figure(ev, "reward_std") or 0.0)
                seen.add(tid)
                points.append(point)
        if len(entries) < page:
            break
        last = entries[-1][0].decode() if isinstance(entries[-1][0], bytes) else str(entries[-1][0])
        start = "(" + last
    return points, t0


def evals_from_list(conn: Any, exp: str) -> tuple[list[dict[str, Any]], Optional[float]]:
    """Eval points from ``rqrl:{exp}:evals`` (one per eval task, duplicates dropped) and the run's
    start (unix seconds, from the coordinator's state; ``None`` if unknown)."""
    import json

    from common import keys

    points: list[dict[str, Any]] = []
    seen: set[str] = set()
    for raw in conn.lrange(keys.evals(exp), 0, -1):
        ev = json.loads(raw)
        if ev.get("task_id") in seen:
            continue
        seen.add(ev.get("task_id"))
        points.append(ev)
    state = conn.hget(keys.commander(exp), "state")
    t0 = float(json.loads(state)["t0"]) if state else (points[0]["time"] if points else None)
    return points, t0


def evals_from_folder(run_dir: Path) -> tuple[list[dict[str, Any]], Optional[float], Optional[float]]:
    """Eval points from a run folder's ``evals.jsonl`` (written by the coordinator as the run goes),
    the run's start and its stop value (from ``summary.json``, when there).

    Raises:
        ValueError: no ``evals.jsonl`` there, or a line that is not JSON (names the file).
    """
    import json

    path = run_dir / "evals.jsonl"
    if not path.is_file():
        raise ValueError(f"{path} does not exist (is {run_dir} the folder of a run?)")
    points: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} line {n}: not JSON ({e})") from None
        if ev.get("task_id") in seen:
            continue
        seen.add(ev.get("task_id"))
        points.append(ev)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    sv = summary.get("stop_value")
    stop_value = float(sv) if isinstance(sv, (int, float)) and not isinstance(sv, bool) else None
    t0 = points[0]["time"] if points else None
    return points, t0, stop_value


def events_trimmed(conn: Any, exp: str) -> str:
    """Why ``rqrl:{exp}:events`` no longer holds the whole run ("" when nothing was removed).

    Redis 7 counts every entry ever added (``XINFO STREAM``'s ``entries-added``), so any
    removal, by ``XTRIM``/``MAXLEN`` or ``XDEL``, shows as fewer entries than were added.
    (``max-deleted-entry-id`` is no guide: 7.0 moves it on ``XDEL`` only, never on a trim.)
    Redis 6.2 has no such count: there the stream's first entry is compared with the run's
    start time, which it follows within seconds when nothing was removed.
    """
    import redis

    from common import keys

    stream = keys.events(exp)
    try:
        info = conn.xinfo_stream(stream)
    except redis.ResponseError:  # no stream, or XINFO denied
        info = {}
    added = info.get("entries-added")
    if added is not None:  # Redis >= 7.0
        removed = int(added) - int(info.get("length", 0))
        if removed <= 0:
            return ""
        first = info.get("recorded-first-entry-id")
        first = first.decode() if isinstance(first, bytes) else str(first)
        return (f"{stream} was trimmed ({removed} of {int(added)} entries removed; it now starts at {first}): "
                "evals before that are missing")
    import json

    state, first = conn.hget(keys.commander(exp), "state"), conn.xrange(stream, count=1)
    if not state or not first:
        return ""
    gap = int(first[0][0].decode().split("-")[0]) / 1000 - float(json.loads(state)["t0"])
    return f"{stream} appears trimmed (it starts {gap:.0f} s after the run began): earlier evals are missing" \
        if gap > 60 else ""


# ---------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exp", default=None,
                   help="a run, EXP/RUN, or an experiment EXP (exp_name in the config: its newest run)")
    p.add_argument("--run-dir", default=None,
                   help="a run's folder (./EXP/RUN, or ./EXP for its latest run): read its evals.jsonl, no Redis "
                        "needed. What --exp reads when neither --redis-url nor $RQRL_REDIS_URL is given "
                        "(./EXP/latest, or ./EXP/RUN)")
    p.add_argument("--redis-url", default=None,
                   help="read the run's rqrl:EXP:evals from this Redis instead: redis://[user:pass@]host:port/db, "
                        "rediss:// or unix:// (default: $RQRL_REDIS_URL; without either no Redis is read)")
    p.add_argument("--out", default=None, help="PNG to write (default: the run folder's curve.png)")
    p.add_argument("--stop-value", type=float, default=None,
                   help="draw this stop value (default: the one in rqrl:EXP:commander, if any)")


def run(args: argparse.Namespace) -> int:
    """``rqrl curve``: draw a run's learning curve from its own record; returns the exit code.

    The record is the run folder's ``evals.jsonl`` (``--run-dir``, or ``--exp`` with no Redis
    URL given); Redis (``rqrl:{exp}:evals``) is read only when ``--redis-url`` or
    ``$RQRL_REDIS_URL`` says which one: a run's Redis is never guessed.
    """
    import redis

    from common import keys, streams
    from common.connection import connect, redact, scrub

    from coordinator.runs import newest_run, resolve_run_dir

    url = args.redis_url or os.environ.get("RQRL_REDIS_URL")
    if args.exp:
        try:
            keys.exp_prefix(args.exp)
        except ValueError as e:
            print(f"rqrl curve: error: {e}", file=sys.stderr)
            return 1
    run_dir = resolve_run_dir(Path(args.run_dir)) if args.run_dir else None
    if run_dir is None and args.exp and not url:
        run_dir = resolve_run_dir(Path(args.exp))
        if not run_dir.is_dir():
            print(f"rqrl curve: error: no run folder {run_dir}/ here; run this where the run was started, or give "
                  "--run-dir DIR, or --redis-url URL of the Redis the run uses", file=sys.stderr)
            return 1
        if not (run_dir / "evals.jsonl").is_file():
            print(f"rqrl curve: error: {run_dir} has no evals.jsonl yet: the run finished no eval (still starting, "
                  "or it stopped before one); while it runs, --redis-url URL of its Redis reads the same record",
                  file=sys.stderr)
            return 1
    if run_dir is not None:
        try:
            points, t0, folder_stop = evals_from_folder(run_dir)
        except ValueError as e:
            print(f"rqrl curve: error: {e}", file=sys.stderr)
            return 1
        if not points:
            print(f"rqrl curve: error: no evals in {run_dir / 'evals.jsonl'}", file=sys.stderr)
            return 1
        stop_value = args.stop_value if args.stop_value is not None else folder_stop
        return _draw(points, stop_value, Path(args.out) if args.out else run_dir / "curve.png", t0,
                     f"{run_dir.parent.name}/{run_dir.name}", str(run_dir / "evals.jsonl"))
    if not args.exp:
        print("rqrl curve: error: give --exp EXP[/RUN] (its run folder, or with --redis-url its Redis) or --run-dir DIR",
              file=sys.stderr)
        return 1
    ns = args.exp
    try:
        conn = connect(url, socket_timeout=10)
        ns = newest_run(conn, args.exp) or args.exp  # an experiment's newest run, or the run named
        points, t0 = evals_from_list(conn, ns)
        if not points:  # a run from before rqrl:{exp}:evals existed
            points, t0 = evals_from_events(conn, ns)
            trimmed = events_trimmed(conn, ns)
            if trimmed:
                print(f"rqrl curve: warning: {trimmed}", file=sys.stderr)
        stop_value = args.stop_value
        if stop_value is None:
            summary = streams.decode_fields(conn.hgetall(keys.commander(ns)))
            sv = summary.get("stop_value")
            stop_value = float(sv) if isinstance(sv, (int, float)) and not isinstance(sv, bool) else None
    except (redis.RedisError, ValueError) as e:
        print(f"rqrl curve: error: cannot read {keys.evals(ns)} at {redact(url)}: {scrub(str(e), url)}", file=sys.stderr)
        return 1
    if not points:
        print(f"rqrl curve: error: no finished eval in {keys.evals(ns)} or {keys.events(ns)} at {redact(url)}",
              file=sys.stderr)
        return 1
    return _draw(points, stop_value, Path(args.out) if args.out else Path(ns) / "curve.png", t0, ns,
                 f"{keys.evals(ns)} at {redact(url)}")


def _draw(points: list[dict[str, Any]], stop_value: Optional[float], out: Path, t0: Optional[float], title: str,
          source: str) -> int:
    drawn = _clean(points)
    if not drawn:
        print(f"rqrl curve: error: none of the {len(points)} evals in {source} finished an episode: no reward to draw",
              file=sys.stderr)
        return 1
    plot_curve(points, stop_value, out, t0=t0, title=title)
    last = drawn[-1]
    empty = without_reward(points)
    print(f"{out}: {len(drawn)} evals, last reward_mean {last['reward_mean']:g} at {last['envstep']:,.0f} env steps"
          + (f" (stop value {stop_value:g})" if stop_value is not None else "")
          + (f"; {empty} more finished no episode (not drawn)" if empty else ""), flush=True)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rqrl curve", description="Plot a run's learning curve from its evals.jsonl or its Redis.")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
