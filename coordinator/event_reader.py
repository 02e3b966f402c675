"""The coordinator's side of the events stream ``rqrl:{exp}:events``: read, ack, reclaim, trim.

Workers XADD their events; the coordinator reads them through consumer group ``coordinator``
and acks them in the same MULTI/EXEC as the state they produced. It remembers the newest event
it acked (:attr:`EventReader.last_id`, saved with the coordinator's state) and trims the stream
to what it read and what is older than :data:`EVENTS_RETENTION_S`.
"""

from __future__ import annotations

import logging
from typing import Iterator

import redis

from common import keys, streams
from coordinator.errors import RunLost

# Events the coordinator has read stay this long on the stream (rqrl status, the launcher's
# progress line); unread ones are never trimmed. Eval results are kept whole in rqrl:{exp}:evals.
EVENTS_RETENTION_S = 600.0

Entries = list[tuple[bytes, dict[bytes, bytes]]]


def _id_tuple(entry_id: bytes | str) -> tuple[int, int]:
    ms, _, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).partition("-")
    return int(ms), int(seq or 0)


class EventReader:
    """Consumer ``consumer`` of group ``coordinator`` on run ``exp``'s events stream.

    Args:
        conn: Redis client (bytes replies).
        exp: the run's namespace.
        consumer: the coordinator's name.
        log: the coordinator's logger.
    """

    def __init__(self, conn: redis.Redis, exp: str, consumer: str, log: logging.Logger) -> None:
        self.conn, self.exp, self.consumer, self.log = conn, exp, consumer, log
        self.stream = keys.events(exp)
        self.last_id = ""  # the newest event read and acked: trimming never passes it
        self.lost = ""  # how unread events were found trimmed, if they were

    def ensure_group(self) -> None:
        streams.ensure_group(self.conn, self.stream, keys.COORDINATOR_GROUP, start_id="0")

    def read(self, block_ms: int) -> Entries:
        """New events (at most 1,000), waiting at most ``block_ms`` milliseconds for the first.

        Raises:
            RunLost: the stream or its consumer group is gone (Redis restarted empty, or flushed).
        """
        try:
            return streams.read_group(self.conn, self.stream, keys.COORDINATOR_GROUP, self.consumer, 1000, block_ms)
        except redis.ResponseError as e:
            # NOGROUP between reads; Redis 7 answers a read blocked on a stream that vanished with UNBLOCKED.
            if "NOGROUP" in str(e) or "UNBLOCKED" in str(e):
                raise RunLost(f"Redis lost the state of run {self.exp!r} ({self.stream} lost its consumer group): "
                              "was it restarted without persistence, or flushed? See docs/deploy.md on AOF.") from None
            raise

    def reclaim(self) -> Iterator[Entries]:
        """Events an earlier coordinator of the run read but never acked, in batches (XAUTOCLAIM)."""
        self.ensure_group()
        # Trimmed entries (gone, or nil on Redis 6.2) carry nothing to route: check_trimmed reports the loss.
        for claimed, _gone, _nil in streams.claim_pending(self.conn, self.stream, keys.COORDINATOR_GROUP,
                                                          self.consumer, count=256):
            if claimed:
                self.log.info("reclaimed %d unacked events", len(claimed))
                yield claimed

    def ack(self, pipe: redis.client.Pipeline, entries: Entries) -> None:
        """Queue the acks of ``entries`` on ``pipe`` (the transaction that holds the state they produced)."""
        self.last_id = max((e for e, _ in entries), key=_id_tuple).decode()
        pipe.xack(self.stream, keys.COORDINATOR_GROUP, *[e for e, _ in entries])

    def trim(self, now: float) -> None:
        """Trim the stream to what was read and is older than the retention window (``now``: unix seconds)."""
        self.check_trimmed()
        if not self.last_id:
            return
        cutoff = min(_id_tuple(self.last_id), (int((now - EVENTS_RETENTION_S) * 1000), 0))
        self.conn.xtrim(self.stream, minid=f"{cutoff[0]}-{cutoff[1]}", approximate=True)

    def check_trimmed(self) -> None:
        """Report (once) a stream trimmed past the last event this coordinator read.

        rqrl's own trimming keeps that entry (MINID never passes it), so its absence means a
        MAXLEN or XTRIM from elsewhere removed it, and with it possibly events not yet read.
        """
        if self.lost or not self.last_id:
            return
        last = self.last_id
        if self.conn.xrange(self.stream, min=last, max=last):
            return
        first = self.conn.xrange(self.stream, count=1)
        first_id = first[0][0].decode() if first else "none"
        self.lost = (f"{self.stream} was trimmed past the last event read ({last}; first entry "
                     f"now {first_id}): unread task results may have been lost")
        self.log.error("%s", self.lost)

    def after_failover(self) -> None:
        """The promoted replica may lack the newest events: if the last one read is gone (lost, not
        trimmed), reading goes on from the newest one left."""
        self.ensure_group()
        if self.last_id and not self.conn.xrange(self.stream, min=self.last_id, max=self.last_id):
            older = self.conn.xrevrange(self.stream, max=self.last_id, count=1)
            self.log.warning("the last event read (%s) was lost with the old primary", self.last_id)
            self.last_id = older[0][0].decode() if older else ""
