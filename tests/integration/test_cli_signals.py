"""Every rqrl command stops on Ctrl-C / kill -INT, even started by a script's `rqrl ... &`, which
hands it SIGINT ignored (Python then installs no KeyboardInterrupt)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, worker_env

pytestmark = pytest.mark.redis_server


def test_status_watch_started_with_sigint_ignored_stops_on_kill_int(redis_server):
    p = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "status", "--watch", "--redis-url", redis_server.url],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=worker_env(""),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # what a shell does for `&`
    try:
        assert "QUEUE" in p.stdout.readline()  # its first screen: it is in its refresh loop
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 0  # a hang guard: it returns at once
    finally:
        if p.poll() is None:
            p.kill()
