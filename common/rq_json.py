"""The serializer of rqrl's RQ queues: JSON, so nothing read from Redis is ever unpickled.

RQ pickles job payloads by default, so whoever can write to the Redis could make every worker
run code of their choosing. Every task rqrl enqueues is plain JSON already (ids, numbers, the
compiled config), so the coordinator enqueues with :class:`TaskSerializer` and rqrl's worker
classes (workers/worker.py) read with it whatever ``-S`` says. It writes exactly what RQ's own
``rq.serializers.JSONSerializer`` writes, so a stock ``rq worker collector -S
rq.serializers.JSONSerializer`` runs rqrl's tasks too. A payload that is not JSON (a pickled job
pushed by hand) is refused with :class:`NotJSON`, which names the serializer, and the job fails
without running.
"""

from __future__ import annotations

import json
from typing import Any

from rq.serializers import JSONSerializer


class NotJSON(ValueError):
    """A job payload that is not JSON (e.g. RQ's default pickle): refused, never unpickled."""


def _plain(obj: Any) -> Any:
    """numpy scalars and arrays in a job's result (``tolist``/``item``): JSON numbers and lists."""
    for convert in ("tolist", "item"):
        if callable(getattr(obj, convert, None)):
            return getattr(obj, convert)()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


class TaskSerializer(JSONSerializer):
    """RQ's JSON serializer (same bytes) with a clear refusal of anything else."""

    @staticmethod
    def dumps(obj: Any, *args: Any, **kwargs: Any) -> bytes:
        """UTF-8 JSON of a job's payload or result.

        Raises:
            TypeError: a value JSON cannot hold (numpy scalars and arrays become numbers and lists).
        """
        kwargs.setdefault("default", _plain)
        return json.dumps(obj, *args, **kwargs).encode("utf-8")

    @staticmethod
    def loads(s: bytes, *args: Any, **kwargs: Any) -> Any:
        """Decode a job's payload or result.

        Raises:
            NotJSON: ``s`` is not UTF-8 JSON (a pickled job pushed onto an rqrl queue by hand).
        """
        try:
            return JSONSerializer.loads(s, *args, **kwargs)
        except (UnicodeDecodeError, ValueError):
            raise NotJSON(f"job payload is not JSON ({len(s)} bytes, starting {bytes(s[:8])!r}): rqrl's queues "
                          "use RQ's JSON serializer and never unpickle; a pickled job (RQ's default serializer) "
                          "is refused, not run") from None
