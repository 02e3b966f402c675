"""Redis connections from a URL, with retries, and URL redaction for logs.

Accepted URLs are redis-py's: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://``
(TLS; add ``?ssl_cert_reqs=none`` or ``ssl_ca_certs=...`` as query arguments) and
``unix:///path/to/socket?db=0``. ACL users and passwords come from the URL, or from the
``RQRL_REDIS_URL`` environment variable when no URL is given.
"""

from __future__ import annotations

import os
import re
import time
from urllib.parse import unquote, urlsplit

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
    rqrl's retry-with-backoff (RQ hands job functions a client that has none).

    Workers also wait out an ``OOM`` reply (a full ``noeviction`` Redis refuses the write before
    running it, so a retry cannot double it) for the same ~10 s: time for the coordinator to stop
    the run and free its step data, so tasks end at the stop flag and RQ can record their end.
    """
    pool = conn.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(retry=_retry(), retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.OutOfMemoryError])
    kwargs.setdefault("health_check_interval", 30)
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))


def connect(url: str | None = None, *, socket_timeout: float | None = 60.0) -> redis.Redis:
    """Open a client (bytes replies, as RQ needs) with retry-with-backoff on connection errors.

    Args:
        url: Redis URL (see module docstring); ``None`` reads ``$RQRL_REDIS_URL``.
        socket_timeout: seconds a single command may take before ``redis.TimeoutError``;
            blocking reads pass their own shorter ``BLOCK`` timeouts.

    Raises:
        ValueError: the URL scheme is not redis://, rediss:// or unix://, or redis-py cannot
            parse it (the message has the URL redacted).
    """
    url = resolve_url(url)
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"redis url {redact(url)!r}: scheme must be redis://, rediss:// or unix://")
    try:
        return redis.Redis.from_url(
            url,
            decode_responses=False,
            socket_timeout=socket_timeout,
            socket_connect_timeout=10.0,
            health_check_interval=30,
            retry=_retry(),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        )
    except ValueError as e:  # redis-py's parse errors quote pieces of the URL
        raise ValueError(f"bad redis url {redact(url)}: {scrub(str(e), url)}") from None


class RedisUnavailable(RuntimeError):
    """Redis cannot be reached or refused the credentials (the message has the redacted URL)."""


# How long connect_checked(patient=True) keeps trying an unreachable server (a restarting Redis).
PATIENCE_S = 10.0


def connect_checked(url: str | None = None, *, socket_timeout: float | None = 60.0, patient: bool = True) -> redis.Redis:
    """:func:`connect` after a PING has answered. Wrong credentials or a bad URL fail at once; an
    unreachable server is tried again with backoff (0.1 s doubling to 2 s) for at most
    :data:`PATIENCE_S` (10) seconds in all, so a restarting Redis is waited for, unless
    ``patient`` is False (an interactive command: one try, at most 2 s).

    Raises:
        RedisUnavailable: naming the URL with its password redacted.
    """
    url = resolve_url(url)
    start = time.monotonic()
    deadline = start + (PATIENCE_S if patient else 0.0)
    delay = 0.1
    while True:
        timeout = max(0.1, min(5.0, deadline - time.monotonic())) if patient else 2.0
        try:
            probe = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout,
                                         retry=Retry(ExponentialBackoff(), 0))
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
        return connect(url, socket_timeout=socket_timeout)
    except ValueError as e:
        raise RedisUnavailable(scrub(str(e), url)) from None


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
