"""Data-parallel learner groups: ``policy.learn.learner_num = N`` learner tasks train one policy.

The commander hands out N learner tasks with one ``group_id`` and ranks 0..N-1 (the seed's
``BaseLearner`` has ``rank`` / ``world_size`` for the same purpose). Each runs
:func:`workers.learner.run_learner_task`, which joins them into one ``torch.distributed`` group
(:func:`join`): gloo for CPU learners, nccl for CUDA ones.

Rendezvous through Redis: rank 0 opens a ``TCPStore`` on a free port of its host and pushes
``host:port world_size`` to ``rqrl:{exp}:learner_group:{group_id}`` once per other rank; the
others pop it (BLPOP, ``group_timeout`` seconds) and connect. The address is the one rank 0
uses to reach Redis (so it is reachable wherever Redis is), or ``$RQRL_LEARNER_HOST``. On
several machines gloo may also need ``GLOO_SOCKET_IFNAME`` (nccl: ``NCCL_SOCKET_IFNAME``).

The seam to the algorithm (which knows nothing of this): every ``torch.optim.Optimizer`` held
as an attribute of the policy gets a step pre-hook (:meth:`LearnerGroup.attach`) that averages
the gradients of its parameters over the group just before the update, so the policy's own
``learn`` (backward, clipping, ``optimizer.step()``) runs unchanged; gradient clipping thus
applies to each rank's gradient before averaging. The learner wraps its data source with
:meth:`LearnerGroup.agree`, so every rank trains the same iterations and all stop together
(DistributedDataParallel is not used: the policy, not the learner, owns the model and its
forward passes, and several algorithms step more than one optimizer per iteration).

What each rank does (workers/learner.py): all read their own share of the buffer stream
through consumer group ``learner`` (the stream hands each entry to one consumer), each keeps a
replay buffer of ``replay_buffer_size / N`` rows, and the start size and the replay-ratio
limiter count the env steps consumed by the whole group (the buffer's stats hash;
workers/sources/replay.py), so the group makes as many optimizer steps per env step as one learner, each on
``N * batch_size`` rows. Rank 0 alone publishes weights, saves checkpoints and reports
``learner_info``; a failed rank fails the group and the commander starts a new one that
resumes from checkpoint ``latest`` (coordinator/commander.py).
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from typing import Any, Callable, Iterator, Optional

import numpy as np
import redis
import torch
import torch.distributed as dist

from common import keys

_HOST_ENV = "RQRL_LEARNER_HOST"


class GroupError(RuntimeError):
    """A learner group could not form or lost a rank (names the group, the key and the timeout)."""


def advertised_host(conn: redis.Redis) -> str:
    """The address other ranks can reach rank 0 at: ``$RQRL_LEARNER_HOST``, else the local
    address of this host's route to Redis (127.0.0.1 for a unix-socket Redis)."""
    if os.environ.get(_HOST_ENV):
        return os.environ[_HOST_ENV]
    kw = conn.connection_pool.connection_kwargs
    host, port = kw.get("host"), int(kw.get("port") or 6379)
    if not host:
        return "127.0.0.1"
    try:  # a UDP connect sends nothing; it only picks the route and so the local address
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), port))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a nested state dict, in a fixed order (dict insertion order)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


class LearnerGroup:
    """One rank's membership of a learner group (see module docstring); use :func:`join`.

    Attributes:
        group_id, rank, world_size: as in the task.
        backend: ``gloo`` or ``nccl``.
        allreduce_seconds: wall time spent averaging gradients (seconds, summed).
    """

    def __init__(self, group_id: str, rank: int, world_size: int, backend: str, device: torch.device) -> None:
        self.group_id, self.rank, self.world_size, self.backend = group_id, rank, world_size, backend
        self._device = device
        self.allreduce_seconds = 0.0
        self._handles: list[Any] = []

    def attach(self, policy: Any) -> int:
        """Average gradients over the group before every step of the policy's optimizers.

        Returns:
            The number of optimizers hooked.

        Raises:
            GroupError: the policy holds no optimizer (nothing would keep the ranks in step).
        """
        optimizers = policy.optimizers()
        if not optimizers:
            raise GroupError(f"learner group {self.group_id}: the policy {type(policy).__name__} has no "
                             "torch.optim.Optimizer (Policy.optimizers), so its gradients cannot be averaged")
        for opt in optimizers:
            self._handles.append(opt.register_step_pre_hook(self._average_grads))
        return len(optimizers)

    def _average_grads(self, optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        # One flat all-reduce per optimizer step. Which parameters have gradients follows from
        # the same code on the same batch layout, so it is the same set on every rank.
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return
        t0 = time.perf_counter()
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.world_size
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n
        self.allreduce_seconds += time.perf_counter() - t0

    def broadcast_state(self, policy: Any) -> None:
        """Make every rank's policy state (weights, target networks, optimizer state) rank 0's.

        Every tensor of ``policy.state_dict()`` is broadcast from rank 0, then the state is
        loaded back (``load_state_dict``), which also covers tensors the policy hands out as
        copies. The structure is the same on every rank (same code; a resumed group loads one
        checkpoint), and so are its plain numbers.
        """
        state = policy.state_dict()
        for t in _tensors(state):
            if t.device != self._device and self.backend == "nccl":
                raise GroupError(f"learner group {self.group_id}: a policy tensor lives on {t.device}, not {self._device}")
            dist.broadcast(t, src=0)
        policy.load_state_dict(state)

    def agree(self, get_batch: Callable[[], Optional[dict[str, np.ndarray]]]) -> Callable[[], Optional[dict[str, np.ndarray]]]:
        """Wrap a data source: a rank's batch, or None for every rank once any rank got None
        (the stop flag), so all ranks train the same iterations and leave the loop together."""
        def get_data() -> Optional[dict[str, np.ndarray]]:
            batch = get_batch()
            flag = torch.tensor([0.0 if batch is not None else 1.0], device=self._device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            return batch if flag.item() == 0.0 else None
        return get_data

    def close(self) -> None:
        """Remove the optimizer hooks and leave the process group."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if dist.is_initialized():
            dist.destroy_process_group()


def join(conn: redis.Redis, exp: str, group_id: str, rank: int, world_size: int, timeout_s: float,
         device: torch.device) -> LearnerGroup:
    """Form (rank 0) or join (the others) learner group ``group_id``; see the module docstring.

    Raises:
        GroupError: rank 0's address did not appear within ``timeout_s`` seconds, it was
            published for another world size, or not every rank joined in time (each names the
            group, the Redis key and what to check).
    """
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(device)
    key = keys.learner_group(exp, group_id)
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        host = advertised_host(conn)
        # Port 0: the OS picks a free port, and the store reports it; no race with other programs.
        store = dist.TCPStore(host, 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        address = f"{host}:{store.port} {world_size}"
        pipe = conn.pipeline(transaction=True)
        pipe.delete(key)
        pipe.rpush(key, *[address] * (world_size - 1))
        pipe.expire(key, max(1, int(timeout_s)))
        pipe.execute()
    else:
        got = conn.blpop([key], timeout=timeout_s)
        if got is None:
            raise GroupError(f"learner group {group_id} rank {rank}: rank 0 published no address on {key} within "
                             f"{timeout_s:g} s (policy.learn.learner.group_timeout); is rank 0's task running?")
        address = got[1].decode()
        hostport, _, size = address.partition(" ")
        if int(size) != world_size:
            raise GroupError(f"learner group {group_id} rank {rank}: rank 0 formed a group of {size} ranks on {key}, "
                             f"this task expects {world_size}")
        host, _, port = hostport.rpartition(":")
        try:
            store = dist.TCPStore(host, int(port), world_size, is_master=False, timeout=timeout)
        except Exception as e:
            raise GroupError(f"learner group {group_id} rank {rank}: cannot reach rank 0's store at {hostport} "
                             f"(from {key}): {e}") from None
    try:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    except Exception as e:
        raise GroupError(f"learner group {group_id} rank {rank}: not all {world_size} ranks joined within "
                         f"{timeout_s:g} s (policy.learn.learner.group_timeout; start policy.learn.learner_num "
                         f"`rq worker learner` processes): {type(e).__name__}: {e}") from None
    return LearnerGroup(group_id, rank, world_size, backend, device)
