"""Workers whose clocks are off Redis's, seen from the events they send.

Each event carries its sender's unix time (``ts``) and gets Redis's clock in its stream entry id,
so every ``started`` event measures its worker's offset without a command of its own. rqrl's run
records take their times from the coordinator's clock; a worker off by more than
:data:`common.events.CLOCK_SKEW_WARN_S` is named in the coordinator's log and in ``rqrl status``
(RQ's own job bookkeeping on such a worker still uses its clock).
"""

from __future__ import annotations

from typing import Any, Optional

from common import events


class WorkerClocks:
    """The workers seen off by more than the threshold, with their offset (seconds, + = ahead)."""

    def __init__(self) -> None:
        self.skewed: dict[str, float] = {}

    def note(self, ev: dict[str, Any], entry_id: bytes | str) -> Optional[str]:
        """Take a ``started`` event's measure; returns a warning when a worker is first seen skewed."""
        if ev.get("type") != "started" or not isinstance(ev.get("ts"), (int, float)):
            return None
        offset = events.clock_offset_s(entry_id, float(ev["ts"]))
        who = str(ev.get("worker") or f"{ev.get('host', '?')}:{ev.get('pid', '?')}")
        if abs(offset) <= events.CLOCK_SKEW_WARN_S:
            self.skewed.pop(who, None)
            return None
        first = who not in self.skewed
        self.skewed[who] = round(offset, 1)
        return (f"worker {who}'s clock is {offset:+.1f} s off Redis's (more than {events.CLOCK_SKEW_WARN_S:g} s): "
                "run times come from the coordinator's clock, but RQ's job bookkeeping there uses that one; "
                "synchronize it (NTP)") if first else None

    def summary(self) -> str:
        """``worker +7200.0 s; other -3.2 s`` (a summary field: scalars only)."""
        return "; ".join(f"{w} {o:+.1f} s" for w, o in sorted(self.skewed.items()))
