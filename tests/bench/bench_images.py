"""Image benchmarks on Atari Pong (deploy/configs/pong_dqn.py: 8 envs, 4 x 84 x 84 uint8, the Nature conv DQN).

    python -m tests.bench.bench_images [--quick] [--repeats N] [--json out.json]

    collector   env steps/s of a real collector task (Redis, frames packed, chunks compressed)
                vs a bare in-process loop with the same ALE vector env, conv net, n-step adder and
                chunking (plain msgpack, no Redis); per repeat, back to back
    transport   chunks of real Pong rows (128, packed) sent through the collector's chunk script and
                read back with XREADGROUP + MGET + the learner's ack script, vs raw redis-py SET (one
                round trip a chunk) and MGET of the same bytes (both sides from the packed chunk:
                rqrl's includes msgpack and compression, as a collector pays them), with codec none,
                lz4 and zstd, and against raw SET/MGET of the uncompressed bytes (does compressing
                pay?); the bytes a chunk takes per env frame (agent step); decode ms a chunk
    memory      replay buffer bytes per stored transition / one 84 x 84 frame (allocated for
                pong_dqn's replay_buffer_size), and the frames the store really kept per transition
                for real Pong chunks
    learner     DQN train iterations/s at batch 32 on this CPU (one torch thread), from the frame store

Needs the atari extra (ale-py, OpenCV). Every repeat is kept (tests/bench/stats.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

import numpy as np
import torch

from common import blobstore, chunk_codec, frames, keys, serialization
from common.config import load_config
from common.step_data import AckEntry, StepDataStore
from tests.bench.bench_components import REPO, Bench, make_policy, pairs
from tests.bench.stats import spread
from workers.collector import ChunkBuilder, Collector
from workers.comm_collector import RedisCommCollector
from workers.comm_learner import BufferReader
from workers.publication import publish_policy
from workers.envs import make_vector_env, true_next_obs
from workers.replay_buffer import ReplayBuffer

CONFIG = REPO / "deploy" / "configs" / "pong_dqn.py"
FRAME = 84 * 84


def _cfg(**collector):
    cfg = load_config(CONFIG)
    cfg.exp_name = "bench"
    cfg.policy.collect.collector.update(collector)
    return cfg


def pong_chunks(cfg, rows: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Plain chunks of ``n_sample`` n-step rows from random play (the rows a collector makes)."""
    policy = make_policy(cfg, ("collect",))
    n_env = cfg.env.collector_env_num
    env = make_vector_env(cfg.env, n_env)
    rng = np.random.default_rng(seed)
    adder, chunk = policy.make_adder(n_env, {"eps": 1.0}), ChunkBuilder(cfg.policy.collect.n_sample)
    obs, _ = env.reset(seed=seed)
    out: list[dict[str, np.ndarray]] = []
    while sum(len(c["obs"]) for c in out) < rows:
        a, record = policy.act(obs, {"eps": 1.0}, rng)
        nxt, r, te, tr, info = env.step(a)
        if chunk.add(adder.add(obs, record, r, true_next_obs(nxt, te | tr, info, policy.spec), te, tr), 0):
            out.append(chunk.take())
        obs = nxt
    env.close()
    return out


class ImageBench(Bench):
    # ------------------------------------------------------------------ collector vs bare loop
    def collector(self) -> dict[str, Any]:
        steps = 1600 if self.quick else 4800
        cfg = _cfg(task_env_steps=steps)
        policy = make_policy(cfg)

        def real() -> float:
            task = self._task(cfg)
            publish_policy(self.conn, "bench", task["policy_id"], policy.get_weights(), 0, 2**62)
            c = Collector(cfg, task, RedisCommCollector(self.conn, task, 600))
            t0 = time.perf_counter()  # the run: policy fetch, reset, rollout, chunks sent
            info = c.run()
            return info["env_steps"] / (time.perf_counter() - t0)

        def bare() -> float:
            p = make_policy(cfg, ("collect",))
            n_env = cfg.env.collector_env_num
            env = make_vector_env(cfg.env, n_env)
            rng = np.random.default_rng(0)
            adder, chunk = p.make_adder(n_env, {"eps": 0.5}), ChunkBuilder(cfg.policy.collect.n_sample)
            t0 = time.perf_counter()  # a task's first reset loads the ROMs (~0.3 s an env): both pay it
            obs, _ = env.reset(seed=0)
            n = 0
            while n < steps:
                a, record = p.act(obs, {"eps": 0.5}, rng)
                nxt, r, te, tr, info = env.step(a)
                if chunk.add(adder.add(obs, record, r, true_next_obs(nxt, te | tr, info, p.spec), te, tr), 0):
                    serialization.dumps(chunk.take())
                obs = nxt
                n += n_env
            env.close()
            return n / (time.perf_counter() - t0)

        r, b, ratio = pairs(real, bare, self.repeats)
        return {"env_steps_per_task": steps, "collector_env_steps_per_s": spread(r, 0),
                "bare_loop_env_steps_per_s": spread(b, 0), "collector_vs_bare": spread(ratio)}

    # ------------------------------------------------------------------ transport
    def transport(self, chunks: list[dict[str, np.ndarray]]) -> dict[str, Any]:
        fields = ["obs", "next_obs"]
        packed = [frames.pack(c, fields) for c in chunks]
        rows = sum(len(c["obs"]) for c in chunks)
        t0 = time.perf_counter()
        for c in chunks:
            frames.pack(c, fields)
        pack_ms = (time.perf_counter() - t0) / len(chunks) * 1e3
        out: dict[str, Any] = {"rows_per_chunk": len(chunks[0]["obs"]), "chunks": len(chunks), "pack_ms_per_chunk": round(pack_ms, 2),
                               "plain_bytes_per_frame": round(sum(len(serialization.dumps(c)) for c in chunks) / rows, 1)}
        for codec in ("none", "lz4", "zstd"):
            out[codec] = self._transport(packed, codec, rows)
        return out

    def _transport(self, packed: list[dict[str, Any]], codec: str, rows: int) -> dict[str, Any]:
        cfg = _cfg(compression=codec)
        payloads = [chunk_codec.encode(serialization.dumps(p), codec) for p in packed]
        nbytes = sum(len(p) for p in payloads)
        n = len(packed)
        reps = 1 if self.quick else 3  # passes over the chunks per measurement

        def rqrl() -> float:
            task = self._task(cfg)
            comm = RedisCommCollector(self.conn, task, 600)
            lease = keys.lease("bench", task["task_id"])
            stream = keys.buffer_meta("bench", task["buffer_id"])
            BufferReader(self.conn, "bench", task["buffer_id"], "bench-learner", None, logging.getLogger("b"),
                         lambda: None, lease)  # creates the consumer group
            t0 = time.perf_counter()
            for i in range(n * reps):
                comm.send_stepdata(f"d{i}", packed[i % n], codec)
                comm.send_metadata({"data_id": f"d{i}", "policy_version": 0, "n_samples": 128, "env_steps": 128})
                comm.flush()
            got = 0
            while got < n * reps:
                entries = self.conn.xreadgroup(keys.LEARNER_GROUP, "bench-learner", {stream: ">"}, count=16)[0][1]
                got += len(entries)
                dkeys = [keys.data("bench", e[1][b"data_id"].decode()) for e in entries]
                blobs = blobstore.get_many(self.conn, dkeys)
                assert all(b is not None for b in blobs)
                StepDataStore(self.conn, "bench", task["buffer_id"]).ack(
                    lease, [AckEntry(e[0], k, 128, "consumed") for e, k in zip(entries, dkeys)])
            return n * reps / (time.perf_counter() - t0)

        def raw(blobs: list[bytes]) -> float:
            self.conn.flushall()
            t0 = time.perf_counter()
            for i in range(n * reps):  # one round trip per chunk, as a collector must
                self.conn.set(f"raw:{i}", blobs[i % n], ex=600)
            for start in range(0, n * reps, 16):
                self.conn.mget([f"raw:{i}" for i in range(start, min(n * reps, start + 16))])
            return n * reps / (time.perf_counter() - t0)

        plain = [serialization.dumps(p) for p in packed]
        r, w, ratio = pairs(rqrl, lambda: raw(payloads), self.repeats)
        # Does compressing pay? rqrl with this codec against raw SET/MGET of the uncompressed bytes.
        wp = [raw(plain) for _ in range(self.repeats)]
        t0 = time.perf_counter()
        for p in payloads:  # what the learner's reader then spends per chunk (not in either rate)
            serialization.loads(chunk_codec.decode(p))
        decode_ms = (time.perf_counter() - t0) / n * 1e3
        return {"bytes_per_frame": round(nbytes / rows, 1), "chunk_bytes_mean": round(nbytes / n),
                "decode_ms_per_chunk": round(decode_ms, 2),
                "rqrl_chunks_per_s": spread(r, 1), "raw_redis_chunks_per_s": spread(w, 1), "transport_vs_raw": spread(ratio),
                "raw_redis_uncompressed_chunks_per_s": spread(wp, 1),
                "transport_vs_raw_uncompressed": spread([x / y for x, y in zip(r, wp)])}

    # ------------------------------------------------------------------ replay memory and learner
    def memory_and_learner(self, chunks: list[dict[str, np.ndarray]]) -> tuple[dict[str, Any], dict[str, Any]]:
        cfg = _cfg()
        policy = make_policy(cfg)
        schema = policy.schema()
        fields = frames.framed_fields(policy.spec, schema)
        size = int(cfg.policy.other.replay_buffer.replay_buffer_size)
        rows = sum(len(c["obs"]) for c in chunks)
        buf = ReplayBuffer(rows, schema, framed=fields)
        for c in chunks:
            buf.extend(frames.pack(c, fields))
        plain = frames.buffer_bytes(size, schema) / size
        memory = {"replay_buffer_size": size,
                  "allocated_bytes_per_transition": round(frames.buffer_bytes(size, schema, fields) / size, 1),
                  "allocated_per_transition_vs_frame": round(frames.buffer_bytes(size, schema, fields) / size / FRAME, 3),
                  "stored_transitions": rows, "frames_kept_per_transition": round(buf._frames.total / rows, 3),
                  "plain_bytes_per_transition": round(plain, 1), "plain_vs_frame": round(plain / FRAME, 3)}
        iters = 50 if self.quick else 200
        rng = np.random.default_rng(0)
        batches = [buf.sample(32, rng) for _ in range(8)]
        policy.learn(batches[0])  # warm-up
        speeds, sample_s = [], []
        for _ in range(self.repeats):
            t0 = time.perf_counter()
            for i in range(iters):
                policy.learn(batches[i % len(batches)])
            speeds.append(iters / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            for _ in range(iters):
                buf.sample(32, rng)
            sample_s.append((time.perf_counter() - t0) / iters * 1e3)
        learner = {"batch_size": 32, "device": "cpu", "torch_threads": torch.get_num_threads(),
                   "train_iter_per_s": spread(speeds, 1), "samples_per_s": spread([s * 32 for s in speeds], 0),
                   "sample_ms_per_batch": spread(sample_s, 3)}
        return memory, learner


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    b = ImageBench(args.quick, args.repeats)
    try:
        chunks = pong_chunks(_cfg(), 1280 if args.quick else 3840)
        out: dict[str, Any] = {"config": "deploy/configs/pong_dqn.py"}
        out["memory"], out["learner"] = b.memory_and_learner(chunks)
        out["transport"] = b.transport(chunks)
        out["collector"] = b.collector()
    finally:
        b.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
