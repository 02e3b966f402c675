"""Component benchmarks: collector, transport, policy propagation, per-task overhead, learner.

    python -m tests.bench.bench_components [--quick] [--repeats N] [--only PART ...] [--json out.json]

Everything runs against a private redis-server started here. Every figure keeps all its
repeats (min / median / max and the values, see tests/bench/stats.py); every ratio is taken
per repeat from two measurements made back to back in the same process.
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
from typing import Any

import numpy as np
import torch

from common import keys, serialization
from common.config import compile_config
from common.connection import connect
from common.embedded_redis import EmbeddedRedis
from common import spaces
from common.policy import create_policy
from coordinator.commander import SoloCommander
from workers.collector import ChunkBuilder, Collector
from workers.comm_collector import RedisCommCollector
from workers.comm_learner import BufferReader
from workers.publication import publish_policy
from workers.envs import make_vector_env, true_next_obs
from workers.replay_buffer import ReplayBuffer
from tests.bench.stats import spread
from common.lease import grant as grant_lease

REPO = Path(__file__).resolve().parents[2]
SCHEMA = {"obs": ((4,), np.dtype(np.float32)), "action": ((), np.dtype(np.int64)), "reward": ((), np.dtype(np.float32)),
          "next_obs": ((4,), np.dtype(np.float32)), "done": ((), np.dtype(np.bool_)), "discount": ((), np.dtype(np.float32))}


def make_policy(cfg, modes=("learn",)):
    """The config's policy for its env (shapes read from the env, as a learner does)."""
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    return create_policy(cfg, spec, modes=modes, device="cpu")


DEFAULT_CFG = compile_config({"exp_name": "bench"})


def pairs(a, b, repeats: int) -> tuple[list[float], list[float], list[float]]:
    """``repeats`` back-to-back measurements of ``a`` and ``b``: (a values, b values, a/b per repeat)."""
    xs, ys = [], []
    for _ in range(repeats):
        xs.append(a())
        ys.append(b())
    return xs, ys, [x / y for x, y in zip(xs, ys)]


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
            commander.update_learner_info("l", {"train_iter": 1})
        task = commander.get_collector_task()
        grant_lease(self.conn, cfg.exp_name, task["task_id"], 3600)
        return task

    # ------------------------------------------------------------------ collector vs bare loop
    def collector_throughput(self) -> dict[str, Any]:
        steps = 4000 if self.quick else 20000
        cfg = compile_config({"exp_name": "bench", "policy": {"collect": {"collector": {"task_env_steps": steps}}}})
        policy = make_policy(cfg)

        def real() -> float:
            task = self._task(cfg)
            publish_policy(self.conn, "bench", task["policy_id"], policy.get_weights(), 0, 2**62)
            comm = RedisCommCollector(self.conn, task, 600)
            c = Collector(cfg, task, comm)
            t0 = time.perf_counter()
            info = c.run()
            return info["env_steps"] / (time.perf_counter() - t0)

        def bare() -> float:
            # The same vector env, policy net, batch and n-step packing, with no Redis at all. Both
            # timers start after the envs and the policy net are built and cover the weights' load,
            # the envs' reset, the loop and the envs' close (the task's own envs, as here).
            p = make_policy(cfg, ("collect",))
            env = make_vector_env(cfg.env, cfg.env.collector_env_num)
            rng = np.random.default_rng(0)
            adder = p.make_adder(cfg.env.collector_env_num, {"eps": 0.5})
            chunk = ChunkBuilder(cfg.policy.collect.n_sample)
            t0 = time.perf_counter()
            p.set_weights(serialization.loads(serialization.dumps(policy.get_weights())))
            obs, _ = env.reset(seed=0)
            n = 0
            while n < steps:
                a, record = p.act(obs, {"eps": 0.5}, rng)
                nxt, r, te, tr, info = env.step(a)
                real_next = true_next_obs(nxt, te | tr, info, p.spec)
                if chunk.add(adder.add(obs, record, r, real_next, te, tr), 0):
                    serialization.dumps(chunk.take())
                obs = nxt
                n += cfg.env.collector_env_num
            env.close()
            return n / (time.perf_counter() - t0)

        r, b, ratio = pairs(real, bare, self.repeats)
        return {"env_steps_per_task": steps, "collector_env_steps_per_s": spread(r, 0),
                "bare_loop_env_steps_per_s": spread(b, 0), "collector_vs_bare": spread(ratio)}

    # ------------------------------------------------------------------ transport
    def transport(self) -> dict[str, Any]:
        """Step data through the blob store + stream (send, consume, ack) vs raw SET/MGET of the same
        bytes, for chunks of about 3 KB, 50 KB and 800 KB (64, 1,024 and 16,384 CartPole rows),
        each sent as a collector does (one flush per chunk) and with 8 chunks per flush. Both
        timers cover serialization, the writes (one pipelined round trip per flush on both sides)
        and the reads; rqrl's also covers its stream entries, lease checks and acks."""
        return {f"{rows}x{per_flush}": self._transport(rows, n_chunks, per_flush)
                for rows, n_chunks in ((64, 400 if self.quick else 2000), (1024, 100 if self.quick else 400),
                                       (16384, 16 if self.quick else 64))
                for per_flush in (1, 8)}

    def _transport(self, rows: int, n_chunks: int, per_flush: int) -> dict[str, Any]:
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
            from common.step_data import AckEntry, StepDataStore

            lease = keys.lease("bench", task["task_id"])
            stream = keys.buffer_meta("bench", task["buffer_id"])
            reader = BufferReader(self.conn, "bench", task["buffer_id"], "bench-learner", buf, logging.getLogger("b"),
                                  lambda: None, lease)
            t0 = time.perf_counter()
            for i in range(n_chunks):
                comm.send_stepdata(f"d{i}", chunk)
                comm.send_metadata({"data_id": f"d{i}", "policy_version": 0, "n_samples": rows, "env_steps": rows})
                if (i + 1) % per_flush == 0 or i + 1 == n_chunks:
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
                StepDataStore(self.conn, "bench", task["buffer_id"]).ack(
                    lease, [AckEntry(e[0], k, rows, "consumed") for e, k in zip(entries, dkeys)])
            return n_chunks * nbytes / (time.perf_counter() - t0) / 1e6

        def raw() -> float:
            """The same work with nothing of rqrl's: serialize each chunk, SET it (pipelined, one
            round trip per ``per_flush`` chunks, as rqrl's side flushes), MGET 64 at a time."""
            self.conn.flushall()
            t0 = time.perf_counter()
            pipe = self.conn.pipeline(transaction=False)
            for i in range(n_chunks):
                pipe.set(f"raw:{i}", serialization.dumps(chunk), ex=600)
                if (i + 1) % per_flush == 0 or i + 1 == n_chunks:
                    pipe.execute()
            for start in range(0, n_chunks, 64):
                self.conn.mget([f"raw:{i}" for i in range(start, min(n_chunks, start + 64))])
            return n_chunks * nbytes / (time.perf_counter() - t0) / 1e6

        r, w, ratio = pairs(lambda: rqrl(False), raw, self.repeats)
        e2e = [rqrl(True) for _ in range(self.repeats)]
        return {"rows": rows, "chunks": n_chunks, "chunks_per_flush": per_flush, "chunk_bytes": nbytes,
                "transport_MB_per_s": spread(r, 2),
                "raw_redis_MB_per_s": spread(w, 2), "transport_vs_raw": spread(ratio),
                "into_replay_buffer_MB_per_s": spread(e2e, 2)}

    # ------------------------------------------------------------------ policy propagation
    def propagation(self) -> dict[str, Any]:
        """For each version v a learner publishes, the time from its publication to the first action
        a real collector task takes with a version >= v.

        The publisher is a real learning loop (DQN updates on a filled replay buffer, one thread,
        flat out: no replay-ratio wait) publishing every ``send_policy_freq`` iterations, as
        ``PublishPolicyHook`` does. The collector is a real task on the same Redis; each of its
        ``act`` calls is logged with the version it acts with. A version counts as published when
        ``publish_policy`` returned. Versions published after the collector's last action are
        left out (and counted).
        """
        steps = 4000 if self.quick else 16000
        cfg = compile_config({"exp_name": "bench", "policy": {"collect": {"collector": {"task_env_steps": steps}}}})
        freq = int(cfg.policy.learn.learner.send_policy_freq)
        lags_all: list[float] = []
        per_repeat_p95: list[float] = []
        published_n = censored_n = 0
        intervals: list[float] = []
        for _ in range(self.repeats):
            learner = make_policy(cfg)
            buf = _filled_buffer(20000)
            rng = np.random.default_rng(0)
            task = self._task(cfg)
            publish_policy(self.conn, "bench", task["policy_id"], learner.get_weights(), 0, 2**62)
            stop = threading.Event()
            published: list[tuple[int, float]] = []

            def learn() -> None:
                it = 0
                while not stop.is_set():
                    learner.learn(buf.sample(int(cfg.policy.learn.batch_size), rng))
                    it += 1
                    if it % freq == 0:
                        publish_policy(self.conn, "bench", task["policy_id"], learner.get_weights(), it, 2**62)
                        published.append((it, time.perf_counter()))

            comm = RedisCommCollector(self.conn, task, 600)
            collector = Collector(cfg, task, comm)
            acts: list[tuple[float, int]] = []
            real_act = collector._policy.act

            def logged_act(obs, setting, rng_):
                acts.append((time.perf_counter(), collector.policy_version))
                return real_act(obs, setting, rng_)

            collector._policy.act = logged_act
            t = threading.Thread(target=learn, daemon=True)
            t.start()
            collector.run()
            stop.set()
            t.join()
            comm.close()
            lags, censored = _first_use_lags(published, acts)
            published_n += len(published)
            censored_n += censored
            lags_all += lags
            if lags:
                per_repeat_p95.append(float(np.percentile(lags, 95)) * 1000)
            intervals += [b[1] - a[1] for a, b in zip(published, published[1:])]
        ms = [x * 1000 for x in lags_all]
        return {"send_policy_freq": freq, "versions_published": published_n, "versions_after_last_action": censored_n,
                "publish_interval_ms_median": round(statistics.median(intervals) * 1000, 2) if intervals else None,
                "lag_ms_p50": round(float(np.percentile(ms, 50)), 2) if ms else None,
                "lag_ms_p95": round(float(np.percentile(ms, 95)), 2) if ms else None,
                "lag_ms_max": round(max(ms), 2) if ms else None,
                "lag_ms_p95_per_repeat": spread(per_repeat_p95, 2)}

    # ------------------------------------------------------------------ per-task overhead
    def task_overhead(self) -> dict[str, Any]:
        """Tasks of the default length (``task_env_steps``) run one after another by one ``rq worker
        --burst``: per job, the time inside the work-horse (RQ 3 stamps ``started_at`` there, after
        the fork) and its in-task set-up (config, env build, policy wait and first fetch); per task,
        the worker's time outside the jobs ((worker wall - sum of job times) / tasks: worker start,
        fork, RQ bookkeeping). ``collector_worker`` runs the tasks in-process and keeps the run's
        envs: only its first task builds them."""
        n = 4 if self.quick else 10
        # Short tasks, so the per-task costs show: a run's tasks are 20x longer by default.
        cfg = compile_config({"exp_name": "bench", "policy": {"collect": {"collector": {"task_env_steps": 1000}}}})
        policy = make_policy(cfg)
        out: dict[str, Any] = {"tasks": n, "task_env_steps": int(cfg.policy.collect.collector.task_env_steps)}
        from rq import Queue
        from rq.job import Job

        from common.rq_json import TaskSerializer

        # rqrl's queues carry JSON (common/rq_json.py): the stock worker is told so with -S.
        for label, extra in (("collector_worker", ["-w", "workers.worker.CollectorWorker"]),
                             ("preload_worker", ["-w", "workers.worker.PreloadWorker"]),
                             ("stock_worker", ["-S", "rq.serializers.JSONSerializer"])):
            self.conn.flushall()
            commander = SoloCommander(cfg, run_id="bench")
            self.conn.set(keys.run("bench"), "bench")
            commander.get_learner_task()
            q = Queue(keys.COLLECTOR_QUEUE, connection=self.conn, serializer=TaskSerializer)
            ids = []
            for _ in range(n):
                task = commander.get_collector_task()
                commander.notify_fail_collector_task(task)  # free the space: tasks run one after another
                grant_lease(self.conn, "bench", task["task_id"], 3600)
                publish_policy(self.conn, "bench", task["policy_id"], policy.get_weights(), 0, 2**62)
                q.enqueue_call("workers.collector.run_collector_task", args=(task,), job_id=task["task_id"], timeout=120)
                ids.append(task["task_id"])
            rq = str(Path(sys.executable).with_name("rq"))
            t0 = time.perf_counter()
            subprocess.run([rq, "worker", keys.COLLECTOR_QUEUE, "--url", self.url, "--burst", "-q", *extra],
                           cwd=REPO, check=True, capture_output=True)
            wall = time.perf_counter() - t0
            jobs = Job.fetch_many(ids, connection=self.conn, serializer=TaskSerializer)
            durations = [(j.ended_at - j.started_at).total_seconds() for j in jobs if j.ended_at]
            setups = [j.return_value()["setup_s"] for j in jobs if j.return_value()]
            if len(durations) != n or len(setups) != n:
                raise RuntimeError(f"task_overhead/{label}: only {len(setups)} of {n} jobs finished")
            out[label] = {"worker_wall_s": round(wall, 2), "job_s": spread(durations),
                          "in_task_setup_s": spread(setups),
                          "setup_share_of_job": spread([s_ / d for s_, d in zip(setups, durations)]),
                          "outside_jobs_per_task_s": round((wall - sum(durations)) / n, 3)}
        return out

    # ------------------------------------------------------------------ learner
    def learner(self) -> dict[str, Any]:
        """Train iterations/s of the default DQN learner step alone, and while publishing every
        iteration and every ``send_policy_freq`` iterations (back to back per repeat)."""
        cfg = DEFAULT_CFG
        p = make_policy(cfg)
        rng = np.random.default_rng(0)
        buf = _filled_buffer(20000)
        iters = 300 if self.quick else 2000
        batch = int(cfg.policy.learn.batch_size)
        freq = int(cfg.policy.learn.learner.send_policy_freq)
        task = self._task(cfg)

        def run(every: int) -> float:
            t0 = time.perf_counter()
            for i in range(1, iters + 1):
                p.learn(buf.sample(batch, rng))
                if every and i % every == 0:
                    publish_policy(self.conn, "bench", task["policy_id"], p.get_weights(), i, 2**62)
            return iters / (time.perf_counter() - t0)

        alone, every_iter, every_freq = [], [], []
        for _ in range(self.repeats):
            alone.append(run(0))
            every_iter.append(run(1))
            every_freq.append(run(freq))
        return {"batch_size": batch, "send_policy_freq": freq, "train_iter_per_s": spread(alone, 1),
                "ms_per_train_iter": spread([1000 / a for a in alone], 3),
                "train_iter_per_s_publishing_every_iter": spread(every_iter, 1),
                "train_iter_per_s_publishing_every_freq": spread(every_freq, 1),
                "publish_cost_share_at_freq": spread([1 - f / a for f, a in zip(every_freq, alone)])}


def _filled_buffer(n: int) -> ReplayBuffer:
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(n, SCHEMA)
    buf.extend({"obs": rng.standard_normal((n, 4), dtype=np.float32), "action": rng.integers(0, 2, n),
                "reward": np.ones(n, np.float32), "next_obs": rng.standard_normal((n, 4), dtype=np.float32),
                "done": np.zeros(n, bool), "discount": np.full(n, 0.9, np.float32)})
    return buf


def _first_use_lags(published: list[tuple[int, float]], acts: list[tuple[float, int]]) -> tuple[list[float], int]:
    """Seconds from each publication (version, time) to the first act (time, version) at or after it
    with a version >= the published one; and how many versions no act followed."""
    lags, censored = [], 0
    j = 0
    for version, t_pub in published:  # both lists are in time order
        # An act skipped for one version cannot serve a later one (published later, higher version).
        while j < len(acts) and not (acts[j][0] >= t_pub and acts[j][1] >= version):
            j += 1
        if j == len(acts):
            censored += 1
            continue
        lags.append(acts[j][0] - t_pub)
    return lags, censored


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
