"""RQ worker classes for rqrl: the job modules, torch and gymnasium imported once per worker.

``PreloadWorker`` is RQ's forking ``Worker`` whose parent imports torch, gymnasium and the job
modules once, and ``torch._dynamo`` when it starts, so each forked work-horse inherits them
instead of paying ~1.5-2 s of imports, and ~1.1-1.5 s more for its first optimizer, per task
(learners use it)::

    rq worker learner --url redis://head:6379/0 -w workers.worker.PreloadWorker

``CollectorWorker`` runs collector tasks in its own process, one after another (RQ's
``SimpleWorker``: no fork per job, RQ's job timeout still enforced by its SIGALRM death
penalty), so it keeps each run's envs between tasks (workers/live_envs.py): an episode outlives
the task that started it, and a run's envs are built once per worker (one ROM load, not one per
task)::

    rq worker collector --url redis://head:6379/0 -w workers.worker.CollectorWorker

The plain forking worker still runs collector tasks, rebuilding and resetting envs at every
task (it says so once in its log). Why in-process rather than envs held by a forking parent:
see docs/architecture.md ("Envs live on the collector worker").
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

import gymnasium  # noqa: F401  (pre-import for forked work-horses)
import gymnasium.envs.classic_control  # noqa: F401
import tensorboard.compat.proto.event_pb2  # noqa: F401  (the learner's TensorBoard writer)
import tensorboard.summary.writer.event_file_writer  # noqa: F401
import redis
import torch  # noqa: F401
from rq import Queue
from rq.worker import SimpleWorker, Worker

import workers.collector  # noqa: F401
from common import keys, worker_presence
from common.connection import with_retries
from common.redis_memory import redis_full
from common.rq_json import TaskSerializer
import workers.learner  # noqa: F401
from workers import live_envs

# A CollectorWorker refreshes its RQ worker key with this TTL (seconds) every third of it: a
# SimpleWorker's own heartbeat covers a whole job (job timeout + 60 s), so without this a
# worker killed mid-task would count as live for ~11 minutes (the coordinator sizes the
# collector task space from the live workers).
_KEY_TTL_S = 60
_SWEEP_EVERY_S = 10.0
# How often a worker tries RQ's bookkeeping again while Redis answers OOM (seconds).
_FULL_REDIS_RETRY_S = 5.0
# Seconds the thread of RQ's command channel waits per poll (RQ: 60). At a worker's end RQ
# unsubscribes, then stops that thread, and redis-py joins it while it waits out its poll for a
# subscription that will not come: a worker's exit took up to a minute (py-spy: the main thread in
# PubSubWorkerThread.stop's join, the channel's thread in get_message's wait).
_COMMAND_POLL_S = 1.0


class _RqrlWorker:
    """What both worker classes add to RQ's: a Redis client that retries connection errors and
    ``OOM`` replies with backoff (~10 s; stock RQ quits on the first refused write of its
    bookkeeping, so a Redis that is full for the few seconds the coordinator needs to stop the run
    and free memory would kill it), and the worker's address read as the least-privilege ACL
    user may (deploy/redis/users.acl.example)."""

    def __init__(self, queues: Any, *args: Any, connection: Any = None, serializer: Any = None,
                 **kwargs: Any) -> None:
        if connection is not None:
            connection = with_retries(connection)
        # JSON whatever -S says (common/rq_json.py): a worker that unpickles job payloads runs the
        # code of whoever can write to the Redis. The queues are rebuilt by name so that they
        # fetch jobs with it too (`rq worker` hands over queues made with its own -S).
        names = [getattr(q, "name", q) for q in ([queues] if isinstance(queues, (str, Queue)) else queues)]
        super().__init__(names, *args, connection=connection, serializer=TaskSerializer, **kwargs)

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """RQ's work loop, with this worker's alive key refreshed beside it (common/worker_presence.py:
        the coordinator counts live collector workers from it, also after a Redis lost RQ's registry)."""
        stop = threading.Event()
        queues = [q.name for q in self.queues]
        try:
            keys.worker_alive(self.name)
        except ValueError:  # a name that cannot be a key component: counted from RQ's registry only
            return super().work(*args, **kwargs)
        beat = threading.Thread(target=self._keep_alive, args=(stop, queues), name="presence", daemon=True)
        beat.start()
        try:
            return super().work(*args, **kwargs)
        finally:
            stop.set()
            beat.join(timeout=5)
            try:
                worker_presence.leave(self.connection, self.name, queues)
            except redis.RedisError:
                pass  # its key expires within worker_presence.TTL_S

    def subscribe(self) -> None:
        """RQ's subscription to this worker's command channel (``rq`` stop / kill commands), as RQ
        makes it but polled every :data:`_COMMAND_POLL_S` seconds, so the worker's end waits at most that."""
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(sleep_time=_COMMAND_POLL_S, daemon=True,
                                                       exception_handler=self._pubsub_exception_handler)

    # RQ's own writes of its idle loop: a full Redis refuses them, and RQ quits on the first
    # error its loop sees. Waited out here instead, so the worker serves again once Redis has room.
    def dequeue_job_and_maintain_ttl(self, *args: Any, **kwargs: Any) -> Any:
        return self._through_full_redis(super().dequeue_job_and_maintain_ttl, *args, **kwargs)

    def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        return self._through_full_redis(super().heartbeat, *args, **kwargs)

    def run_maintenance_tasks(self, *args: Any, **kwargs: Any) -> Any:
        return self._through_full_redis(super().run_maintenance_tasks, *args, **kwargs)

    def check_for_suspension(self, *args: Any, **kwargs: Any) -> Any:
        # Writes RQ's worker heartbeat in a MULTI/EXEC, which a full Redis aborts as a whole.
        return self._through_full_redis(super().check_for_suspension, *args, **kwargs)

    def execute_job(self, job: Any, queue: Any) -> Any:
        """RQ's, but a job whose end RQ cannot record because Redis is full does not end the worker:
        the task already reported its own end (or its heartbeat stops), which is what the
        coordinator follows; only RQ's registry entry for the job is left behind."""
        try:
            return super().execute_job(job, queue)
        except redis.RedisError as e:
            if not redis_full(e):
                raise
            if getattr(self, "horse_pid", 0):  # a forked work-horse may still run the job
                try:
                    self.wait_for_horse()
                except ChildProcessError:
                    pass  # already reaped by RQ
            self.log.warning("Worker %s: job %s ended while Redis is full (%s); RQ did not record its end",
                             self.name, job.id, e)

    def _through_full_redis(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(...)``, tried again every :data:`_FULL_REDIS_RETRY_S` seconds while Redis answers
        ``OOM`` (after the client's own ~15 s of retries); a stop request (SIGTERM while idle)
        ends the wait."""
        waited = False
        while True:
            try:
                result = fn(*args, **kwargs)
            except redis.RedisError as e:
                if not redis_full(e):
                    raise
                if not waited:
                    self.log.warning("Worker %s: Redis is full (%s); waiting for room, retrying every %.0f s",
                                     self.name, e, _FULL_REDIS_RETRY_S)
                    waited = True
                if self._stop_requested:
                    raise
                threading.Event().wait(_FULL_REDIS_RETRY_S)  # a signal (StopRequested) interrupts it
                continue
            if waited:
                self.log.info("Worker %s: Redis has room again; serving", self.name)
            return result

    def _keep_alive(self, stop: threading.Event, queues: list[str]) -> None:
        while True:
            try:
                worker_presence.refresh(self.connection, self.name, queues)
            except redis.RedisError:
                pass  # a blip, a full Redis: the next refresh tries again; the TTL covers two misses
            if stop.wait(worker_presence.REFRESH_S):
                return

    def _set_ip_address(self, connection: Any) -> None:
        """The worker's address from ``CLIENT INFO``, as rq 3 reads it: rq 2.12 reads ``CLIENT
        LIST``, which the least-privilege ACL user may not run."""
        try:
            connection.client_setname(self.name)
            self.ip_address = str(connection.client_info()["addr"])
        except redis.ResponseError:
            super()._set_ip_address(connection)


class PreloadWorker(_RqrlWorker, Worker):
    """``rq.worker.Worker`` whose module pre-imports rqrl's job code (see module docstring).

    It also imports ``torch._dynamo`` when created, before it forks any work-horse: every
    ``torch.optim.Optimizer`` imports it (and sympy, ~800 modules, 1.1-1.5 s of CPU) the first
    time it is built in a process, because ``Optimizer.add_param_group`` is wrapped by
    ``torch._disable_dynamo`` (torch/_compile.py), so each learner task's work-horse paid it.
    Here, not at module level: ``rqrl train`` imports this module before it forks the collector
    workers, which build no optimizer; only learner workers pay, once, after their fork.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        importlib.import_module("torch._dynamo")


class CollectorWorker(_RqrlWorker, SimpleWorker):
    """A non-forking worker that keeps each run's envs between its collector tasks (module docstring).

    At most ``$RQRL_ENV_CACHE_RUNS`` runs' envs (default 2; ``rqrl sweep`` sets its number of
    seeds) are kept, least recently used out; a run's envs close at its stop flag or after
    ``collector.env_idle_s`` seconds without a task of the run, and all of them when the worker
    exits.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env_cache = live_envs.enable(int(os.environ.get("RQRL_ENV_CACHE_RUNS", "2")))
        self._housekeeping_stop = threading.Event()
        self._housekeeper = threading.Thread(target=self._housekeeping, name="env-cache", daemon=True)

    def work(self, *args: Any, **kwargs: Any) -> bool:
        self._housekeeper.start()
        try:
            return super().work(*args, **kwargs)
        finally:
            self._housekeeping_stop.set()
            self.env_cache.close_all()

    def _housekeeping(self) -> None:
        """Close envs idle past their ``env_idle_s``; keep the RQ worker key's TTL short."""
        tick = min(_SWEEP_EVERY_S, _KEY_TTL_S / 3)
        while not self._housekeeping_stop.wait(tick):
            self.env_cache.sweep()
            try:
                self.connection.expire(self.key, _KEY_TTL_S)
            except Exception:  # a Redis blip: the next tick retries, the TTL tolerates misses
                continue
