"""Component benchmarks: collector, transport, policy propagation, per-task overhead, learner.

    python -m tests.bench.bench_components [--quick] [--json out.json]

Everything runs against a private redis-server started here. Each figure is the median of
``--repeats`` runs; every comparison is a ratio measured in the same process, back to back.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from common import keys, serialization
from common.config import compile_config
from common.connection import connect
from common.embedded_redis import EmbeddedRedis
from common.policy import create_policy
from common.policy.dqn import transition_schema
from coordinator.commander import SoloCommander
from workers.collector import ChunkBuilder, Collector
from workers.comm_collector import RedisCommCollector
from workers.comm_learner import BufferReader, publish_policy
from workers.envs import make_vector_env, true_next_obs
from workers.replay_buffer import ReplayBuffer
from workers.task import grant_lease

REPO = Path(__file__).resolve().parents[2]
SCHEMA = transition_schema(4)


def median_of(fn: Callable[[], float], repeats: int) -> float:
    return statistics.median(fn() for _ in range(repeats))


class Bench:
    def __init__(self, quick: bool, repeats: int) -> None:
        self.quick = quick
        self.repeats = repeats
        self.redis = EmbeddedRedis().start()
        self.url = self.redis.url
        self.conn = connect(self.url)
        torch.set_num_threads(1)

    def close(self) -> None:
        self.redis.stop()

    def _task(self, cfg, eval_flag: bool = False) -> dict:
        self.conn.flushall()
        commander = SoloCommander(cfg, run_id="bench")
        self.conn.set(keys.run(cfg.exp_name), "bench")
        commander.get_learner_task()
        if eval_flag:
            commander.update_learner_info("l", {"learner_step": 1})
        task = commander.get_collector_task()
        grant_lease(self.conn, cfg.exp_name, task["task_id"], 3600)
        return task

    # ------------------------------------------------------------------ collector vs bare loop
    def collector_throughput(self) -> dict[str, Any]:
        steps = 4000 if self.quick else 20000
        cfg = compile_config({"exp_name": "bench", "policy": {"collect": {"collector": {"task_env_steps": steps}}}})
        policy = create_policy(cfg, enable_field=("learn",))

        def real() -> float:
            task = self._task(cfg)
            publish_policy(self.conn, "bench", task["policy_id"], policy.publishable_state(), 0, 2**62)
            comm = RedisCommCollector(self.conn, task, 600)
            c = Collector(cfg, task, comm)
            t0 = time.perf_counter()
            info = c.run()
            return info["step_count"] / (time.perf_counter() - t0)

        def bare() -> float:
            # The same vector env, policy net, batch and n-step packing, with no Redis at all.
            p = create_policy(cfg, enable_field=("collect", "eval"), device="cpu")
            env = make_vector_env("CartPole-v1", cfg.env.collector_env_num)
            rng = np.random.default_rng(0)
            adder = p.make_adder(cfg.env.collector_env_num)
            chunk = ChunkBuilder(cfg.policy.collect.n_sample, 4)
            obs, _ = env.reset(seed=0)
            n = 0
            t0 = time.perf_counter()
            while n < steps:
                a = p.act(obs, 0.5, rng)
                nxt, r, te, tr, info = env.step(a)
                real_next = true_next_obs(nxt, te | tr, info)
                for row in adder.add(obs, a, r, real_next, te, tr):
                    if chunk.add(row):
                        serialization.dumps(chunk.take())
                obs = nxt
                n += cfg.env.collector_env_num
            env.close()
            return n / (time.perf_counter() - t0)

        r, b = median_of(real, self.repeats), median_of(bare, self.repeats)
        return {"collector_env_steps_per_s": round(r), "bare_loop_env_steps_per_s": round(b),
                "collector_vs_bare": round(r / b, 3)}

    # ------------------------------------------------------------------ transport
    def transport(self) -> dict[str, Any]:
        """Step data through the blob store + stream (send, consume, ack) vs raw SET/MGET of the same
        bytes, for 64-row chunks (the CartPole default's size class) and bigger ones."""
        out: dict[str, Any] = {}
        for rows, n_chunks in ((64, 200 if self.quick else 1000), (1024, 100 if self.quick else 300),
                               (16384, 20 if self.quick else 60)):
            r = self._transport(rows, n_chunks)
            key = "" if rows == 64 else f"_{rows}_rows"
            out.update({f"{k}{key}": v for k, v in r.items()})
        return out

    def _transport(self, rows: int, n_chunks: int) -> dict[str, Any]:
        cfg = compile_config({"exp_name": "bench"})
        rng = np.random.default_rng(0)
        chunk = {"obs": rng.standard_normal((rows, 4), dtype=np.float32), "action": rng.integers(0, 2, rows),
                 "reward": np.ones(rows, np.float32), "next_obs": rng.standard_normal((rows, 4), dtype=np.float32),
                 "done": np.zeros(rows, bool), "discount": np.full(rows, 0.9, np.float32)}
        nbytes = len(serialization.dumps(chunk))

        def rqrl(insert: bool) -> float:
            """Send through the collector's chunk script, read with XREADGROUP + MGET, ack with the
            learner's ack script; ``insert`` also decodes and inserts into a replay buffer."""
            task = self._task(cfg)
            comm = RedisCommCollector(self.conn, task, 600)
            buf = ReplayBuffer(min(n_chunks * rows, 200_000), SCHEMA)
            import logging

            from common import blobstore
            from common.scripts import ack_chunks

            lease = keys.lease("bench", task["task_id"])
            stream = keys.buffer_meta("bench", task["buffer_id"])
            reader = BufferReader(self.conn, "bench", task["buffer_id"], "bench-learner", buf, logging.getLogger("b"),
                                  lambda: None, lease)
            t0 = time.perf_counter()
            for i in range(n_chunks):
                comm.send_stepdata(f"d{i}", chunk)
                comm.send_metadata({"data_id": f"d{i}", "policy_iter": 0, "n_samples": rows, "env_steps": rows})
                comm.flush()
            got = 0
            while got < n_chunks:
                entries = self.conn.xreadgroup(keys.LEARNER_GROUP, "bench-learner", {stream: ">"}, count=64)[0][1]
                got += len(entries)
                if insert:
                    reader._consume(entries)
                    continue
                dkeys = [keys.data("bench", e[1][b"data_id"].decode()) for e in entries]
                blobs = blobstore.get_many(self.conn, dkeys)
                assert all(b is not None for b in blobs)
                ack_chunks(self.conn, lease, stream, keys.buffer_stats("bench", task["buffer_id"]), keys.LEARNER_GROUP,
                           [(e[0], k, rows, "consumed") for e, k in zip(entries, dkeys)])
            return n_chunks * nbytes / (time.perf_counter() - t0) / 1e6

        def raw() -> float:
            self.conn.flushall()
            payloads = [serialization.dumps(chunk) for _ in range(1)] * n_chunks
            t0 = time.perf_counter()
            for i, p in enumerate(payloads):  # one round trip per chunk, as a collector must
                self.conn.set(f"raw:{i}", p, ex=600)
            for start in range(0, n_chunks, 64):
                self.conn.mget([f"raw:{i}" for i in range(start, min(n_chunks, start + 64))])
            return n_chunks * nbytes / (time.perf_counter() - t0) / 1e6

        r = median_of(lambda: rqrl(False), self.repeats)
        e2e = median_of(lambda: rqrl(True), self.repeats)
        w = median_of(raw, self.repeats)
        return {"chunk_bytes": nbytes, "transport_MB_per_s": round(r, 2), "raw_redis_MB_per_s": round(w, 2),
                "transport_vs_raw": round(r / w, 3), "into_replay_buffer_MB_per_s": round(e2e, 2)}

    # ------------------------------------------------------------------ policy propagation
    def propagation(self) -> dict[str, Any]:
        cfg = compile_config({"exp_name": "bench", "policy": {"collect": {"collector": {
            "task_env_steps": 4000 if self.quick else 16000}}}})
        policy = create_policy(cfg, enable_field=("learn",))
        task = self._task(cfg)
        publish_policy(self.conn, "bench", task["policy_id"], policy.publishable_state(), 0, 2**62)
        stop = threading.Event()

        def learner() -> None:  # publishes like a learner at ~200 train iterations/s
            it = 0
            while not stop.wait(0.005):
                it += 1
                publish_policy(self.conn, "bench", task["policy_id"], policy.publishable_state(), it, 2**62)

        t = threading.Thread(target=learner, daemon=True)
        t.start()
        comm = RedisCommCollector(self.conn, task, 600)
        info = Collector(cfg, task, comm).run()
        stop.set()
        t.join()
        return {"policy_lag_p50_ms": info.get("policy_lag_p50_ms"), "policy_lag_p95_ms": info.get("policy_lag_p95_ms")}

    # ------------------------------------------------------------------ per-task overhead
    def task_overhead(self) -> dict[str, Any]:
        n = 4 if self.quick else 10
        cfg = compile_config({"exp_name": "bench", "policy": {"collect": {"collector": {"task_env_steps": 8}}}})
        policy = create_policy(cfg, enable_field=("learn",))
        out: dict[str, Any] = {}
        from rq import Queue
        from rq.job import Job

        for label, extra in (("preload_worker", ["-w", "workers.worker.PreloadWorker"]), ("stock_worker", [])):
            self.conn.flushall()
            commander = SoloCommander(cfg, run_id="bench")
            self.conn.set(keys.run("bench"), "bench")
            commander.get_learner_task()
            q = Queue(keys.COLLECTOR_QUEUE, connection=self.conn)
            ids = []
            for _ in range(n):
                task = commander.get_collector_task()
                commander.notify_fail_collector_task(task)  # free the space: tasks run one after another
                grant_lease(self.conn, "bench", task["task_id"], 3600)
                publish_policy(self.conn, "bench", task["policy_id"], policy.publishable_state(), 0, 2**62)
                q.enqueue_call("workers.collector.run_collector_task", args=(task,), job_id=task["task_id"], timeout=120)
                ids.append(task["task_id"])
            rq = str(Path(sys.executable).with_name("rq"))
            t0 = time.perf_counter()
            subprocess.run([rq, "worker", keys.COLLECTOR_QUEUE, "--url", self.url, "--burst", "-q", *extra],
                           cwd=REPO, check=True, capture_output=True)
            wall = time.perf_counter() - t0
            jobs = Job.fetch_many(ids, connection=self.conn)
            durations = [(j.ended_at - j.started_at).total_seconds() for j in jobs if j.ended_at]
            setups = [j.return_value()["setup_s"] for j in jobs if j.return_value()]
            out[label] = {"tasks": n, "worker_wall_s": round(wall, 2),
                          "job_s_median": round(statistics.median(durations), 3),
                          "in_task_setup_s_median": round(statistics.median(setups), 3),
                          "fork_and_import_s_median": round(statistics.median(durations) - statistics.median(setups), 3)}
        return out

    # ------------------------------------------------------------------ learner
    def learner(self) -> dict[str, Any]:
        cfg = compile_config({"exp_name": "bench"})
        p = create_policy(cfg, enable_field=("learn",))
        rng = np.random.default_rng(0)
        buf = ReplayBuffer(20000, SCHEMA)
        buf.extend({"obs": rng.standard_normal((20000, 4), dtype=np.float32), "action": rng.integers(0, 2, 20000),
                    "reward": np.ones(20000, np.float32), "next_obs": rng.standard_normal((20000, 4), dtype=np.float32),
                    "done": np.zeros(20000, bool), "discount": np.full(20000, 0.9, np.float32)})
        iters = 300 if self.quick else 2000

        def train() -> float:
            t0 = time.perf_counter()
            for _ in range(iters):
                p.forward(buf.sample(64, rng))
            return iters / (time.perf_counter() - t0)

        def train_and_publish() -> float:
            task = self._task(cfg)
            t0 = time.perf_counter()
            for i in range(iters):
                p.forward(buf.sample(64, rng))
                publish_policy(self.conn, "bench", task["policy_id"], p.publishable_state(), i, 2**62)
            return iters / (time.perf_counter() - t0)

        a, b = median_of(train, self.repeats), median_of(train_and_publish, self.repeats)
        return {"train_iter_per_s": round(a, 1), "train_iter_per_s_publishing_every_iter": round(b, 1)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--only", nargs="*", default=None,
                    help="subset of: collector transport propagation overhead learner")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    b = Bench(args.quick, args.repeats or (1 if args.quick else 3))
    parts = {"collector": b.collector_throughput, "transport": b.transport, "propagation": b.propagation,
             "overhead": b.task_overhead, "learner": b.learner}
    results: dict[str, Any] = {}
    try:
        for name, fn in parts.items():
            if args.only and name not in args.only:
                continue
            results[name] = fn()
            print(f"{name:<12} {json.dumps(results[name])}", flush=True)
    finally:
        b.close()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
