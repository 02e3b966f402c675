"""Which workers are alive, from keys every live worker keeps refreshing.

RQ's worker registry (``rq:workers:{queue}``) is written when a worker starts and cleaned when it
stops: a Redis that lost its data (restarted without persistence) has an empty registry while
the workers go on serving, and workers that died without their ``register_death`` (a full
Redis refused it) stay in it until their key expires, minutes later. So rqrl's worker classes
(workers/worker.py) also keep ``rqrl:worker:{name}:alive`` (TTL :data:`TTL_S`) and their name in
``rqrl:workers:{queue}``, refreshed every :data:`REFRESH_S` seconds; both come back within one
refresh after a wipe and a dead worker stops counting within :data:`TTL_S`. A stock ``rq
worker`` (no ``-w``) writes neither and is counted from RQ's registry as before.
"""

from __future__ import annotations

from typing import Any

from rq import worker_registration
from rq.worker import Worker

from common import keys

TTL_S = 30
REFRESH_S = 10.0


def refresh(conn: Any, name: str, queues: list[str]) -> None:
    """Mark worker ``name`` (listening on ``queues``) alive for :data:`TTL_S` seconds: one round trip.

    Raises:
        redis.RedisError: the write failed (the caller's next refresh tries again).
    """
    pipe = conn.pipeline(transaction=False)
    pipe.set(keys.worker_alive(name), "1", ex=TTL_S)
    for q in queues:
        pipe.sadd(keys.workers_alive(q), name)
    pipe.execute()


def leave(conn: Any, name: str, queues: list[str]) -> None:
    """Worker ``name`` stops: it no longer counts, at once.

    Raises:
        redis.RedisError: the write failed (its key then expires within :data:`TTL_S`).
    """
    pipe = conn.pipeline(transaction=False)
    pipe.delete(keys.worker_alive(name))
    for q in queues:
        pipe.srem(keys.workers_alive(q), name)
    pipe.execute()


def count_live(conn: Any, queue: str) -> int:
    """The live workers on ``queue``: rqrl's workers whose alive key exists, plus the workers in
    RQ's registry that are not rqrl's (a stock ``rq worker``) whose RQ key exists. Two round
    trips, a third to forget rqrl workers gone from both (RQ's key of a dead one may linger: it
    is not counted).

    Raises:
        redis.RedisError: Redis failed.
    """
    pipe = conn.pipeline(transaction=False)
    pipe.smembers(keys.workers_alive(queue))
    pipe.smembers(worker_registration.WORKERS_BY_QUEUE_KEY % queue)
    ours_raw, rq_raw = pipe.execute()
    ours = sorted(_text(n) for n in ours_raw)
    rq_key = {n: Worker.redis_worker_namespace_prefix + n for n in ours}
    stock = sorted({_text(k) for k in rq_raw} - set(rq_key.values()))
    if not ours and not stock:
        return 0
    pipe = conn.pipeline(transaction=False)
    for n in ours:
        pipe.exists(keys.worker_alive(n))
        pipe.exists(rq_key[n])
    for k in stock:
        pipe.exists(k)
    found = [int(f) for f in pipe.execute()]
    alive, rq_alive, stock_alive = found[0:2 * len(ours):2], found[1:2 * len(ours):2], found[2 * len(ours):]
    gone = [n for n, a, r in zip(ours, alive, rq_alive) if not a and not r]
    if gone:
        conn.srem(keys.workers_alive(queue), *gone)
    return sum(alive) + sum(stock_alive)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
