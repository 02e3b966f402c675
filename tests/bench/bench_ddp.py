"""Data-parallel learner: samples/s for ``policy.learn.learner_num`` = 1 and 2 (workers/ddp.py).

    python -m tests.bench.bench_ddp [--iters 1000] [--repeats 3] [--json out.json]

Each rank runs the learner's train step as a group rank does: sample ``batch_size`` rows from
its own full replay buffer (random data with the policy's schema; 20,000 / N rows),
``LearnerGroup.agree`` (one 1-float all-reduce: does every rank go on?) and ``policy.learn``,
whose optimizer step averages the gradients over the group (one flat all-reduce). N = 1 is the
plain learner (no group). Ranks are separate processes with one torch thread each, formed
through a private Redis exactly as learner tasks are (``workers.ddp.join``); no collectors run,
so the figure is the learner's own ceiling. Samples/s = iterations/s x N x batch_size.

What bounds N = 2 is printed beside it: the share of each rank's time in the gradient
all-reduce and in the agreement, what one all-reduce costs with both ranks lined up by a
barrier, and so the share spent waiting for the other rank to arrive (two ranks on cores that
other work shares are not scheduled together).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def rank_main(argv: list[str]) -> None:
    """One rank: print a JSON line with iterations, seconds and the group's costs."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="cartpole_dqn")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--iters", type=int, required=True)
    a = ap.parse_args(argv)
    import torch

    from common import spaces
    from common.config import load_config
    from common.connection import connect
    from common.policy import create_policy
    from tests.bench.bench_learner import _fill
    from workers.ddp import join
    from workers.replay_buffer import ReplayBuffer

    torch.set_num_threads(1)
    cfg = load_config(REPO / "deploy" / "configs" / f"{a.config}.py")
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    torch.manual_seed(a.rank)
    policy = create_policy(cfg, spec, modes=("learn",), device="cpu")
    schema = policy.schema()
    rng = np.random.default_rng(a.rank)
    buf = ReplayBuffer(20_000 // a.world, schema)
    _fill(buf, schema, rng, 20_000 // a.world)
    bs = int(cfg.policy.learn.batch_size)
    group = None

    def sample() -> dict:
        return buf.sample(bs, rng)

    get = sample
    if a.world > 1:
        group = join(connect(a.url), "bench_ddp", a.group, a.rank, a.world, 60.0, torch.device("cpu"))
        group.attach(policy)
        group.broadcast_state(policy)
        agree = group.agree(sample)
        agree_s = [0.0]

        def timed() -> dict:
            t = time.perf_counter()
            batch = agree()
            agree_s[0] += time.perf_counter() - t
            return batch
        get = timed
    for _ in range(50):  # warm-up (and the first connections of the group)
        policy.learn(get())
    if group is not None:
        group.allreduce_seconds, agree_s[0] = 0.0, 0.0
    t0 = time.perf_counter()
    for _ in range(a.iters):
        policy.learn(get())
    seconds = time.perf_counter() - t0
    out = {"rank": a.rank, "iters": a.iters, "seconds": seconds}
    if group is not None:
        out.update(allreduce_seconds=group.allreduce_seconds, agree_seconds=agree_s[0])
        weights = torch.cat([p.detach().reshape(-1) for p in policy.model.parameters()])
        out["weights_checksum"] = float(weights.double().sum())
        out["params"] = weights.numel()
        # The all-reduce alone, both ranks lined up by a barrier first: its cost without waiting.
        import torch.distributed as dist

        flat, lat = torch.zeros_like(weights), []
        for _ in range(200):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(flat)
            lat.append(time.perf_counter() - t)
        out["allreduce_latency_ms"] = float(np.median(lat)) * 1e3
        out["step_ms"] = seconds / a.iters * 1e3
        group.close()
    print(json.dumps(out), flush=True)


def run_group(url: str, world: int, iters: int, config: str) -> dict:
    """Start ``world`` rank processes and combine their figures."""
    group = f"bench_{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.bench.bench_ddp", "--rank", str(r), "--world", str(world),
                               "--group", group, "--url", url, "--iters", str(iters), "--config", config],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
             for r in range(world)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"rank failed (exit {p.returncode}): {stderr[-2000:]}")
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    seconds = max(o["seconds"] for o in outs)
    res = {"iters_per_s": iters / seconds, "samples_per_s": iters * world * _batch(config) / seconds}
    if world > 1:
        if len({o["weights_checksum"] for o in outs}) != 1:
            raise RuntimeError(f"ranks ended with different weights: {[o['weights_checksum'] for o in outs]}")
        res["allreduce_share"] = float(np.mean([o["allreduce_seconds"] / o["seconds"] for o in outs]))
        res["agree_share"] = float(np.mean([o["agree_seconds"] / o["seconds"] for o in outs]))
        res["allreduce_latency_ms"] = float(np.mean([o["allreduce_latency_ms"] for o in outs]))
        res["params"] = int(outs[0].get("params", 0))
        # Time in the two collectives beyond what they cost with both ranks ready: one rank
        # waiting for the other to arrive.
        res["wait_share"] = max(0.0, res["allreduce_share"] + res["agree_share"]
                                - 2 * res["allreduce_latency_ms"] / 1e3 * res["iters_per_s"])
    return res


def _batch(config: str) -> int:
    from common.config import load_config

    return int(load_config(REPO / "deploy" / "configs" / f"{config}.py").policy.learn.batch_size)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cartpole_dqn")
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from common.embedded_redis import EmbeddedRedis

    runs: dict[str, list[dict]] = {"1": [], "2": []}
    with EmbeddedRedis() as redis_server:
        for _ in range(args.repeats):  # interleaved, so drift in machine load hits both alike
            for world in (1, 2):
                runs[str(world)].append(run_group(redis_server.url, world, args.iters, args.config))
    out: dict = {"config": args.config, "batch_size": _batch(args.config), "cpu_count": os.cpu_count(),
                 "loadavg": list(os.getloadavg())}
    for world, rs in runs.items():
        out[f"n{world}"] = {k: [round(r[k], 4 if ("share" in k or "_ms" in k) else 1) for r in rs] for k in rs[0]}
    s1 = float(np.median(out["n1"]["samples_per_s"]))
    s2 = float(np.median(out["n2"]["samples_per_s"]))
    out["speedup"] = round(s2 / s1, 3)
    print(f"learner samples/s ({args.config}, batch {out['batch_size']} per rank, {os.cpu_count()} CPU cores, "
          f"load {out['loadavg'][0]:.1f}):")
    print(f"  learner_num=1: {s1:>9.0f}   ({float(np.median(out['n1']['iters_per_s'])):.0f} it/s)")
    print(f"  learner_num=2: {s2:>9.0f}   ({float(np.median(out['n2']['iters_per_s'])):.0f} it/s, x{out['speedup']:.2f}; "
          f"gradient all-reduce {float(np.median(out['n2']['allreduce_share'])):.0%} and agreement "
          f"{float(np.median(out['n2']['agree_share'])):.0%} of each rank's time)")
    med = {k: float(np.median(v)) for k, v in out["n2"].items()}
    print(f"  bound: one all-reduce of the {int(med['params']):,} gradient floats takes {med['allreduce_latency_ms']:.2f} ms "
          f"with both ranks ready ({2 * med['allreduce_latency_ms'] / 1e3 * med['iters_per_s']:.0%} of a rank's time "
          f"for the two per iteration); a rank spends {med['wait_share']:.0%} of its time waiting in them for the "
          f"other rank, which shares {os.cpu_count()} cores with everything else (load {out['loadavg'][0]:.1f})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    if "--rank" in sys.argv:
        rank_main(sys.argv[1:])
    else:
        main()
