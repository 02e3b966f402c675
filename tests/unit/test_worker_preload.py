"""A PreloadWorker's work-horses build their optimizers without importing anything (workers/worker.py).

torch.optim imports torch._dynamo and sympy (~800 modules, 1.1-1.5 s of CPU) the first time an
Optimizer is built in a process; a learner task runs in a work-horse forked per task, so it paid
that in every task unless the worker's parent had imported them before forking.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import REPO

# A fresh interpreter: this test process may have imported torch._dynamo already.
PROBE = textwrap.dedent("""
    import os, sys
    import fakeredis, torch
    from workers.worker import PreloadWorker
    PreloadWorker(["learner"], connection=fakeredis.FakeRedis())
    pid = os.fork()
    if pid == 0:  # a work-horse, as RQ forks one per job
        from common.policy import nets
        before = set(sys.modules)
        nets.adam(torch.nn.Linear(4, 2).parameters(), 1e-3)
        new = sorted(set(sys.modules) - before)
        os.write(1, (" ".join([str(len(new)), *new[:5]]) + "\\n").encode())
        os._exit(0)
    os.waitpid(pid, 0)
""")


def test_a_preload_worker_imports_what_an_optimizer_needs_before_it_forks():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    count, *first_new = out.stdout.split()
    assert count == "0", f"building an optimizer in the work-horse imported {count} modules, e.g. {first_new}"
