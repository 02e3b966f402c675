"""The run's tasks in flight: what the coordinator enqueued and has not seen end.

The table owns the running tasks, the set of records changed since they were last written to
Redis (``rqrl:{exp}:tasks``), the write leases to revoke with that write, and the count of
failures in a row per task kind. It calls the commander to free a failed task's space; the
coordinator writes the table (:meth:`TaskTable.persist`) in the same MULTI/EXEC as its own
state, so the two never disagree after a crash.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import redis
from easydict import EasyDict
from rq import Queue
from rq.job import Callback, Job, JobStatus

from common import keys, lease
from common.data_shards import pick_shard
from common.rq_json import TaskSerializer
from coordinator.commander import BaseCommander

_JOB_FUNC = {"collector": "workers.collector.run_collector_task", "learner": "workers.learner.run_learner_task"}
_QUEUE = {"collector": keys.COLLECTOR_QUEUE, "learner": keys.LEARNER_QUEUE}
# A lease outlives its task's RQ job timeout by this much (seconds): a task never loses it while RQ still runs it.
_LEASE_MARGIN_S = 3600


class TaskTable:
    """Running tasks of one run: ``{task_id: {"task", "kind", "started", "enqueued"}}``.

    Args:
        conn: Redis client (bytes replies, as RQ needs).
        exp: the run's namespace (:func:`common.keys.namespace`).
        cfg: the compiled config (``commander.*_job_timeout``: seconds).
        commander: told when a task fails or is cancelled, so it frees the task's space.
        log: the coordinator's logger.
        data_shards: the run's number of data shards (0: step data on ``conn``): each training
            collector task is given the shard fewest running tasks write to, each learner task the count.
    """

    def __init__(self, conn: redis.Redis, exp: str, cfg: EasyDict, commander: BaseCommander,
                 log: logging.Logger, data_shards: int = 0) -> None:
        self.conn, self.exp, self.cfg, self.commander, self.log = conn, exp, cfg, commander, log
        self.data_shards = data_shards
        self._shard_turn = 0  # training collector tasks given a shard (pick_shard's turn)
        # JSON payloads: no worker ever unpickles what it reads from Redis (common/rq_json.py).
        self.queues = {kind: Queue(name, connection=conn, serializer=TaskSerializer) for kind, name in _QUEUE.items()}
        self.running: dict[str, dict[str, Any]] = {}
        self.dirty: set[str] = set()  # task ids whose record changed since the last persist
        self.drop_leases: list[str] = []  # task ids whose leases the next persist revokes
        # Failures in a row per task kind: collectors that keep finishing must not hide a learner
        # that fails every time (nor the other way round).
        self.failures_in_a_row = {"collector": 0, "learner": 0}
        self.last_failure = ""
        # Held while tasks are enqueued: the liveness pass never sees a task whose RQ job is not
        # written yet (it would read the job as gone).
        self.enqueue_lock = threading.Lock()

    def _timeout(self, kind: str) -> int:
        c = self.cfg.commander
        return int(c.learner_job_timeout if kind == "learner" else c.collector_job_timeout)

    def enqueue(self, kind: str, task: dict, pipe: redis.client.Pipeline) -> None:
        """Queue ``task`` as an RQ job (job id = task id, ``job_timeout`` from the config) and grant
        its write lease, both on ``pipe``; the caller holds :attr:`enqueue_lock` and runs ``pipe``.
        With data shards the task is given its shard first (:meth:`with_shard`)."""
        task = self.with_shard(kind, task)
        timeout = self._timeout(kind)
        self.running[task["task_id"]] = {"task": task, "kind": kind, "started": False, "enqueued": time.time()}
        self.dirty.add(task["task_id"])
        self.queues[kind].enqueue_call(
            _JOB_FUNC[kind], args=(task,), job_id=task["task_id"], timeout=timeout,
            # RQ keeps a finished job's hash and result stream for `rq info` and the dashboard only
            # (the coordinator reads events): as long as the run's step data, so a long run holds
            # the jobs of that window only (an eval a second on CartPole kept 3,600 records at an
            # hour: bench_soak). A failed job is kept a week, for a post-mortem.
            result_ttl=int(self.cfg.policy.collect.collector.data_ttl), failure_ttl=7 * 86400,
            description=f"rqrl {self.exp} {kind}{' eval' if task.get('eval_flag') else ''} {task['task_id']}",
            on_failure=Callback("workers.callbacks.report_job_failure"),
            at_front=bool(task.get("eval_flag")),  # an eval should not wait behind training tasks
            pipeline=pipe,
        )
        lease.grant(pipe, self.exp, task["task_id"], timeout + _LEASE_MARGIN_S)
        # One line per training collector task would cost the loop more than the dispatch: DEBUG.
        level = logging.DEBUG if kind == "collector" and not task.get("eval_flag") else logging.INFO
        self.log.log(level, "dispatched %s%s task %s", kind, " (eval)" if task.get("eval_flag") else "", task["task_id"])

    def with_shard(self, kind: str, task: dict) -> dict:
        """``task`` with its data shard fields (common/messages.py): ``data_shards`` on a learner
        task, and ``data_shard`` too on a training collector task, one of the shards fewest running
        tasks write to, in turn (:func:`common.data_shards.pick_shard`); as it is without data shards or for an eval."""
        if not self.data_shards or (kind == "collector" and task.get("eval_flag")):
            return task
        if kind != "collector":
            return {**task, "data_shards": self.data_shards}
        loads = [0] * self.data_shards
        for entry in self.running.values():
            shard = entry["task"].get("data_shard")
            if shard is not None and shard < self.data_shards:
                loads[shard] += 1
        self._shard_turn += 1
        return {**task, "data_shards": self.data_shards, "data_shard": pick_shard(loads, self._shard_turn - 1)}

    def snapshot(self) -> list[tuple[str, dict[str, Any]]]:
        """The running tasks as a list, taken while no enqueue is half done (for the liveness thread)."""
        with self.enqueue_lock:
            return list(self.running.items())

    def mark_started(self, tid: str) -> None:
        self.running[tid]["started"] = True
        self.dirty.add(tid)

    def finish(self, tid: str, kind: str) -> dict[str, Any]:
        """Remove a task that reported ``finished``; returns its entry."""
        entry = self.running.pop(tid)
        self.dirty.add(tid)
        self.drop_leases.append(tid)
        self.failures_in_a_row[kind] = 0
        return entry

    def fail(self, tid: str, reason: str) -> None:
        """Remove a failed task, revoke its lease and free its space in the commander (a learner
        rank takes its group with it: :meth:`drop_group`)."""
        entry = self.running.pop(tid)
        self.dirty.add(tid)
        # Revoked in the same transaction as the state change: a zombie task can no longer write.
        self.drop_leases.append(tid)
        self.failures_in_a_row[entry["kind"]] += 1
        self.last_failure = f"{entry['kind']} task {tid}: {reason}"
        self.log.warning("%s task %s failed: %s; its space is freed and a replacement will be issued",
                         entry["kind"], tid, reason)
        if entry["kind"] == "collector":
            self.commander.notify_fail_collector_task(entry["task"])
        else:
            self.commander.notify_fail_learner_task(entry["task"])
            self.drop_group(entry["task"], tid)

    def drop_group(self, task: dict, lost: str) -> None:
        """A lost rank fails its learner group: the other ranks are dropped too (leases revoked,
        so they cannot write; their collectives fail or time out and they exit), and the
        commander's replacement group resumes from checkpoint ``latest``."""
        group = task.get("group_id")
        if group is None:
            return
        for tid in [t for t, e in self.running.items() if e["kind"] == "learner" and e["task"].get("group_id") == group]:
            entry = self.running.pop(tid)
            self.dirty.add(tid)
            self.drop_leases.append(tid)
            self.log.warning("learner task %s (rank %s of group %s) dropped with its group: %s was lost",
                             tid, entry["task"].get("rank"), group, lost)

    def cancel_queued(self) -> None:
        """Cancel the RQ jobs of tasks that have not started and drop them from the table (the
        caller persists)."""
        waiting = [t for t, e in self.running.items() if not e["started"]]
        for job in Job.fetch_many(waiting, connection=self.conn, serializer=TaskSerializer) if waiting else []:
            if job is not None and job.get_status(refresh=False) == JobStatus.QUEUED:
                job.cancel()
        for t in waiting:
            entry = self.running.pop(t)
            self.dirty.add(t)
            self.drop_leases.append(t)
            if entry["kind"] == "collector":
                self.commander.notify_fail_collector_task(entry["task"])

    def adopt(self, failures_in_a_row: Any) -> None:
        """Take over the running tasks an earlier coordinator of this run left in Redis."""
        saved = failures_in_a_row if isinstance(failures_in_a_row, dict) else {}
        self.failures_in_a_row = {"collector": 0, "learner": 0, **saved}
        self.running = {k.decode(): json.loads(v) for k, v in self.conn.hgetall(keys.tasks(self.exp)).items()}

    def regrant(self, pipe: redis.client.Pipeline) -> None:
        """Queue every running task's lease and record on ``pipe`` again (after a Redis failover)."""
        for tid, entry in self.running.items():
            lease.grant(pipe, self.exp, tid, self._timeout(entry["kind"]) + _LEASE_MARGIN_S)
        self.dirty.update(self.running)

    def persist(self, pipe: redis.client.Pipeline) -> redis.client.Pipeline:
        """Queue the task records changed since the last call, and the lease revocations, on ``pipe``."""
        # The config, the bulk of a task, is left out: the coordinator has it (a resumed run too).
        changed = {t: json.dumps(dict(self.running[t], task={k: v for k, v in self.running[t]["task"].items()
                                                             if k != "config"}))
                   for t in self.dirty if t in self.running}
        gone = [t for t in self.dirty if t not in self.running]
        if changed:
            pipe.hset(keys.tasks(self.exp), mapping=changed)
        if gone:
            pipe.hdel(keys.tasks(self.exp), *gone)
        lease.revoke(pipe, self.exp, *self.drop_leases)
        self.dirty.clear()
        self.drop_leases.clear()
        return pipe
