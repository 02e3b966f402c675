"""Guards against training that diverged to NaN / inf: stop at the first non-finite value.

The learner runs a :class:`StepCheck` after each train iteration (loss and the other
logged scalars, then every gradient of the policy's networks), and
:func:`check_arrays` guards whatever leaves the learner: published policies, checkpoints,
``final.pt`` and the weights ``rqrl eval`` is asked to score. Every error names the train
iteration (where there is one) and the tensor, e.g. ``train iter 101: non-finite gradient
model.encoder.0.weight (12 of 128 values)``.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np


class NonFiniteError(RuntimeError):
    """A loss, gradient or weight is NaN or infinite. ``fatal``: retrying the task would not help
    (a replacement resumes from the same weights), so the coordinator ends the run with it."""

    fatal = True


def _bad_count(value: Any) -> tuple[int, int]:
    """(non-finite values, all values) of a tensor / array / scalar; (0, n) for non-float data."""
    if hasattr(value, "detach"):  # a torch tensor, without importing torch here
        if not value.is_floating_point():
            return 0, value.numel()
        return int((~value.detach().isfinite()).sum()), value.numel()
    if isinstance(value, (float, np.floating)):
        return (0 if math.isfinite(value) else 1), 1
    arr = np.asarray(value) if isinstance(value, np.ndarray) else None
    if arr is None or arr.dtype.kind not in "fc":
        return 0, 0 if arr is None else arr.size
    return int((~np.isfinite(arr)).sum()), arr.size


def _sum_is_finite(value: Any) -> bool:
    """True when one sum settles that every value is finite: NaN and inf propagate through it, so a
    finite sum does; False also for finite float32 values whose sum overflows (look closer then).
    A sum makes no boolean temporaries: a CartPole policy's arrays are checked in 27 µs against
    41 µs for an isfinite count, which publishing pays every ``send_policy_freq`` train iterations."""
    if hasattr(value, "detach"):
        return not value.is_floating_point() or bool(value.detach().sum().isfinite())
    if isinstance(value, np.ndarray):
        return value.dtype.kind not in "fc" or bool(np.isfinite(value.sum()))
    return False


def _walk(obj: Any, prefix: str) -> Iterable[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _walk(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{prefix}[{i}]")
    else:
        yield prefix, obj


def check_arrays(state: Any, what: str) -> None:
    """Check every float tensor / array / scalar in ``state`` (nested dicts and lists allowed).

    Args:
        state: e.g. a state_dict, a checkpoint dict, or published weights ``{name: float32 array}``.
        what: what ``state`` is, for the message (a Redis key, a file, ``"published policy"``).

    Raises:
        NonFiniteError: naming ``what``, the first tensor holding NaN/inf and how many values.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # the sums may overflow, or add inf and -inf
        for name, value in _walk(state, ""):
            if _sum_is_finite(value):
                continue
            bad, n = _bad_count(value)
            if bad:
                raise NonFiniteError(f"{what}: non-finite weight {name} ({bad} of {n} values are NaN or inf)")


class StepCheck:
    """The learner's check after each train iteration of ``policy``: its logged scalars, then the
    gradients of every module of ``policy`` (:meth:`common.policy.base.Policy.modules`:
    ``model``, ``target_model``, ...).

    The parameters are listed once, when the check is built: naming them every iteration was half
    of the check's cost (py-spy: 80 of 160 µs of a CartPole DQN iteration). Their gradients are read
    at each call (``zero_grad`` may replace them), so build it after the modules are final (a
    data-parallel wrapper included) and again for another policy.

    Weights are not looked at here: an optimizer step with finite gradients leaves finite weights
    finite (Adam's step is bounded by its learning rate; a target network is a copy or an average),
    so a non-finite weight shows first as a non-finite gradient, named at its iteration, and what
    leaves the learner is checked again (:func:`check_arrays`: every published policy version,
    checkpoint and ``final.pt``). Checking the weights as well cost about 16 µs more per CartPole
    or MountainCar DQN iteration (tests/bench/bench_learner_loop.py). The check is one sum per
    gradient and one sync: NaN and inf propagate through a sum, so a finite total settles it; a
    non-finite one (also what finite values give when they overflow float32) is looked at tensor
    by tensor, which finds the offender or clears the iteration.
    """

    def __init__(self, policy: Any) -> None:
        import torch

        self._params = [(f"{mk}.{pk}", p) for mk, m in policy.modules().items() for pk, p in m.named_parameters()]
        # CPU float parameters are summed by numpy, on views of the gradients: its per-call cost is
        # below torch's (CartPole DQN: 44 against 70 µs a check, after an update).
        self._numpy = all(p.device.type == "cpu" and p.dtype in (torch.float32, torch.float64) for _, p in self._params)

    def __call__(self, log_vars: Mapping[str, Any], train_iter: int) -> None:
        """Check train iteration ``train_iter``, whose logged scalars are ``log_vars``.

        Raises:
            NonFiniteError: ``train iter N: non-finite loss|gradient|weight NAME (...)``.
        """
        for k, v in log_vars.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v):
                raise NonFiniteError(f"train iter {train_iter}: non-finite {k} = {v}")
        import torch

        grads = [(n, p.grad) for n, p in self._params if p.grad is not None]
        if not grads:
            return
        with torch.no_grad():
            if self._numpy and all(g.layout == torch.strided for _, g in grads):  # not sparse gradients
                with np.errstate(over="ignore", invalid="ignore"):
                    if math.isfinite(sum(np.add.reduce(g.detach().numpy(), axis=None) for _, g in grads)):
                        return
            elif bool(torch.stack([g.sum() for _, g in grads]).sum().isfinite()):
                return
            found = next(((n, g) for n, g in grads if not bool(g.isfinite().all())), None)
            if found is None:
                return  # the sums overflowed: every value is finite
            name, g = found
            bad = int((~g.isfinite()).sum())
            raise NonFiniteError(f"train iter {train_iter}: non-finite gradient {name} ({bad} of {g.numel()} values "
                                 "are NaN or inf); lower policy.learn.learning_rate or set policy.learn.grad_clip_norm")
