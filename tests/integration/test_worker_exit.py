"""A worker's end is prompt: RQ stops its command channel's thread at the end, and that thread's
poll bounds the wait (workers/worker.py ``_COMMAND_POLL_S``; RQ's own 60 s made exits take up to a
minute, and the suite's hang guards of 60 s failed on it)."""

from __future__ import annotations

import threading
import time

import pytest

from common import keys
from common.connection import connect
from workers.worker import CollectorWorker

pytestmark = pytest.mark.redis_server


def test_the_command_channel_stops_within_its_poll_after_the_unsubscribe(redis_server):
    worker = CollectorWorker([keys.COLLECTOR_QUEUE], connection=connect(redis_server.url), name="exit-test")
    worker.subscribe()
    try:
        assert worker.pubsub.subscribed
        # The state RQ's teardown leaves the thread in: the unsubscribe reply read, then a wait for a
        # subscription (redis-py's get_message on a PubSub without channels waits its whole timeout).
        worker.pubsub.unsubscribe()
        deadline = time.monotonic() + 30
        while worker.pubsub.subscribed:  # cleared by the channel's thread as it reads the reply
            assert time.monotonic() < deadline, "the unsubscribe reply was never read"
            time.sleep(0.01)
        ended = threading.Event()
        stopper = threading.Thread(target=lambda: (worker.unsubscribe(), ended.set()), daemon=True)
        t0 = time.monotonic()
        stopper.start()
        assert ended.wait(timeout=20), "RQ's unsubscribe waited out a long poll"
        assert time.monotonic() - t0 < 5
    finally:
        worker.pubsub_thread.stop(timeout=1)
