"""Data shards: the Redis servers that hold a run's step data when it is not the control Redis.

``--data-redis-url URL[,URL...]`` (``rqrl train``, ``python -m coordinator``, ``rqrl clean``),
else ``$RQRL_DATA_REDIS_URL``, else the config key ``system.data_redis_url`` names them; none
(the default) keeps step data on the control Redis (``--redis-url``), as before shards existed.
Chunk blobs, buffer streams and their stats go to the shards; RQ's queues, task leases, events,
the env-step counter and the run's records stay on the control Redis.

The coordinator gives each training collector task one shard (``data_shard``, an index into the
list, with the list's length ``data_shards``: coordinator/task_table.py), one of those fewest
running tasks write to, in turn; the learner reads every shard. A worker resolves the URLs the same way (its own
``$RQRL_DATA_REDIS_URL``, else the task's config), so no credential travels in a task message;
it refuses a task whose shard count differs from its own list.

A Redis Cluster URL (``redis+cluster://host:port[?shards=N]``, common/connection.py) counts as
``N`` shards (default 4), each one hash slot of the cluster (common/keys.py ``slot_tag``), in
the list's order where it stands: ``--data-redis-url redis+cluster://c1:7000?shards=3`` is shards
0-2. Each shard's keys share a slot, so its scripts run on one primary; the shards' slots fall in
equal ranges of the slot space, so they spread over primaries that hold equal ranges. A shard's
memory and answers are its primary's (the node that holds its slot).
"""

from __future__ import annotations

import collections
import os
import re
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from common import keys
from common.connection import (CLUSTER_SCHEMES, RedisUnavailable, check_server_version, cluster_shard_count, connect,
                               connect_checked, connect_cluster, is_cluster_url, redact, scrub, with_retries)
from common.step_data import StepDataStore

ENV_DATA_URL = "RQRL_DATA_REDIS_URL"
CONFIG_KEY = "system.data_redis_url"
_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)
# A comma followed by the next URL's scheme separates two URLs (a comma inside a URL, as in a
# Sentinel address list, is not followed by ``scheme://``).
_SPLIT = re.compile(r"\s*,\s*(?=[a-z][a-z0-9+.-]*://)")
# Seconds of totals a shard's chunk rate is taken over (rqrl status: recent, not the run's average).
RATE_WINDOW_S = 10.0


class DataShardConfigError(ValueError):
    """A data shard URL list that cannot be used (names the redacted URL and why)."""


def parse_urls(text: Optional[str]) -> list[str]:
    """The URLs of ``URL[,URL...]`` ("" or None: none).

    Raises:
        DataShardConfigError: a URL whose scheme is not redis://, rediss://, unix://,
            redis+cluster:// or rediss+cluster:// (a Sentinel URL is not a data shard in this
            version), a cluster URL whose ``shards`` or database is wrong, or one URL given twice.
    """
    urls = [u for u in _SPLIT.split((text or "").strip()) if u]
    for url in urls:
        scheme = url.partition("://")[0] if "://" in url else ""
        if scheme not in _SCHEMES:
            raise DataShardConfigError(f"data shard URL {redact(url)!r}: scheme must be redis://, rediss://, "
                                       "unix://, redis+cluster:// or rediss+cluster:// (Sentinel is not a data "
                                       "shard in this version)")
        if scheme in CLUSTER_SCHEMES:
            try:
                cluster_shard_count(url)
            except ValueError as e:
                raise DataShardConfigError(f"data shard URL: {e}") from None
    if len(set(urls)) != len(urls):
        raise DataShardConfigError(f"data shard URLs name one server twice: {', '.join(map(redact, urls))}")
    return urls


def resolve_urls(flag: Optional[str], cfg: Any = None) -> list[str]:
    """The data shard URLs: ``flag`` (``--data-redis-url``), else ``$RQRL_DATA_REDIS_URL``, else the
    config's ``system.data_redis_url``; [] = step data on the control Redis.

    Raises:
        DataShardConfigError: as :func:`parse_urls`.
    """
    system = (cfg or {}).get("system") or {}
    return parse_urls(flag or os.environ.get(ENV_DATA_URL) or system.get("data_redis_url", ""))


def shard_count(urls: Sequence[str]) -> int:
    """How many data shards ``urls`` hold: one per server URL, ``shards`` per cluster URL."""
    return sum(cluster_shard_count(u) if is_cluster_url(u) else 1 for u in urls)


def shard_label(index: int, url: str, tag: str = "") -> str:
    """How shard ``index`` is named in messages: ``data shard 1 (redis://***@host:6380/0)``, on a
    cluster with its hash tag: ``data shard 1 (redis+cluster://host:7000/0 {shard1.0})``."""
    return f"data shard {index} ({redact(url)}{' ' + tag if tag else ''})"


class _Shard(NamedTuple):
    """Where shard ``i`` of a :class:`DataShards` lives: the index of its URL, and its hash tag on a
    cluster ("" on a server of its own)."""

    url_index: int
    tag: str


def _shards_of(url_index: int, url: str) -> list[_Shard]:
    """The shards URL ``url`` (number ``url_index`` of the list) holds: itself, or a cluster's ``shards`` slot tags."""
    if not is_cluster_url(url):
        return [_Shard(url_index, "")]
    n = cluster_shard_count(url)
    return [_Shard(url_index, keys.slot_tag(k, n)) for k in range(n)]


class DataShards:
    """Connections to the data shards of ``urls`` (in order: a task's ``data_shard`` indexes the
    shards, a cluster URL's ``shards`` of them in its place), with rqrl's retries (and, for workers
    on a server URL, waiting out an OOM reply: :func:`common.connection.with_retries`).

    Raises:
        DataShardConfigError: no URLs, or a URL that cannot be parsed (redacted).
        common.connection.RedisUnavailable: a cluster URL none of whose nodes answered, or a server
            not in cluster mode (a cluster client reads the slot map when it is made).
    """

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise DataShardConfigError("no data shard URLs")
        self.urls = list(urls)
        try:
            self.conns = [connect_cluster(u) if is_cluster_url(u) else with_retries(connect(u)) for u in self.urls]
            self._shards = [shard for i, u in enumerate(self.urls) for shard in _shards_of(i, u)]
        except ValueError as e:
            raise DataShardConfigError(str(e)) from None
        self._probes: list[Optional[redis.Redis]] = [None] * len(self.urls)
        # (time, chunks produced) per shard from the totals of the last RATE_WINDOW_S seconds
        self._counts: list[collections.deque[tuple[float, int]]] = [collections.deque() for _ in self._shards]
        self.clock: Callable[[], float] = time.monotonic  # the rates' clock (seconds)

    def __len__(self) -> int:
        return len(self._shards)

    def label(self, index: int) -> str:
        """Shard ``index``'s name in messages (:func:`shard_label`)."""
        return shard_label(index, self.urls[self._shards[index].url_index], self._shards[index].tag)

    def store(self, index: int, control: redis.Redis, ns: str, buffer_id: str = "",
              probe: bool = False) -> StepDataStore:
        """The step-data store of run ``ns`` (buffer ``buffer_id``) on shard ``index``; with
        ``probe``, on a client without retries (2 s timeout: reads that must not wait out a dead shard)."""
        where = self._shards[index]
        conn = self._probe(where.url_index) if probe else self.conns[where.url_index]
        return StepDataStore(conn, ns, buffer_id, control=control, label=self.label(index), tag=where.tag)

    def _server(self, index: int) -> redis.Redis:
        """A client without retries on the server that holds shard ``index``: the shard's own, or on
        a cluster the primary of its slot (as the cluster client's slot map has it)."""
        where = self._shards[index]
        probe = self._probe(where.url_index)
        if not where.tag:
            return probe
        return probe.get_node_from_key(where.tag).redis_connection  # type: ignore[attr-defined]

    def stores(self, control: redis.Redis, ns: str, buffer_id: str = "", probe: bool = False) -> list[StepDataStore]:
        """One store per shard, in shard order (``probe``: as :meth:`store`)."""
        return [self.store(i, control, ns, buffer_id, probe) for i in range(len(self))]

    def check(self, cfg: Any, allow_eviction: bool, collectors: int, patient: bool = True) -> list[str]:
        """Before a run: every shard answers (:func:`common.connection.connect_checked`) and suits
        a run (:func:`common.redis_memory.check_memory_settings`, the run's whole estimate on each);
        returns the warnings, each naming its shard.

        Raises:
            RedisUnavailable, RedisNotSuitable: naming the shard and its redacted URL.
        """
        from common.redis_memory import RedisNotSuitable, check_memory_settings

        warnings = []
        for i, url in enumerate(self.urls):
            first = next(k for k, sh in enumerate(self._shards) if sh.url_index == i)
            name = self.label(first) if not is_cluster_url(url) else f"data shards of {redact(url)}"
            if is_cluster_url(url):
                warnings += self._check_cluster(url, name, cfg, allow_eviction, collectors)
                continue
            try:
                probe = connect_checked(url, socket_timeout=5, patient=patient)
            except RedisUnavailable as e:
                raise RedisUnavailable(f"{name}: {e}") from None
            try:
                warnings += [f"{name}: {w}" for w in check_memory_settings(probe, cfg, allow_eviction, collectors)]
            except RedisNotSuitable as e:
                raise RedisNotSuitable(f"{name}: {e}") from None
            finally:
                probe.close()
        return warnings

    @staticmethod
    def _check_cluster(url: str, name: str, cfg: Any, allow_eviction: bool, collectors: int) -> list[str]:
        """:meth:`check` of a cluster: every primary's version and memory settings, each named by its address."""
        from common.redis_memory import RedisNotSuitable, check_memory_settings

        probe = connect_cluster(url, socket_timeout=5, retries=False)
        warnings = []
        try:
            for node in probe.get_primaries():
                where = f"{name}, primary {node.host}:{node.port}"
                try:
                    check_server_version(node.redis_connection, url)
                    warnings += [f"{where}: {w}" for w in check_memory_settings(node.redis_connection, cfg,
                                                                                allow_eviction, collectors)]
                except RedisNotSuitable as e:
                    raise RedisNotSuitable(f"{where}: {e}") from None
                except redis.RedisError as e:
                    raise RedisUnavailable(f"{where}: {type(e).__name__}: {scrub(str(e), url)}") from None
        finally:
            probe.close()
        return warnings

    def totals(self, ns: str, buffer_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Per shard, for summary.json and ``rqrl status``: its redacted ``url``, the ``chunks``
        produced on it and their ``bytes`` over buffers ``buffer_ids`` of run ``ns``, its
        ``chunks_per_s`` over the last :data:`RATE_WINDOW_S` seconds of calls (0.0 on the first),
        its ``used_memory`` and ``maxmemory`` (bytes, 0 = no limit; absent where an ACL refuses
        INFO); ``error`` instead where the shard did not answer (read without retries: a dead
        shard costs one timeout, not the retries')."""
        from common.redis_memory import memory_info

        out: list[dict[str, Any]] = []
        now = self.clock()
        for i, where in enumerate(self._shards):
            url = self.urls[where.url_index]
            row: dict[str, Any] = {"url": redact(url), **({"tag": where.tag} if where.tag else {})}
            try:
                stores = [self.store(i, self.conns[where.url_index], ns, b, probe=True) for b in buffer_ids]
                counts = [s.stats() for s in stores]
                chunks = sum(c.get("produced", 0) for c in counts)
                row.update(chunks=chunks, bytes=sum(c.get("produced_bytes", 0) for c in counts),
                           chunks_per_s=self._rate(i, now, chunks))
                try:
                    mem = memory_info(self._server(i))
                    row.update(used_memory=mem["used"], maxmemory=mem["max"])
                except redis.ResponseError:  # INFO refused by an ACL: the counts still stand
                    pass
                out.append(row)
            except _UNANSWERED as e:
                out.append({**row, "error": f"{type(e).__name__}: {scrub(str(e), url)}"})
        return out

    def _rate(self, index: int, now: float, chunks: int) -> float:
        """Shard ``index``'s chunks per second since its oldest count inside the rate window."""
        seen = self._counts[index]
        seen.append((now, chunks))
        while len(seen) > 2 and now - seen[1][0] >= RATE_WINDOW_S:
            seen.popleft()
        (t0, c0), (t1, c1) = seen[0], seen[-1]
        return round((c1 - c0) / (t1 - t0), 2) if t1 > t0 else 0.0

    def full(self) -> dict[int, str]:
        """Shard index -> a line naming it, for each shard whose memory is at its ``maxmemory``
        (writes to it are refused, so collectors writing there wait for room); a shard that does
        not answer or refuses INFO is left to :meth:`unreachable`."""
        from common.redis_memory import memory_info

        lines = {}
        for i in range(len(self)):
            try:
                mem = memory_info(self._server(i))
            except _UNANSWERED:
                continue
            if mem["max"] and mem["used"] >= mem["max"]:
                lines[i] = (f"{self.label(i)} is full ({mem['used']:,} of maxmemory {mem['max']:,} bytes): "
                            "collectors writing to it wait for room")
        return lines

    def _probe(self, url_index: int, timeout_s: float = 2.0) -> redis.Redis:
        """URL ``url_index``'s client without retries (health checks and summaries)."""
        if self._probes[url_index] is None:
            url = self.urls[url_index]
            self._probes[url_index] = (
                connect_cluster(url, socket_timeout=timeout_s, retries=False) if is_cluster_url(url) else
                redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                     retry=Retry(NoBackoff(), 0)))
        return self._probes[url_index]

    def unreachable(self) -> list[str]:
        """One PING per shard (on a cluster, to its slot's primary), without retries, each at most
        2 s: a line naming each shard that did not answer (its URL redacted, the error scrubbed),
        [] when all did."""
        bad = []
        for i, where in enumerate(self._shards):
            try:
                self._server(i).ping()
            except _UNANSWERED as e:
                bad.append(f"{self.label(i)} unreachable: {type(e).__name__}: "
                           f"{scrub(str(e), self.urls[where.url_index])}")
        return bad

    def close(self) -> None:
        """Close every connection (idempotent)."""
        for conn in [*self.conns, *filter(None, self._probes)]:
            conn.close()


# What a shard that does not answer raises: redis-py's errors, a cluster client's own (no node
# answered, a slot no primary holds: RedisClusterException is not a RedisError) and ours.
_UNANSWERED = (redis.RedisError, RedisClusterException, RedisUnavailable)

# The coordinator pings every data shard this often (seconds); this many failures in a row stop the
# run, naming the shard (~3 s: before a worker's own retries, ~15 s, fail its task, which would
# read as the worker's fault).
SHARDS_EVERY_S = 1.0
SHARD_TRIES = 3


class ShardWatch:
    """The coordinator's watch on the data shards: :meth:`poll` every :data:`SHARDS_EVERY_S`."""

    def __init__(self, shards: DataShards, log: Any) -> None:
        self.shards, self.log = shards, log
        self.misses = 0  # polls in a row that found a shard down
        self.full: set[int] = set()  # the shards found full at the last poll (logged as they fill)

    def poll(self) -> list[str]:
        """[the reason the run stops] once a shard failed :data:`SHARD_TRIES` polls in a row (names
        it, URL redacted), else [] (a failure short of that is logged as a warning). A shard that
        fills is logged by name once as it fills (its writers wait: workers' OOM retries)."""
        full = self.shards.full()
        for i in full.keys() - self.full:
            self.log.warning("%s", full[i])
        self.full = set(full)
        bad = self.shards.unreachable()
        self.misses = self.misses + 1 if bad else 0
        if self.misses < SHARD_TRIES:
            if bad:
                self.log.warning("%s", "; ".join(bad))
            return []
        return [f"{bad[0]} (it holds this run's step data): the run stops; start it again, then --resume the run"]


def run_stores(control: redis.Redis, shards: Optional[DataShards], ns: str, buffer_id: str = "") -> list[StepDataStore]:
    """The stores holding run ``ns``'s step data: one per shard, or the control Redis's alone."""
    return shards.stores(control, ns, buffer_id) if shards else [StepDataStore(control, ns, buffer_id)]


class StoreGroup:
    """Run-wide operations over the stores of :func:`run_stores` (each store's, summed)."""

    def __init__(self, stores: Sequence[StepDataStore]) -> None:
        self.stores = list(stores)

    def drop_blobs(self) -> int:
        """:meth:`StepDataStore.drop_blobs` on every store; keys deleted."""
        return sum(s.drop_blobs() for s in self.stores)

    def drop_stream(self) -> int:
        """:meth:`StepDataStore.drop_stream` on every store; streams deleted."""
        return sum(s.drop_stream() for s in self.stores)

    def drop_run(self) -> int:
        """:meth:`StepDataStore.drop_run` on every store; keys deleted."""
        return sum(s.drop_run() for s in self.stores)


def pick_shard(loads: Sequence[int], turn: int = 0) -> int:
    """The shard a new collector task writes to: one of those fewest running tasks write to
    (``loads`` per shard), the first at or after index ``turn`` (mod the count) among equals: with
    ``turn`` counting the tasks given out, tasks spread evenly as they come and go, one task at a
    time included."""
    n, low = len(loads), min(loads)
    return next(i % n for i in range(turn, turn + n) if loads[i % n] == low)


_worker_shards: dict[tuple[str, ...], DataShards] = {}


def worker_shards(task_cfg: Any, expected: int, task_id: str) -> DataShards:
    """This worker process's data shards for a task whose messages say ``expected`` shards (one
    connection per URL per process, kept for the tasks that follow).

    Raises:
        DataShardConfigError: this worker resolves another number of shards (names both and what
            to set), or a bad URL.
    """
    urls = resolve_urls(None, task_cfg)
    if shard_count(urls) != expected:
        raise DataShardConfigError(
            f"task {task_id}: the run has {expected} data shard(s) but this worker has {shard_count(urls)} "
            f"({', '.join(map(redact, urls)) or 'none'}): start it with ${ENV_DATA_URL} set to the run's "
            "--data-redis-url (in order)")
    key = tuple(urls)
    if key not in _worker_shards:
        _worker_shards[key] = DataShards(urls)
    return _worker_shards[key]


def task_stores(conn: redis.Redis, task: dict, ns: str) -> list[StepDataStore]:
    """The stores of a task's buffer: a collector task's one shard (``data_shard``), every shard for
    a learner task, the control Redis ``conn`` when the task names no shards (``data_shards`` absent).

    Raises:
        DataShardConfigError: as :func:`worker_shards`.
    """
    if task.get("data_shards") is None:
        return [StepDataStore(conn, ns, task["buffer_id"])]
    shards = worker_shards(task["config"], int(task["data_shards"]), task["task_id"])
    if task.get("data_shard") is not None:
        return [shards.store(int(task["data_shard"]), conn, ns, task["buffer_id"])]
    return shards.stores(conn, ns, task["buffer_id"])
