"""Ingest benchmark: many simulated collectors against the learner's real buffer reader, on 1 and 2
data shards. Where does one Redis (and one reader) end?

    python -m tests.bench.bench_ingest [--collectors 100,1000,10000] [--shards 1,2] [--seconds 20]
        [--rows 128] [--writers 2] [--json OUT]

Each point starts its own redis-servers (a control Redis plus the data shards; with 1 shard the
step data is on a server of its own too, as ``--data-redis-url`` puts it) and a real
:class:`workers.comm_learner.ShardReaders` filling a real replay buffer of CartPole DQN rows
(``--rows`` transitions a chunk, the shipped config's ``n_sample``). ``--writers`` processes, with
no torch, stand in for N collectors sending one chunk a second each: every 10 ms a writer sends the
chunks due in that slot through :meth:`common.step_data.StepDataStore.put` (the collectors' own
scripts and lease check; one pipeline per slot and shard, where N real collectors would each make
their own round trip), spreading the collectors over the shards as the coordinator does.

After ``--warmup`` seconds it measures for ``--seconds``: chunks offered (what the schedule asked),
written and ingested per second, the backlog (chunks written, not yet consumed) at the window's
start and end and its growth per second, each redis-server's CPU (``INFO cpu``, cores), the reader
threads' CPU (cores) and the writers' CPU (cores). On 2 cores the writers, the servers and the
reader share the machine: the figure that stops growing with N names what binds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from common import keys, lease, serialization, streams
from common.connection import connect
from common.embedded_redis import EmbeddedRedis
from common.step_data import Chunk, StepDataStore

REPO = Path(__file__).resolve().parents[2]
NS = "ingest/r1"
BUFFER = "buffer_bench"
WRITER_TASK = "collector_task_bench"
READER_TASK = "learner_task_bench"
SLOT_S = 0.01  # a writer's send period (seconds)
# CartPole DQN's row schema (common/policy/dqn/policy.py schema() for a (4,) float32 observation).
SCHEMA = {"obs": ((4,), np.dtype(np.float32)), "action": ((), np.dtype(np.int64)), "reward": ((), np.dtype(np.float32)),
          "next_obs": ((4,), np.dtype(np.float32)), "done": ((), np.dtype(np.bool_)), "discount": ((), np.dtype(np.float32))}


def chunk_payload(rows: int, seed: int = 0) -> bytes:
    """A chunk of ``rows`` random CartPole DQN transitions, serialised as a collector sends it."""
    rng = np.random.default_rng(seed)
    data = {k: (rng.standard_normal((rows, *shape)) > 0 if dt == np.bool_ else
                rng.integers(0, 2, (rows, *shape)) if dt.kind == "i" else rng.standard_normal((rows, *shape))).astype(dt)
            for k, (shape, dt) in SCHEMA.items()}
    return serialization.dumps(data)


def _writer(control_url: str, shard_urls: list[str], collectors: int, rows: int, stop_at: float,
            counts: Any) -> None:
    """Send one chunk a second for each of ``collectors`` simulated collectors until ``stop_at``
    (time.time()); ``counts`` (a shared array) gets the chunks written per shard."""
    control = connect(control_url)
    stores = [StepDataStore(connect(u), NS, BUFFER, control=control, label=f"shard {i}") for i, u in enumerate(shard_urls)]
    payload = chunk_payload(rows, seed=os.getpid())
    lease_key, policy_key = keys.lease(NS, WRITER_TASK), keys.policy(NS, "policy_bench")
    per_slot = collectors * SLOT_S  # chunks due per slot (may be a fraction)
    due, turn, slot_end = 0.0, 0, time.monotonic()
    while time.time() < stop_at:
        slot_end += SLOT_S
        due += per_slot
        n, due = int(due), due - int(due)
        batches: list[list[Chunk]] = [[] for _ in stores]
        for _ in range(n):  # the collectors in turn over the shards, as the coordinator spreads tasks
            data_id = f"{WRITER_TASK}_{uuid.uuid4().hex[:16]}"
            fields = streams.encode_fields({"data_id": data_id, "n_samples": rows, "env_steps": rows,
                                            "policy_version": 0, "task_id": WRITER_TASK, "ts": time.time()})
            batches[turn % len(stores)].append(Chunk(data_id, payload, rows, fields))
            turn += 1
        for i, (store, batch) in enumerate(zip(stores, batches)):
            if batch:
                store.put(batch, lease_key, policy_key, 600, 1_000_000)
                with counts.get_lock():
                    counts[i] += len(batch)
        time.sleep(max(0.0, slot_end - time.monotonic()))


def _server_cpu(conn: Any) -> float:
    info = conn.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _thread_cpu(native_ids: set[int]) -> float:
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in native_ids)


def _backlog(stores: list[StepDataStore]) -> int:
    """Chunks written and not yet consumed (or dropped) on every shard."""
    total = 0
    for s in stores:
        st = s.stats()
        total += st.get("produced", 0) - sum(st.get(k, 0) for k in ("consumed", "expired", "corrupt", "malformed",
                                                                       "duplicate", "trimmed"))
    return total


def point(collectors: int, shards: int, seconds: float, warmup: float, rows: int, writers: int,
          reader_batch: int = 64) -> dict[str, Any]:
    """One measurement (module docstring) on fresh servers."""
    import logging

    from workers.comm_learner import ShardReaders
    from workers.replay_buffer import ReplayBuffer

    servers = [EmbeddedRedis().start() for _ in range(1 + shards)]
    try:
        control = connect(servers[0].url)
        shard_conns = [connect(s.url) for s in servers[1:]]
        stores = [StepDataStore(c, NS, BUFFER, control=control, label=f"shard {i}") for i, c in enumerate(shard_conns)]
        lease.grant(control, NS, WRITER_TASK, 3600)
        lease.grant(control, NS, READER_TASK, 3600)
        buffer = ReplayBuffer(100_000, {k: (shape, dt) for k, (shape, dt) in SCHEMA.items()})
        reader = ShardReaders(control, NS, BUFFER, READER_TASK, buffer, logging.getLogger("bench_ingest"),
                              lambda: None, keys.lease(NS, READER_TASK), stores, batch=reader_batch)
        reader.start()
        stop_at = time.time() + warmup + seconds + 2.0
        ctx = mp.get_context("spawn")  # no fork of a process whose reader threads run
        counts = ctx.Array("q", shards)
        share = [collectors // writers + (1 if i < collectors % writers else 0) for i in range(writers)]
        procs = [ctx.Process(target=_writer, args=(servers[0].url, [s.url for s in servers[1:]],
                                                                      k, rows, stop_at, counts), daemon=True)
                 for k in share if k]
        for p in procs:
            p.start()
        time.sleep(warmup)  # the benchmark's own schedule: nothing to wait on but time
        ids = {r.native_id for r in reader.readers}
        wprocs = [psutil.Process(p.pid) for p in procs]
        t0, ingested0, written0, backlog0 = time.monotonic(), reader.chunks, sum(counts), _backlog(stores)
        cpu0 = [_server_cpu(connect(s.url)) for s in servers]
        rcpu0, wcpu0 = _thread_cpu(ids), sum(sum(w.cpu_times()[:2]) for w in wprocs)
        time.sleep(seconds)
        dt = time.monotonic() - t0
        ingested, written, backlog = reader.chunks - ingested0, sum(counts) - written0, _backlog(stores)
        cpu = [(_server_cpu(connect(s.url)) - c0) / dt for s, c0 in zip(servers, cpu0)]
        rcpu, wcpu = (_thread_cpu(ids) - rcpu0) / dt, (sum(sum(w.cpu_times()[:2]) for w in wprocs) - wcpu0) / dt
        for p in procs:
            p.join(timeout=30)
        reader.stop()
        for r in reader.readers:
            r.join(timeout=5)
        return {"collectors": collectors, "shards": shards, "rows_per_chunk": rows, "reader_batch": reader_batch,
                "window_s": round(dt, 2),
                "offered_chunks_per_s": float(collectors), "written_chunks_per_s": round(written / dt, 1),
                "ingested_chunks_per_s": round(ingested / dt, 1),
                "ingested_transitions_per_s": round(ingested * rows / dt, 0),
                "backlog_start": backlog0, "backlog_end": backlog, "backlog_growth_per_s": round((backlog - backlog0) / dt, 1),
                "control_redis_cpu_cores": round(cpu[0], 3), "shard_redis_cpu_cores": [round(c, 3) for c in cpu[1:]],
                "reader_cpu_cores": round(rcpu, 3), "writer_cpu_cores": round(wcpu, 3),
                "reader_errors": [repr(r.error) for r in reader.readers if r.error]}
    finally:
        for s in servers:
            s.stop()


def table(records: list[dict[str, Any]]) -> str:
    """The records as a markdown table (docs/performance.md)."""
    head = ("| simulated collectors | shards | offered chunks/s | written | ingested | backlog growth /s "
            "| shard Redis CPU (cores) | control Redis CPU | reader CPU | writers CPU |")
    lines = [head, "|" + "---|" * 10]
    for r in records:
        lines.append(f"| {r['collectors']:,} | {r['shards']} | {r['offered_chunks_per_s']:,.0f} | "
                     f"{r['written_chunks_per_s']:,.0f} | {r['ingested_chunks_per_s']:,.0f} | "
                     f"{r['backlog_growth_per_s']:+,.0f} | {' + '.join(f'{c:.2f}' for c in r['shard_redis_cpu_cores'])} | "
                     f"{r['control_redis_cpu_cores']:.2f} | {r['reader_cpu_cores']:.2f} | {r['writer_cpu_cores']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collectors", default="100,1000,10000", help="simulated collectors, comma-separated")
    ap.add_argument("--shards", default="1,2", help="data shard counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=20.0, help="the measured window")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--rows", type=int, default=128, help="transitions per chunk (cartpole_dqn.py's n_sample)")
    ap.add_argument("--writers", type=int, default=2, help="writer processes")
    ap.add_argument("--reader-batch", type=int, default=64,
                    help="stream entries a reader takes per read (the learner's BufferReader default: 64)")
    ap.add_argument("--json", default=None, help="also write the raw records here")
    args = ap.parse_args(argv)
    from tests.bench.run import machine

    started, host = time.time(), machine()  # the load average at the start is read here
    records = []
    for shards in (int(s) for s in args.shards.split(",")):
        for n in (int(c) for c in args.collectors.split(",")):
            records.append(point(n, shards, args.seconds, args.warmup, args.rows, args.writers, args.reader_batch))
            print(json.dumps(records[-1]), flush=True)
    print(table(records))
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        raw = {"date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(started)),
               "machine": dict(host, loadavg_at_end=list(os.getloadavg())),
               "command": "python -m tests.bench.bench_ingest " + " ".join(sys.argv[1:] if argv is None else argv),
               "git_commit": commit, "payload_bytes": len(chunk_payload(args.rows)), "records": records}
        Path(args.json).write_text(json.dumps(raw, indent=2) + "\n")
    return 0 if all(not r["reader_errors"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
