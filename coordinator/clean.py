"""``rqrl clean``: list, then (with ``--yes``) delete everything one run or experiment left in Redis.

``EXP`` is one run's namespace (``EXP_NAME/RUN_NAME``, common/keys.py) or an experiment name
(then every run of it). What belongs to ``EXP``:

* every key matching ``rqrl:EXP:*`` (``common.keys.all_keys_pattern``) and, for an
  experiment, ``rqrl:EXP/*`` (its runs), found with SCAN;
* every RQ job in the ``collector`` / ``learner`` queues and their registries (started,
  finished, failed, deferred, scheduled, canceled) whose task dict (``job.args[0]``) belongs
  to such a run (its ``exp_name`` and ``run_name``);
* those runs' names in the set ``rqrl:runs``.

Without ``--yes`` nothing is touched (a dry run). Deleting is refused while a coordinator of
those runs is alive (key ``rqrl:{run}:coordinator`` exists) unless ``--force``. Jobs still
running on a worker are sent RQ's stop-job command before their keys go.

Reading job arguments unpickles RQ payloads, exactly as ``rq info`` and every worker do: only
point this at a Redis you trust (see README, Security).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

# RQ registries searched for an experiment's jobs, as (label, attribute of rq.Queue).
_REGISTRIES = (
    ("started", "started_job_registry"),
    ("finished", "finished_job_registry"),
    ("failed", "failed_job_registry"),
    ("deferred", "deferred_job_registry"),
    ("scheduled", "scheduled_job_registry"),
    ("canceled", "canceled_job_registry"),
)


@dataclass
class KeyInfo:
    key: str
    type: str
    count: int  # elements (hash fields, stream entries, set / list / zset members) or bytes of a string
    ttl_s: Optional[float]  # None: no expiry

    @property
    def size(self) -> str:
        unit = {"string": "bytes", "hash": "fields", "stream": "entries", "set": "members",
                "zset": "members", "list": "items"}.get(self.type, "")
        return f"{self.count:,} {unit}".strip()


@dataclass
class JobInfo:
    queue: str
    job_id: str
    where: list[str]  # "queued" and/or registry labels
    status: str
    description: str = ""


@dataclass
class Plan:
    exp: str
    keys: list[KeyInfo] = field(default_factory=list)
    jobs: list[JobInfo] = field(default_factory=list)
    listed: list[str] = field(default_factory=list)  # its runs' namespaces in rqrl:runs
    coordinator: str = ""  # the live coordinators' names (", "-joined), "" when none
    coordinator_keys: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.keys and not self.jobs and not self.listed


def _count(conn: Any, key: bytes, typ: str) -> int:
    fn = {"string": conn.strlen, "hash": conn.hlen, "stream": conn.xlen, "set": conn.scard,
          "zset": conn.zcard, "list": conn.llen}.get(typ)
    return int(fn(key)) if fn else 0


def _job_exp(job: Any) -> Optional[str]:
    """The namespace of the job's run (common/keys.py), None when the job is not an rqrl task."""
    from common import keys

    args = job.args  # unpickles the payload (see module docstring)
    if args and isinstance(args[0], dict):
        name, run = args[0].get("exp_name"), args[0].get("run_name", "")
        try:
            return keys.namespace(name, run)
        except (ValueError, TypeError):
            return None
    return None


def _belongs(ns: Optional[str], exp: str) -> bool:
    """Run namespace ``ns`` is ``exp`` itself or a run of experiment ``exp`` (exactly that
    experiment: the runs of an experiment named ``exp/x`` by an earlier version are not ``exp``'s)."""
    from common import keys

    return ns is not None and (ns == exp or keys.split_namespace(ns)[0] == exp)


def _key_namespace(key: bytes) -> str:
    """The namespace of an rqrl key, ``rqrl:{ns}:...`` -> ``ns``."""
    from common import keys

    return key.decode()[len(keys.PREFIX) + 1:].partition(":")[0]


def find_jobs(conn: Any, exp: str, warnings: Optional[list[str]] = None) -> list[JobInfo]:
    """RQ jobs of ``exp`` (a run, or every run of an experiment) in the ``collector`` / ``learner``
    queues and their registries."""
    from rq import Queue
    from rq.job import Job

    from common import keys
    from common.rq_json import TaskSerializer

    found: list[JobInfo] = []
    for qname in (keys.COLLECTOR_QUEUE, keys.LEARNER_QUEUE):
        q = Queue(qname, connection=conn)
        places: dict[str, list[str]] = {}
        for jid in q.get_job_ids():
            places.setdefault(jid, []).append("queued")
        for label, attr in _REGISTRIES:
            for jid in getattr(q, attr).get_job_ids(cleanup=False):
                places.setdefault(jid, []).append(label)
        ids = list(places)
        jobs = Job.fetch_many(ids, connection=conn, serializer=TaskSerializer) if ids else []
        for jid, job in zip(ids, jobs):
            if job is None:
                continue  # a registry entry whose job hash already expired: RQ cleans those itself
            try:
                owner = _job_exp(job)
            except Exception as e:  # a payload that is not JSON (never unpickled) is not ours to judge
                if warnings is not None:
                    warnings.append(f"job {jid} in queue {qname}: cannot read its arguments ({type(e).__name__}); left alone")
                continue
            if _belongs(owner, exp):
                status = job.get_status(refresh=False)
                found.append(JobInfo(qname, jid, places[jid], str(getattr(status, "value", status) or "?"),
                                     job.description or ""))
    return found


def plan(conn: Any, exp: str) -> Plan:
    """Everything ``rqrl clean`` would delete for ``exp`` (reads only).

    Raises:
        ValueError: ``exp`` is not a valid experiment name.
    """
    from common import keys

    p = Plan(exp)
    names = set(conn.scan_iter(match=keys.all_keys_pattern(exp), count=1000))  # validates the name
    if "/" not in exp:  # an experiment: its runs' keys too (the pattern's * also matches deeper names)
        names |= {k for k in conn.scan_iter(match=keys.runs_keys_pattern(exp), count=1000)
                  if _belongs(_key_namespace(k), exp)}
    names = sorted(names)
    if names:
        pipe = conn.pipeline(transaction=False)
        for k in names:
            pipe.type(k)
            pipe.pttl(k)
        replies = pipe.execute()
        for i, k in enumerate(names):
            typ = replies[2 * i]
            typ = typ.decode() if isinstance(typ, bytes) else str(typ)
            if typ == "none":
                continue  # expired between SCAN and TYPE
            ttl = replies[2 * i + 1]
            p.keys.append(KeyInfo(k.decode(), typ, _count(conn, k, typ), round(ttl / 1000, 1) if ttl and ttl > 0 else None))
    p.jobs = find_jobs(conn, exp, p.warnings)
    p.listed = [n.decode() for n in sorted(conn.smembers(keys.runs())) if _belongs(n.decode(), exp)]
    owners = []
    for ns in sorted({exp, *p.listed}):
        owner = conn.get(keys.coordinator_alive(ns))
        if owner:
            owners.append(owner.decode())
            p.coordinator_keys.append(keys.coordinator_alive(ns))
    p.coordinator = ", ".join(owners)
    return p


def render(p: Plan) -> str:
    """The plan as text: one line per key and per job."""
    from common import keys

    lines = [f"{p.exp}: {len(p.keys)} keys, {len(p.jobs)} RQ jobs"
             + (f"; runs listed in {keys.runs()}: {', '.join(p.listed)}" if p.listed else "")]
    if p.coordinator:
        lines.append(f"coordinator ALIVE: {p.coordinator} (key {', '.join(p.coordinator_keys)})")
    if p.keys:
        w = max(len(k.key) for k in p.keys)
        lines.append(f"{'KEY':<{w}}  {'TYPE':<6}  SIZE")
        for k in p.keys:
            ttl = f"  ttl {k.ttl_s:g} s" if k.ttl_s is not None else ""
            lines.append(f"{k.key:<{w}}  {k.type:<6}  {k.size}{ttl}")
    if p.jobs:
        w = max(len(j.job_id) for j in p.jobs)
        lines.append(f"{'QUEUE':<9}  {'JOB':<{w}}  {'STATUS':<9}  WHERE")
        for j in p.jobs:
            lines.append(f"{j.queue:<9}  {j.job_id:<{w}}  {j.status:<9}  {','.join(j.where)}")
    for warning in p.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def _drop_entry(conn: Any, registry: Any, label: str, job_id: str) -> None:
    if label == "started":
        # Entries are "{job_id}:{execution_id}" (RQ >= 2); the registry has no remove-by-id.
        stale = [e for e in conn.zrange(registry.key, 0, -1) if registry.parse_job_id(e) == job_id]
        if stale:
            conn.zrem(registry.key, *stale)
    else:
        registry.remove(job_id)


def _drop_step_data(conn: Any, names: list[str], shards: Any = None) -> int:
    """Delete the step data of each run among the keys ``names`` through its step-data stores (on
    ``conn`` and on every data shard of ``shards``, common/data_shards.py); returns how many keys
    went. A namespace that is no valid one (a stray key) holds none."""
    from common.data_shards import run_stores
    from common.step_data import StepDataStore

    deleted = 0
    for ns in sorted({_key_namespace(k.encode()) for k in names}):
        try:
            # The control Redis too: what the run left there before it had data shards.
            stores = [StepDataStore(conn, ns), *(run_stores(conn, shards, ns) if shards else [])]
        except ValueError:
            continue
        deleted += sum(store.drop_run() for store in stores)
    return deleted


def delete(conn: Any, p: Plan, shards: Any = None) -> dict[str, int]:
    """Delete what ``p`` lists: stop running jobs, delete jobs, the runs' step data (common/step_data.py),
    their other keys, and the runs' entries in ``rqrl:runs``.

    Returns:
        counts ``{"keys": n, "jobs": n, "stopped": n}``.
    """
    from rq import Queue
    from rq.command import send_stop_job_command
    from rq.job import Job

    from common import keys
    from common.rq_json import TaskSerializer

    stopped = jobs = 0
    for j in p.jobs:
        job = Job.fetch_many([j.job_id], connection=conn, serializer=TaskSerializer)[0]
        if job is None:
            continue
        if "started" in j.where:
            try:
                send_stop_job_command(conn, j.job_id)
                stopped += 1
            except Exception:  # not executing any more (InvalidJobOperation), or the worker is gone
                pass
        q = Queue(j.queue, connection=conn)
        for label, attr in _REGISTRIES:  # whatever the job's status says, leave no registry entry behind
            if label in j.where:
                _drop_entry(conn, getattr(q, attr), label, j.job_id)
        job.delete(remove_from_queue=True)
        jobs += 1
    names = [k.key for k in p.keys]
    deleted = _drop_step_data(conn, names, shards)
    for i in range(0, len(names), 1000):
        deleted += int(conn.delete(*names[i:i + 1000]))
    if p.listed:
        conn.srem(keys.runs(), *p.listed)
    return {"keys": deleted, "jobs": jobs, "stopped": stopped}


# ---------------------------------------------------------------------------- CLI
def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--exp", required=True,
                    help="a run, EXP/RUN (as rqrl status lists it), or an experiment EXP (exp_name: all its runs)")
    ap.add_argument("--redis-url", default=None,
                    help="redis://[user:pass@]host:port/db, rediss:// or unix:// (default: $RQRL_REDIS_URL)")
    ap.add_argument("--data-redis-url", default=None, metavar="URL[,URL...]",
                    help="the run's data shards, whose step data goes too (default: $RQRL_DATA_REDIS_URL)")
    ap.add_argument("--yes", action="store_true", help="really delete (default: a dry run that only lists)")
    ap.add_argument("--force", action="store_true", help="delete even while a coordinator of these runs is alive")


def clean(conn: Any, exp: str, yes: bool = False, force: bool = False, out: Any = None, shards: Any = None) -> int:
    """``rqrl clean`` on an open connection (and the run's data shards ``shards``, a
    :class:`common.data_shards.DataShards`); prints to ``out`` (stdout); returns the exit code."""
    from common import keys

    out = out or sys.stdout
    try:
        p = plan(conn, exp)
    except ValueError as e:
        print(f"rqrl clean: error: {e}", file=sys.stderr)
        return 1
    if p.empty:
        print(f"nothing to clean: no keys matching {keys.all_keys_pattern(exp)} or {keys.runs_keys_pattern(exp)} "
              f"and no RQ jobs of {exp}", file=out)
        return 0
    print(render(p), file=out, flush=True)
    if p.coordinator and not force:
        msg = (f"{exp!r} has a live coordinator ({p.coordinator}, key {', '.join(p.coordinator_keys)}); "
               "stop it first, or pass --force")
        if yes:
            print(f"rqrl clean: error: refusing to delete: {msg}", file=sys.stderr)
            return 1
        print(f"note: {msg} to delete", file=out)
    if not yes:
        print(f"dry run: nothing deleted; run again with --yes to delete these {len(p.keys)} keys and "
              f"{len(p.jobs)} RQ jobs", file=out)
        return 0
    counts = delete(conn, p, shards)
    print(f"deleted {counts['keys']} keys and {counts['jobs']} RQ jobs of {exp}"
          + (f" (sent stop to {counts['stopped']} running)" if counts["stopped"] else "")
          + (f"; removed {len(p.listed)} runs from {keys.runs()}" if p.listed else ""), file=out)
    return 0


def run(args: argparse.Namespace) -> int:
    import redis

    from common.connection import RedisUnavailable, connect_checked, redact, resolve_url, scrub

    from common.data_shards import DataShardConfigError, DataShards, resolve_urls

    url = resolve_url(args.redis_url)
    try:
        conn = connect_checked(url, socket_timeout=10)
        data_urls = resolve_urls(args.data_redis_url)
        shards = DataShards(data_urls) if data_urls else None
    except (RedisUnavailable, DataShardConfigError) as e:
        print(f"rqrl clean: error: {e}", file=sys.stderr)
        return 1
    try:
        return clean(conn, args.exp, yes=args.yes, force=args.force, shards=shards)
    except redis.RedisError as e:
        print(f"rqrl clean: error: Redis at {redact(url)}: {scrub(str(e), url)}", file=sys.stderr)
        return 1


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="rqrl clean",
                                 description="List or delete one run's (or experiment's) Redis keys and RQ jobs.")
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
