"""tests/bench/bench_cuda.py on a machine without CUDA: it refuses at once, naming why."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.bench import bench_cuda
from tests.conftest import REPO


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the benchmark would run")
def test_without_cuda_it_exits_2_with_one_line_naming_why():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-m", "tests.bench.bench_cuda", "--train-iters", "10"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("no CUDA device: torch.cuda.is_available() is False"), res.stderr


def test_row_bytes_count_what_crosses_the_bus():
    schema = {"obs": ((4, 84, 84), np.dtype(np.uint8)), "x": ((3,), np.dtype(np.float64)),
              "action": ((), np.dtype(np.int64)), "done": ((), np.dtype(np.bool_))}
    # float64 is cast to float32 on the host before the copy; uint8 and bool stay 1 byte a value.
    assert bench_cuda._row_bytes(schema) == 4 * 84 * 84 + 3 * 4 + 8 + 1
