"""The learner task's own loop against the bare in-process loop, in one process: what the learner
adds to each train iteration, part by part.

    python -m tests.bench.bench_learner_loop [--configs cartpole_dqn mountaincar_dqn lunarlander_dqn]
                                             [--block 200] [--repeats 16] [--json out.json]

Both loops train one policy, the learner task's, on its data source's replay buffer (20,000 rows
of random data with the policy's schema) at one torch thread, as the workers do; two policies
built one after the other trained 4-5 % apart here (256-unit nets: where their memory fell), so
the bare loop has none of its own:

- bare: ``buffer.sample`` and ``policy.learn``, nothing else (tests/bench/bench_serial.py's
  update, without its env steps);
- learner: ``workers.learner.BaseLearner.train`` on batches from the task's data source, with the
  after-iteration hooks a lead learner task registers (``workers.learner.task_hooks``: the
  finite check, priority feedback, publishing every ``send_policy_freq`` iterations through the
  task's ``PolicyPublisher`` to a private Redis, learner_info events) and no collectors: a
  stand-in buffer reader reports env steps enough that the replay ratio never waits.

The two run in alternating blocks of ``--block`` iterations (drift in the machine's load hits
both alike); per-iteration process CPU (all threads), the
training thread's own CPU and wall microseconds are the medians over blocks. Parts of the
learner's iteration are timed inside its blocks (perf_counter around the data source,
``policy.learn`` and each hook); "finite check and bookkeeping" is the rest of
``BaseLearner.train``. The data source's call is also split by
whether the iteration before it published weights: a publisher that wrote from a thread of its
own held the GIL for its Python work meanwhile, and this split showed it (docs/performance.md).

In ``rqrl train`` the learner's train iterations/s relative to the in-process loop's is about
this ratio times the share of a core the learner gets (summary.json ``learner_sched_wait_share``)
and the share of its time it has data (``learner_wait_share``): see docs/performance.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import redis
import torch

from common import keys, lease, spaces
from common.config import load_config
from common.embedded_redis import EmbeddedRedis
from common.policy import algorithm_of, create_policy
from tests.bench.bench_learner import _fill
from workers.learner import BaseLearner, LearnerRole, TrainStats, create_learner, task_hooks
from workers.learner_hooks import LearnerHook, PhaseHook
from workers.publication import PolicyPublisher
from workers.sources import DataSource, create_source

REPO = Path(__file__).resolve().parents[2]
ROWS = 20_000
NS, TASK = "bench-loop", "learner-bench"


class _Reader:
    """Stands in for the buffer reader: env steps consumed far past any replay-ratio limit."""

    env_steps, env_steps_base, error = 10**12, 0, None
    chunks = expired = corrupt = malformed = redelivered = trimmed = 0

    def policy_lag(self) -> dict[str, float]:
        return {}


class _NoScalars:
    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        pass

    def flush(self) -> None:
        pass


class _TimedHook(LearnerHook):
    """``hook``, its calls' seconds added to ``parts[name]``."""

    def __init__(self, hook: LearnerHook, parts: dict[str, float]) -> None:
        super().__init__(hook.name, hook.position, hook.freq)
        self._hook, self._parts = hook, parts

    def due(self, learner: Any) -> bool:
        return self._hook.due(learner)

    def __call__(self, learner: Any) -> None:
        t = time.perf_counter()
        self._hook(learner)
        self._parts[self.name.removesuffix("_after_iter")] += time.perf_counter() - t


def _timed(fn: Callable[..., Any], parts: dict[str, float], name: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            parts[name] += time.perf_counter() - t
    return wrapper


def _learner(cfg: Any, spec: Any, conn: redis.Redis, rng: np.random.Generator,
             parts: dict[str, float]) -> tuple[BaseLearner, DataSource, PolicyPublisher]:
    """A lead learner task's learner, source and publisher (workers/learner.py assemble, minus the
    checkpoint store and the shipped log), its parts timed into ``parts``."""
    torch.manual_seed(0)
    policy = create_policy(cfg, spec, modes=("learn",), device="cpu")
    logger = logging.getLogger("bench_learner_loop")
    logger.propagate = False
    learner = create_learner(cfg, policy=policy, exp_name=NS, instance_name="learner", logger=logger,
                             tb_logger=_NoScalars(), hooks=())
    source = create_source(algorithm_of(cfg).data_source, conn, NS, learner, cfg, policy.schema(), 0, spec)
    _fill(source.store, policy.schema(), rng, ROWS)
    source.reader = _Reader()
    lease.grant(conn, NS, TASK, 3600)
    publisher = PolicyPublisher(conn, NS, "bench", keys.lease(NS, TASK))
    first = PhaseHook(conn, NS, "first_train_step", "after_iter", record=False)
    lcfg = cfg.policy.learn.learner
    lcfg.hook.update(save_ckpt_after_iter=0, save_ckpt_every_s=0)  # checkpoints are periodic Redis work, not per iteration
    for hook in task_hooks(lcfg, LearnerRole(lead=True), conn, NS, TASK, publisher, source, None, first,
                           TrainStats(learner, source, None, first)):
        if hook.position == "after_iter":
            learner.register_hook(_TimedHook(hook, parts))
    policy.learn = _timed(policy.learn, parts, "policy.learn")  # type: ignore[method-assign]
    return learner, source, publisher


def measure(config: str, block: int = 200, repeats: int = 16) -> dict[str, Any]:
    """Per-iteration µs of the bare loop and of the learner's, and the learner's parts (module docstring)."""
    torch.set_num_threads(1)  # as the workers
    cfg = load_config(REPO / "deploy" / "configs" / f"{config}.py")
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    rng = np.random.default_rng(0)
    batch_size = int(cfg.policy.learn.batch_size)
    server = EmbeddedRedis().start()
    try:
        conn = redis.Redis.from_url(server.url)
        parts: dict[str, float] = defaultdict(float)
        learner, source, publisher = _learner(cfg, spec, conn, rng, parts)
        # The bare loop trains the learner's own policy on its own buffer: two identical policies
        # built one after the other trained 4-5 % apart (where their memory fell), which a bare
        # loop with a policy of its own would add to the ratio.
        learn, store = learner.policy.learn.__wrapped__, source.store  # type: ignore[attr-defined]

        def bare(n: int) -> None:
            for _ in range(n):
                learn(store.sample(batch_size, rng))

        send_freq = int(cfg.policy.learn.learner.send_policy_freq)
        # The data source's seconds by whether the iteration before published: what a publication
        # leaves running beside the training thread shows here.
        after_publication: dict[bool, list[float]] = {True: [], False: []}

        def full(n: int) -> None:
            for _ in range(n):
                t = time.perf_counter()
                batch = source()
                took = time.perf_counter() - t
                parts["data source"] += took
                after_publication[learner.train_iter % send_freq == 0].append(took)
                t = time.perf_counter()
                learner.train(batch)
                parts["train"] += time.perf_counter() - t
                source.feedback(learner.priority_info)
            publisher.flush()

        sides = {"bare": bare, "learner": full}
        for fn in sides.values():  # warm-up
            fn(100)
        parts.clear()
        after_publication[True].clear()
        after_publication[False].clear()
        cpu: dict[str, list[float]] = {k: [] for k in sides}
        wall: dict[str, list[float]] = {k: [] for k in sides}
        thread: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(repeats):
            for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                c, w, th = time.process_time(), time.perf_counter(), time.thread_time()
                sides[name](block)
                cpu[name].append((time.process_time() - c) / block * 1e6)
                wall[name].append((time.perf_counter() - w) / block * 1e6)
                thread[name].append((time.thread_time() - th) / block * 1e6)
        publisher.close()
    finally:
        server.stop()
    iters = block * repeats
    learner_parts = {k: v / iters * 1e6 for k, v in parts.items() if k != "train"}
    hooks = sum(v for k, v in learner_parts.items() if k not in ("data source", "policy.learn"))
    learner_parts["finite check and bookkeeping"] = parts["train"] / iters * 1e6 - learner_parts["policy.learn"] - hooks
    med = {f"{k}_{kind}_us": round(statistics.median(v), 1)
           for kind, d in (("cpu", cpu), ("wall", wall), ("train_thread_cpu", thread)) for k, v in d.items()}
    return {"config": config, "block": block, "repeats": repeats, **med,
            "bare_vs_learner_cpu": round(med["bare_cpu_us"] / med["learner_cpu_us"], 3),
            "bare_vs_learner_wall": round(med["bare_wall_us"] / med["learner_wall_us"], 3),
            "learner_parts_us": {k: round(v, 1) for k, v in sorted(learner_parts.items(), key=lambda kv: -kv[1])},
            "data_source_us_after_publication": round(statistics.median(after_publication[True]) * 1e6, 1),
            "data_source_us_otherwise": round(statistics.median(after_publication[False]) * 1e6, 1),
            "cpu_us_per_block": {k: [round(x, 1) for x in v] for k, v in cpu.items()}}


def report(res: dict[str, Any]) -> None:
    print(f"{res['config']}: bare loop {res['bare_cpu_us']:.0f} µs CPU / {res['bare_wall_us']:.0f} µs wall per train "
          f"iteration, learner loop {res['learner_cpu_us']:.0f} / {res['learner_wall_us']:.0f}: learner ÷ bare "
          f"train iters/s = {res['bare_vs_learner_cpu']:.3f} (CPU), {res['bare_vs_learner_wall']:.3f} (wall)", flush=True)
    print(f"  the learner's training thread: {res['learner_train_thread_cpu_us']:.0f} µs CPU per iteration, its other "
          f"threads {res['learner_cpu_us'] - res['learner_train_thread_cpu_us']:.0f}", flush=True)
    print(f"  the data source's call, median µs: {res['data_source_us_after_publication']} on the iteration after a "
          f"publication, {res['data_source_us_otherwise']} on the others", flush=True)
    print("  learner's iteration, µs: " + ", ".join(f"{k} {v}" for k, v in res["learner_parts_us"].items()), flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["cartpole_dqn", "mountaincar_dqn", "lunarlander_dqn"])
    ap.add_argument("--block", type=int, default=200, help="train iterations per timed block")
    ap.add_argument("--repeats", type=int, default=16, help="blocks per side")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"load_average_start": list(os.getloadavg()), "runs": []}
    for config in args.configs:
        res = measure(config, args.block, args.repeats)
        report(res)
        out["runs"].append(res)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
