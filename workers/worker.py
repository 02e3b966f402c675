"""An RQ worker class that imports torch, gymnasium and the job modules once, before forking.

The stock ``rq worker collector`` forks a work-horse per job, and each horse would import
torch and gymnasium again (~1.5-2 s per task). With ``-w workers.worker.PreloadWorker`` the
parent imports them once and every forked horse inherits them::

    rq worker collector --url redis://head:6379/0 -w workers.worker.PreloadWorker
"""

from __future__ import annotations

from typing import Any

import gymnasium  # noqa: F401  (pre-import for forked work-horses)
import gymnasium.envs.classic_control  # noqa: F401
import tensorboard.compat.proto.event_pb2  # noqa: F401  (the learner's TensorBoard writer)
import tensorboard.summary.writer.event_file_writer  # noqa: F401
import redis
import torch  # noqa: F401
from rq.worker import Worker

import workers.collector  # noqa: F401
from common.connection import with_retries
import workers.learner  # noqa: F401


class PreloadWorker(Worker):
    """``rq.worker.Worker`` whose module pre-imports rqrl's job code (see module docstring).

    Its own Redis client retries connection errors and ``OOM`` replies with backoff (~10 s):
    stock RQ quits on the first refused write of its bookkeeping, so a Redis that is full for
    the few seconds the coordinator needs to stop the run and free memory would kill it.
    """

    def __init__(self, *args: Any, connection: Any = None, **kwargs: Any) -> None:
        if connection is not None:
            connection = with_retries(connection)
        super().__init__(*args, connection=connection, **kwargs)

    def _set_ip_address(self, connection: Any) -> None:
        """The worker's address from ``CLIENT INFO``, as rq 3 reads it: rq 2.12 reads ``CLIENT
        LIST``, which the least-privilege ACL user (deploy/redis/users.acl.example) may not run."""
        try:
            connection.client_setname(self.name)
            self.ip_address = str(connection.client_info()["addr"])
        except redis.ResponseError:
            super()._set_ip_address(connection)
