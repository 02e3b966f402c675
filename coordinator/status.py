"""``rqrl status``: what runs, what is stuck and how learning goes — read from Redis only."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Optional

import redis
from rq import Queue, Worker
from rq.registry import FailedJobRegistry, StartedJobRegistry

from common import events, keys, phases, streams
from common.connection import RedisUnavailable, connect_checked, is_sentinel, primary_address, server_version
from common.redis_memory import memory_info
from coordinator import league
from coordinator.progress import BUDGETS, left_text, rates_text, time_left
from coordinator.runs import list_runs


def _throughput(conn: redis.Redis, exp: str, window_s: float = 60.0) -> dict[str, float]:
    """Env steps/s and train iterations/s over the last ``window_s`` seconds of learner_info events."""
    now_ms = int(time.time() * 1000)
    entries = conn.xrange(keys.events(exp), min=str(now_ms - int(window_s * 1000)), max="+")
    infos = [streams.decode_fields(f) for _, f in entries]
    infos = [i for i in infos if i.get("type") == "learner_info"]
    if len(infos) < 2:
        return {"env_steps_per_s": 0.0, "train_iter_per_s": 0.0}
    a, b = infos[0], infos[-1]
    dt = max(1e-6, float(b["ts"]) - float(a["ts"]))
    return {"env_steps_per_s": round((events.consumed_env_steps(b) - events.consumed_env_steps(a)) / dt, 1),
            "train_iter_per_s": round((int(b["train_iter"]) - int(a["train_iter"])) / dt, 1)}


def _learner_figures(conn: redis.Redis, exp: str) -> dict[str, Any]:
    """Policy lag (train iterations) and stale chunks from the newest learner_info event."""
    for _, f in conn.xrevrange(keys.events(exp), count=200):
        ev = streams.decode_fields(f)
        if ev.get("type") == "learner_info":
            return {k: ev[k] for k in ("policy_lag_mean", "policy_lag_p50", "policy_lag_p95", "policy_lag_max",
                                       "stale_chunks", "data_lag_mean") if k in ev}
    return {}


def _memory(conn: redis.Redis) -> dict[str, Any]:
    """Redis: its version, memory used / maxmemory (bytes), policy, whether writes are refused
    (full), and through Sentinel the primary's address."""
    try:
        mem = memory_info(conn)
        mem["version"] = server_version(conn)
    except redis.ResponseError:  # INFO refused by an ACL
        return {}
    if is_sentinel(conn):
        mem["primary"] = primary_address(conn)
    mem["full"] = bool(mem["max"]) and mem["used"] >= mem["max"]
    return mem


def shard_lines(raw: Any) -> list[str]:
    """A line per data shard of a run's summary field ``data_shards`` (its JSON, written every
    second by the coordinator: common/data_shards.py ``DataShards.totals``): memory used against
    maxmemory, chunks produced and their rate, the redacted URL (and a cluster shard's hash tag);
    [] for a run without shards."""
    shards = json.loads(raw) if isinstance(raw, str) else raw
    lines = []
    for i, sh in enumerate(shards or []):
        where = f" {sh['tag']}" if sh.get("tag") else ""  # a cluster's shard: its hash tag
        if "error" in sh:
            line = f"  data shard {i} NOT ANSWERING: {sh['error']}  {sh['url']}{where}"
        else:
            mem = "memory -" if "used_memory" not in sh else (
                f"{sh['used_memory'] / 2**20:.1f} MB" + (f" / {sh['maxmemory'] / 2**20:.0f} MB" if sh["maxmemory"] else ""))
            line = f"  data shard {i}  {mem}  chunks {sh['chunks']:,} ({sh.get('chunks_per_s', 0):g}/s)  {sh['url']}{where}"
        lines.append(line if len(line) <= 80 else line[:77] + "...")
    return lines


def collect_status(conn: redis.Redis, exp: Optional[str] = None) -> dict[str, Any]:
    """Everything ``rqrl status`` shows, as plain data (the ``--json`` output).

    ``exp``: an experiment name (all its runs), a run's namespace ``EXP/RUN``, or None (every
    run in ``rqrl:runs``). ``runs`` maps each run's namespace to its figures.
    """
    out: dict[str, Any] = {"queues": {}, "runs": {}, "redis": _memory(conn)}
    for name in (keys.COLLECTOR_QUEUE, keys.LEARNER_QUEUE):
        q = Queue(name, connection=conn)
        workers = Worker.all(queue=q)
        out["queues"][name] = {
            "queued": q.count,
            "started": StartedJobRegistry(queue=q).count,
            "failed": FailedJobRegistry(queue=q).count,
            "workers": sorted(w.name for w in workers),
        }
    for e in list_runs(conn, exp):
        summary = streams.decode_fields(conn.hgetall(keys.commander(e)))
        summary.pop("state", None)  # the coordinator's persisted state (a JSON string), not a figure
        # An empty field is a figure the run does not have (no eval yet, or an eval that finished
        # no episode): null in JSON, "-" on screen, never 0.
        summary = {k: (None if v == "" else v) for k, v in summary.items()}
        stop = conn.get(keys.stop(e))
        coordinator = (conn.get(keys.coordinator_alive(e)) or b"").decode()
        tasks = []
        # Executing = started and still in the coordinator's running tasks; a finished task's
        # heartbeat key lingers until its TTL runs out, so the key alone is not enough. A run
        # that stopped and whose coordinator is gone executes nothing: the records it left are
        # of tasks that ended with it.
        running = {k.decode(): json.loads(v) for k, v in conn.hgetall(keys.tasks(e)).items()}
        finished = bool(stop) and not coordinator
        executing = [] if finished else sorted(t for t, rec in running.items() if rec.get("started"))
        pipe = conn.pipeline(transaction=False)
        for tid in executing:
            pipe.pttl(keys.heartbeat(e, tid))
        for tid, ttl in zip(executing, pipe.execute() if executing else []):
            tasks.append({"task_id": tid, "kind": running[tid].get("kind", ""),
                          "heartbeat_ttl_s": round(ttl / 1000, 1) if ttl > 0 else 0})
        out["runs"][e] = {
            "summary": summary,
            "stopped": stop.decode() if stop else "",
            "coordinator": coordinator,
            "tasks_alive": sorted(tasks, key=lambda t: t["task_id"]),
            "throughput_1min": _throughput(conn, e),
            "learner": _learner_figures(conn, e),
            "phases": phases.read(conn, e),
        }
    return out


def render(status: dict[str, Any]) -> str:
    """The status as text for an 80-column terminal."""
    lines = ["QUEUE       queued started failed  workers"]
    for name, q in status["queues"].items():
        lines.append(f"{name:<11} {q['queued']:>6} {q['started']:>7} {q['failed']:>6}  {len(q['workers'])}")
    mem = status.get("redis") or {}
    if mem:
        cap = f"{mem['max'] / 2**20:.1f} MB" if mem["max"] else "no limit"
        lines.append(f"redis {mem['version']:<6}  used {mem['used'] / 2**20:.1f} MB / maxmemory {cap}, {mem['policy']}"
                     + ("  FULL: writes refused" if mem["full"] else ""))
        if mem.get("primary"):
            lines.append(f"redis primary {mem['primary']} (found through Sentinel)")
    if not status["runs"]:
        lines.append("no runs in this Redis")
    for e, info in status["runs"].items():
        s = info["summary"]
        state = "stopped: " + info["stopped"] if info["stopped"] else ("running" if info["coordinator"] else "no coordinator")
        room = max(10, 80 - len(f"RUN {e}  []"))
        if len(state) > room:  # shorten the reason, keep the line's shape
            state = state[: room - 3] + "..."
        lines += ["", f"RUN {e}  [{state}]"]
        if s:
            ev = events.figure(s, "last_eval_reward_mean")
            lines.append(f"  env steps {s.get('envstep') or 0:,}  train iter {s.get('train_iter') or 0:,}  "
                         f"wall {s.get('wall_seconds') or 0} s")
            lines.append(f"  last eval {'-' if ev is None else f'{ev:g}'} / stop_value {s.get('stop_value', '?')}"
                         f"  converged {s.get('converged', False)}")
            ret = events.figure(s, "train_return_mean")
            if ret is not None:
                lines.append(f"  train return {ret:g} (mean of the last {min(int(s.get('train_episodes') or 0), 100)} "
                             "training episodes)")
        t = info["throughput_1min"]
        rates = rates_text(t["env_steps_per_s"], t["train_iter_per_s"])
        if info["stopped"]:
            lines.append(f"  last minute: {rates}")
        else:  # as the progress line of rqrl train: rates, and the time left of the budget that binds first
            budgets = {k: float(s[k]) for k in BUDGETS if s.get(k) and float(s[k]) > 0}
            left = time_left(budgets, float(s.get("envstep") or 0), float(s.get("train_iter") or 0),
                             float(s.get("wall_seconds") or 0), t["env_steps_per_s"], t["train_iter_per_s"])
            lines += [f"  last minute: {rates}", f"  {left_text(budgets, left)}"]
        lines += shard_lines(s.get("data_shards"))
        lines += league.status_lines(s.get("league"))
        lf = info.get("learner") or {}
        if "policy_lag_p50" in lf:
            mean = f"mean {lf['policy_lag_mean']:g}  " if "policy_lag_mean" in lf else ""  # older learners: none
            lines.append(f"  policy lag (train iters) {mean}p50 {lf['policy_lag_p50']:g}  p95 {lf['policy_lag_p95']:g}  "
                         f"max {lf['policy_lag_max']:g}")
            if "stale_chunks" in lf:
                lines.append(f"  stale chunks dropped {lf['stale_chunks']}")
        if "data_lag_mean" in lf:  # a queueing source: the lag of the rows when trained on, not on arrival
            lines.append(f"  data lag when trained on (train iters) mean {lf['data_lag_mean']:.2f}")
        if s.get("worker_clock_skew"):
            lines.append(f"  clocks off Redis's: {s['worker_clock_skew']}")
        if info.get("phases"):
            lines.append(f"  phases {phases.render(info['phases'], width=80, indent='         ')}")
        for task in info["tasks_alive"]:
            lines.append(f"  task {task['task_id']:<40} heartbeat ttl {task['heartbeat_ttl_s']} s")
    return "\n".join(lines)


def run_status(redis_url: Optional[str], exp: Optional[str], watch: bool = False, as_json: bool = False) -> int:
    """Print the status once (or every 2 s with ``watch``); returns an exit code."""
    try:
        conn = connect_checked(redis_url, socket_timeout=5, patient=False)
    except RedisUnavailable as e:
        print(e, file=sys.stderr)
        return 1
    try:
        while True:
            st = collect_status(conn, exp)
            text = json.dumps(st, indent=2) if as_json else render(st)
            if watch and sys.stdout.isatty():
                sys.stdout.write("\x1b[2J\x1b[H")
            print(text, flush=True)
            if not watch:
                return 0
            time.sleep(2.0)  # a display refresh interval, not a wait on Redis
    except KeyboardInterrupt:
        return 0
