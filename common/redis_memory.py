"""What rqrl requires of Redis's memory settings, and what a full Redis means for a run.

rqrl keeps step data, streams, weights, leases and RQ's queues in Redis. A Redis that *evicts*
(any ``maxmemory-policy`` but ``noeviction``) drops some of them silently: a heartbeat key reads
as a dead task, a chunk as lost data, a job as never run. So a run refuses to start on such a
Redis unless the user overrides (``--allow-eviction``), and warns when ``maxmemory`` leaves less
room than the run's estimated footprint. At run time a ``noeviction`` Redis that is full answers
writes with ``OOM``: the coordinator then stops the run with :func:`oom_reason`.

Only ``INFO memory`` is read (allowed to rqrl's ACL user; ``CONFIG`` usually is not).
"""

from __future__ import annotations

import math
from typing import Any

import redis

from common import streams

# Per-entry sizes of the capped streams, as Redis stores them (listpack, measured ~120-220 B).
_EVENT_BYTES = 250
_META_BYTES = 200
_RQ_BYTES = 8 * 1024 * 1024  # queues, job hashes (task dict + config) kept for result_ttl, workers


class RedisNotSuitable(RuntimeError):
    """Redis's memory settings would lose rqrl's data (names the setting and the fix)."""


def memory_info(conn: redis.Redis) -> dict[str, Any]:
    """``{"used": bytes, "max": bytes (0 = no limit), "policy": str}`` from ``INFO memory``."""
    info = conn.info("memory")
    return {"used": int(info.get("used_memory", 0)), "max": int(info.get("maxmemory", 0)),
            "policy": str(info.get("maxmemory_policy", "unknown"))}


def redis_full(e: BaseException) -> bool:
    """Whether ``e`` is a full ``noeviction`` Redis refusing a write: an ``OOM`` reply
    (``redis.OutOfMemoryError``), or a MULTI/EXEC aborted because a command in it got one (Redis 7
    checks memory at EXEC and answers ``EXECABORT ... OOM``: ``redis.exceptions.ExecAbortError``)."""
    return isinstance(e, redis.OutOfMemoryError) or (isinstance(e, redis.exceptions.ExecAbortError) and "OOM" in str(e))


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f} MB"


def model_sizes(cfg: Any) -> tuple[int, int]:
    """``(parameters, bytes per step-data row)`` of ``cfg``'s model, roughly (upper estimates)."""
    model = cfg.get("policy", {}).get("model", {})
    shape = model.get("obs_shape", 4) or 4
    # An image's shape is a list: its pixels as MLP inputs overstate the conv net, an upper estimate.
    image = isinstance(shape, (list, tuple)) and len(shape) >= 2
    obs = int(math.prod(shape)) if isinstance(shape, (list, tuple)) else int(shape)
    act = int(model.get("action_shape", 2) or 2)
    dims = [obs, *[int(h) for h in model.get("hidden_size_list", [128, 128])]]
    params = sum(a * b + b for a, b in zip(dims, dims[1:])) + 2 * (dims[-1] * act + act)
    row = 2 * obs * (1 if image else 4) + 24  # obs, next_obs (uint8 images, else float32) + action, reward, done, discount
    return params, row


def estimate_footprint(cfg: Any, collectors: int = 2) -> int:
    """Bytes a run of ``cfg`` may hold in Redis at once (a rough upper estimate).

    Capped streams (events and the buffer's metadata, :data:`common.streams.DEFAULT_MAXLEN`
    entries each), the published policy and three checkpoints (model, target, Adam moments), the
    three eval bundles kept (best, under confirmation, converged: coordinator/bundles.py), step
    data in flight (``max_env_step_lead`` plus a chunk per collector) and RQ's job records.
    """
    params, row = model_sizes(cfg)
    policy = cfg.get("policy", {})
    # policy, latest + final checkpoints (4 tensors/param each), final_model, 3 eval bundles
    weights = 4 * params * (1 + 2 * 4 + 1 + 3)
    lead = int(policy.get("learn", {}).get("max_env_step_lead", 256) or 256)
    n_sample = int(policy.get("collect", {}).get("n_sample", 128) or 128)
    in_flight = (lead + 2 * n_sample * (collectors + 1)) * row
    return int(streams.DEFAULT_MAXLEN * (_EVENT_BYTES + _META_BYTES) + weights + in_flight + _RQ_BYTES)


def check_memory_settings(conn: redis.Redis, cfg: Any, allow_eviction: bool = False, collectors: int = 2) -> list[str]:
    """Check ``maxmemory-policy`` and ``maxmemory`` before a run.

    Returns:
        Warnings to print (an eviction policy allowed by ``allow_eviction``).

    Raises:
        RedisNotSuitable: the policy can evict rqrl's keys and ``allow_eviction`` is false,
            or ``maxmemory`` leaves less room than the run's estimated footprint (both figures named).
    """
    try:
        mem = memory_info(conn)
    except redis.ResponseError as e:  # INFO refused by an ACL
        return [f"cannot read Redis's memory settings (INFO memory: {e}); rqrl requires maxmemory-policy noeviction"]
    out = []
    if mem["policy"] != "noeviction":
        msg = (f"Redis maxmemory-policy is {mem['policy']!r}: it can evict rqrl's keys (step data, heartbeats, "
               "leases, RQ jobs) and lose data silently. Set 'maxmemory-policy noeviction' (redis.conf or "
               "CONFIG SET), or pass --allow-eviction to run anyway")
        if not allow_eviction:
            raise RedisNotSuitable(msg)
        out.append(msg.split(". Set")[0] + " (allowed by --allow-eviction)")
    need = estimate_footprint(cfg, collectors)
    if mem["max"] and mem["max"] - mem["used"] < need:
        # Started on a Redis without the room, every worker would meet OOM replies at once.
        raise RedisNotSuitable(
            f"Redis maxmemory {_mb(mem['max'])} leaves {_mb(max(0, mem['max'] - mem['used']))} free (used "
            f"{_mb(mem['used'])}); this run needs ~{_mb(need)} (capped streams, weights, checkpoints, eval bundles, "
            "step data in flight): raise maxmemory, or free memory in Redis")
    return out


def oom_reason(conn: redis.Redis) -> str:
    """``Redis out of memory (used X MB / maxmemory Y MB)``: the reason a run stopped on an OOM reply."""
    try:
        mem = memory_info(conn)
        return f"Redis out of memory (used {_mb(mem['used'])} / maxmemory {_mb(mem['max'])})"
    except redis.RedisError:
        return "Redis out of memory (used/max unknown: INFO failed)"
