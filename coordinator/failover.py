"""Redis primary changes (Sentinel failovers) as the coordinator sees them.

Replication is asynchronous: the old primary's last writes (~ms of them) may not have reached
the promoted replica, so after a change the coordinator writes its records again (its loop
does so when :meth:`FailoverWatch.changed` says so). The changes are kept for the summary.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from common.connection import primary_changes


class FailoverWatch:
    """The primary changes that ``conn``'s Sentinel recorded (none for a plain Redis URL)."""

    def __init__(self, conn: redis.Redis, log: logging.Logger) -> None:
        self.conn, self.log = conn, log
        self.seen: list[dict[str, Any]] = []  # {"from", "to", "time": unix s} per change

    def changed(self) -> bool:
        """True (once per change, each logged) when the primary changed since the last call."""
        changes = primary_changes(self.conn)
        if len(changes) == len(self.seen):
            return False
        for ch in changes[len(self.seen):]:
            self.log.warning("Redis failover: primary %s -> %s (Sentinel); writing the run's records again on the "
                             "new primary", ch["from"], ch["to"])
        self.seen = changes
        return True

    def summary_fields(self) -> dict[str, Any]:
        """``redis_failovers`` (count) and ``redis_failover`` (one line per change: summary fields are
        scalars), or nothing when there was none."""
        if not self.seen:
            return {}
        return {"redis_failovers": len(self.seen), "redis_failover": "; ".join(
            f"primary {f['from']} -> {f['to']} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(f['time']))}"
            for f in self.seen)}
