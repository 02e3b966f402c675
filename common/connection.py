"""Redis connections from a URL, with retries, and URL redaction for logs.

Accepted URLs are redis-py's: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://``
(TLS; add ``?ssl_cert_reqs=none`` or ``ssl_ca_certs=...`` as query arguments) and
``unix:///path/to/socket?db=0``. ACL users and passwords come from the URL, or from the
``RQRL_REDIS_URL`` environment variable when no URL is given.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

DEFAULT_URL = "redis://127.0.0.1:6379/0"
ENV_URL = "RQRL_REDIS_URL"

# A blip (restart, failover, CLIENT PAUSE) of up to ~10 s is retried: backoff 0.1 s doubling to 2 s.
_RETRIES = 10


def resolve_url(url: str | None) -> str:
    """The URL to use: ``url``, else ``$RQRL_REDIS_URL``, else ``redis://127.0.0.1:6379/0``."""
    return url or os.environ.get(ENV_URL) or DEFAULT_URL


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=2.0, base=0.1), _RETRIES)


def with_retries(conn: redis.Redis) -> redis.Redis:
    """A new client on the same server, database, credentials and TLS settings as ``conn``, with
    rqrl's retry-with-backoff (RQ hands job functions a client that has none)."""
    pool = conn.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(retry=_retry(), retry_on_error=[redis.ConnectionError, redis.TimeoutError])
    kwargs.setdefault("health_check_interval", 30)
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))


def connect(url: str | None = None, *, socket_timeout: float | None = 60.0) -> redis.Redis:
    """Open a client (bytes replies, as RQ needs) with retry-with-backoff on connection errors.

    Args:
        url: Redis URL (see module docstring); ``None`` reads ``$RQRL_REDIS_URL``.
        socket_timeout: seconds a single command may take before ``redis.TimeoutError``;
            blocking reads pass their own shorter ``BLOCK`` timeouts.

    Raises:
        ValueError: the URL scheme is not redis://, rediss:// or unix://.
    """
    url = resolve_url(url)
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"redis url {redact(url)!r}: scheme must be redis://, rediss:// or unix://")
    return redis.Redis.from_url(
        url,
        decode_responses=False,
        socket_timeout=socket_timeout,
        socket_connect_timeout=10.0,
        health_check_interval=30,
        retry=_retry(),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


class RedisUnavailable(RuntimeError):
    """Redis cannot be reached or refused the credentials (the message has the redacted URL)."""


def connect_checked(url: str | None = None, *, socket_timeout: float | None = 60.0) -> redis.Redis:
    """:func:`connect`, then PING. Wrong credentials fail at once; an unreachable server is
    retried with backoff first (a restarting Redis is given its ~10 s).

    Raises:
        RedisUnavailable: naming the URL with its password redacted.
    """
    url = resolve_url(url)
    try:
        probe = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5, retry=Retry(ExponentialBackoff(), 0))
        try:
            probe.ping()
        finally:
            probe.close()
    except (redis.AuthenticationError, redis.ResponseError) as e:
        raise RedisUnavailable(f"Redis at {redact(url)} refused us: {e}") from None
    except ValueError as e:
        raise RedisUnavailable(f"bad redis url {redact(url)}: {e}") from None
    except redis.RedisError:
        pass  # unreachable just now: the retrying client below tries again
    try:
        conn = connect(url, socket_timeout=socket_timeout)
        conn.ping()
    except (redis.RedisError, ValueError) as e:
        raise RedisUnavailable(f"cannot reach Redis at {redact(url)}: {e}") from None
    return conn


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``, safe to log or print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def url_of(conn: redis.Redis) -> str:
    """Rebuild a URL for ``conn`` (used to hand the same Redis to child processes).

    Raises:
        ValueError: the connection has no host/port or unix socket recorded.
    """
    kw = conn.connection_pool.connection_kwargs
    db = kw.get("db", 0)
    cred = ""
    if kw.get("password"):
        cred = f"{kw.get('username') or ''}:{kw['password']}@"
    if kw.get("path"):
        return f"unix://{cred}{kw['path']}?db={db}"
    if "host" not in kw:
        raise ValueError("connection has neither host nor unix socket path")
    scheme = "rediss" if conn.connection_pool.connection_class.__name__ == "SSLConnection" else "redis"
    return f"{scheme}://{cred}{kw['host']}:{kw.get('port', 6379)}/{db}"
