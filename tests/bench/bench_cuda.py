"""CUDA learner: CartPole and ALE Pong DQN with ``policy.cuda=True`` and CPU collectors.

    python -m tests.bench.bench_cuda [--configs cartpole_dqn pong_dqn] [--train-iters 3000]
        [--collectors N] [--set KEY=VALUE ...] [--json out.json]

Each config runs as a fresh ``rqrl train`` process (``--set policy.cuda=True``, bounded by
``commander.max_train_iter`` with ``env.stop_value`` out of reach, so a run ends at its budget
with exit code 2; collectors stay on the CPU, as always). Figures per run:

* train iters/s: the learner's own (``learner_train_iter_per_sec`` of the run's summary.json:
  train iterations / seconds inside train steps);
* samples/s: batch_size x train iters/s;
* host-to-device MB/s, two figures: *computed* (bytes of one sampled row in the policy's schema,
  as ``nets.to_device`` copies it, x batch_size x train iters/s: what the run moved) and
  *measured* (this process copies 200 batches of that schema through ``nets.to_device`` and
  divides their bytes by the seconds to a ``torch.cuda.synchronize``: what the copy path can move);
* GPU utilisation: mean and max of ``utilization.gpu`` sampled every 0.5 s during the run
  (pynvml if installed, else ``nvidia-smi``);
* whether the run's final.pt loads on the CPU (``torch.load(map_location="cpu",
  weights_only=True)`` and ``rqrl.load``) and acts on one observation.

Pong needs the ``atari`` extra. Without CUDA it refuses at once (exit code 2, one line why).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
EXIT_NO_CUDA = 2


def no_cuda_reason() -> Optional[str]:
    """Why this machine cannot run the benchmark (one line), or None when it has a CUDA device."""
    if torch.cuda.is_available():
        return None
    return (f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, "
            f"built for CUDA {torch.version.cuda or 'none'}); run this on a machine with a GPU")


def _gpu_reader() -> tuple[Optional[Callable[[], float]], str]:
    """A function returning GPU 0's utilisation in percent, and which tool it uses."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return (lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)), "pynvml"
    except Exception:  # not installed, or no NVML: fall back to the command line tool
        pass
    if shutil.which("nvidia-smi") is None:
        return None, "none (neither pynvml nor nvidia-smi found)"

    def smi() -> float:
        out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10)
        return float(out.stdout.strip().splitlines()[0])
    return smi, "nvidia-smi"


class GpuSampler:
    """Samples GPU utilisation every ``period`` seconds on a thread between start() and stop()."""

    def __init__(self, period: float = 0.5) -> None:
        self.read, self.tool = _gpu_reader()
        self.period, self.samples = period, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.samples.append(self.read())
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                continue  # one failed sample: the others still tell the utilisation

    def start(self) -> "GpuSampler":
        if self.read is not None:
            self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        s = self.samples
        return {"gpu_util_tool": self.tool, "gpu_util_samples": len(s),
                "gpu_util_mean_pct": round(float(np.mean(s)), 1) if s else None,
                "gpu_util_max_pct": round(float(np.max(s)), 1) if s else None}


def _schema(config: Path) -> tuple[dict[str, tuple[tuple[int, ...], np.dtype]], int]:
    """The learner's batch fields (with ``weight`` under prioritized replay) and batch_size."""
    from common import spaces
    from common.config import load_config
    from common.policy import create_policy

    cfg = load_config(config)
    policy = create_policy(cfg, spaces.probe(cfg), modes=("learn",), device="cpu")
    schema = {k: (tuple(shape), np.dtype(dt)) for k, (shape, dt) in policy.schema().items()}
    if cfg.policy.other.replay_buffer.priority:
        schema["weight"] = ((), np.dtype(np.float32))
    return schema, int(cfg.policy.learn.batch_size)


def _row_bytes(schema: dict[str, tuple[tuple[int, ...], np.dtype]]) -> int:
    """Bytes one row puts on the bus: float64 crosses as float32 (``nets.to_device`` casts it first)."""
    return sum(int(np.prod(shape)) * min(dt.itemsize, 4 if dt.kind == "f" else dt.itemsize)
               for shape, dt in schema.values())


def measure_copy(schema: dict[str, tuple[tuple[int, ...], np.dtype]], batch_size: int, batches: int = 200) -> float:
    """MB/s of ``nets.to_device`` moving ``batches`` random batches of ``schema`` to the GPU."""
    from common.policy import nets

    rng = np.random.default_rng(0)
    host = [{k: rng.integers(0, 2, (batch_size, *shape)).astype(dt) for k, (shape, dt) in schema.items()}
            for _ in range(8)]
    dev = torch.device("cuda")

    def copy(batch: dict[str, np.ndarray]) -> None:
        for v in batch.values():
            nets.to_device(v, dev)

    for b in host:  # warm-up: CUDA context, the pinned-memory cache
        copy(b)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(batches):
        copy(host[i % len(host)])
    torch.cuda.synchronize()
    return _row_bytes(schema) * batch_size * batches / (time.perf_counter() - t0) / 1e6


def check_final(final_pt: Path) -> dict[str, Any]:
    """Load ``final_pt`` on the CPU both ways and act on one (all-zero) observation."""
    import rqrl

    try:
        raw = torch.load(final_pt, map_location="cpu", weights_only=True)
        agent = rqrl.load(final_pt)
        action = agent.act(np.zeros(agent.spec.obs_shape, dtype=agent.spec.obs_dtype))
    except Exception as e:  # the figure to report is that it failed, and why
        return {"final_pt_loads_on_cpu": False, "final_pt_error": f"{type(e).__name__}: {e}"}
    return {"final_pt_loads_on_cpu": True, "final_pt_keys": sorted(raw)[:8], "final_pt_action": np.asarray(action).tolist()}


def run_one(config: str, train_iters: int, collectors: Optional[int], extra: list[str]) -> dict[str, Any]:
    """One ``rqrl train`` of ``deploy/configs/<config>.py`` on CUDA, with its figures."""
    path = REPO / "deploy" / "configs" / f"{config}.py"
    schema, batch_size = _schema(path)
    row = _row_bytes(schema)
    # No stop_value within reach: the train-iteration budget ends every run (exit code 2, expected).
    sets = ["policy.cuda=True", "env.stop_value=1e9", f"commander.max_train_iter={train_iters}", f"exp_name=bench_cuda_{config}", *extra]
    argv = [sys.executable, "-m", "coordinator.cli", "train", str(path), *[a for s in sets for a in ("--set", s)]]
    if collectors:
        argv += ["--collectors", str(collectors)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory(prefix="rqrl-bench-cuda-") as tmp:
        sampler = GpuSampler().start()
        t0 = time.perf_counter()
        res = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        out: dict[str, Any] = {"config": config, "exit_code": res.returncode, "wall_s": round(wall, 1), **sampler.stop()}
        run = Path(tmp) / f"bench_cuda_{config}" / "latest"
        summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
        if not summary:
            return {**out, "error": "no summary.json", "stderr_tail": res.stderr[-2000:]}
        ips = float(summary.get("learner_train_iter_per_sec") or 0.0)
        out.update(status=summary.get("status"), envstep=summary.get("envstep"), train_iter=summary.get("train_iter"),
                   batch_size=batch_size, train_iters_per_s=round(ips, 1), samples_per_s=round(ips * batch_size, 1),
                   row_bytes=row, h2d_mb_per_s_computed=round(row * batch_size * ips / 1e6, 2),
                   h2d_mb_per_s_measured=round(measure_copy(schema, batch_size), 1),
                   learner_wait_share=summary.get("learner_wait_share"))
        final = run / "final.pt"
        out.update(check_final(final) if final.exists() else {"final_pt_loads_on_cpu": False, "final_pt_error": "no final.pt"})
    return out


COLUMNS = ("config", "exit_code", "train_iters_per_s", "samples_per_s", "h2d_mb_per_s_computed",
           "h2d_mb_per_s_measured", "gpu_util_mean_pct", "gpu_util_max_pct", "final_pt_loads_on_cpu")


def table(rows: list[dict[str, Any]]) -> str:
    """The figures as a Markdown table (one row per config)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r.get(c, "-")) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["cartpole_dqn", "pong_dqn"], help="names under deploy/configs/")
    ap.add_argument("--train-iters", type=int, default=3000, help="commander.max_train_iter of each run")
    ap.add_argument("--collectors", type=int, default=None, help="rqrl train --collectors (default: its own)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="another config override for every run (repeatable)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    why = no_cuda_reason()
    if why:
        print(why, file=sys.stderr)
        return EXIT_NO_CUDA
    rows = [run_one(c, args.train_iters, args.collectors, args.sets) for c in args.configs]
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cpu_count": os.cpu_count(), "train_iters": args.train_iters, "runs": rows}
    print(json.dumps(out, indent=2), flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0 if all(r.get("final_pt_loads_on_cpu") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
