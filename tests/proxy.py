"""A TCP proxy for tests that cut one process off from Redis (a network partition of its machine).

:class:`CuttableProxy` forwards bytes between its clients and one upstream address. :meth:`cut`
stops forwarding in both directions without closing anything: the bytes wait in the kernel's
socket buffers, so the client's calls hang as behind a dropped link (TCP retransmitting), and
:meth:`heal` lets them through again. New connections made during the cut are accepted by the
kernel (listen backlog) and served at the heal.
"""

from __future__ import annotations

import select
import socket
import threading


class CuttableProxy:
    """Forward ``127.0.0.1:{port}`` to ``upstream`` (host, port) until :meth:`close`."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._open = threading.Event()
        self._open.set()
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def cut(self) -> None:
        """Stop forwarding (both directions, every connection) until :meth:`heal`."""
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._closed.set()
        self._open.set()
        for s in [self._listener, *self._socks]:
            s.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            self._open.wait()
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream)
            self._socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True, name="proxy-pump").start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        peer = {client: upstream, upstream: client}
        try:
            while not self._closed.is_set():
                # A cut holds the bytes unread: the wait is bounded so close() ends the thread.
                if not self._open.wait(timeout=0.5):
                    continue
                ready, _, _ = select.select(list(peer), [], [], 0.5)
                if not self._open.is_set():  # cut while select waited
                    continue
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    peer[s].sendall(data)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()
