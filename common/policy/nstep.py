"""n-step transition rows for replay algorithms (DQN, SAC), built on the collector.

Rows (``B`` rows; ``action`` keeps the dtype and shape the policy recorded)::

    obs       (B, *O)   observation at t
    action    (B, ...)  action at t, as recorded by ``policy.act`` (an index, or a Box action)
    reward    float32 (B,)  r_t + g r_{t+1} + ... + g^{k-1} r_{t+k-1}
    next_obs  (B, *O)   observation at t+k (the bootstrap state)
    done      bool (B,)     an episode *terminated* within those k steps (truncation is not terminal)
    discount  float32 (B,)  g^k (k <= nstep is shorter at episode ends)
"""

from __future__ import annotations

from collections import deque
from typing import Optional

import numpy as np


class NStepAdder:
    """Per-env step streams -> n-step rows (module docstring).

    ``add`` returns the oldest pending step of each env that has ``nstep`` pending, or all of
    an env's pending steps when its episode ends; ``terminated`` marks ``done``, ``truncated``
    only flushes (the row bootstraps from the final observation).
    """

    def __init__(self, env_num: int, nstep: int, gamma: float) -> None:
        self.nstep = nstep
        self.gamma = gamma
        self._pending: list[deque] = [deque() for _ in range(env_num)]

    def add(self, obs: np.ndarray, record: dict[str, np.ndarray], reward: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, truncated: np.ndarray) -> Optional[dict[str, np.ndarray]]:
        rows: list[tuple] = []
        action = record["action"]
        for i, pending in enumerate(self._pending):
            pending.append((obs[i], action[i], float(reward[i])))
            if terminated[i] or truncated[i]:
                while pending:
                    rows.append(self._emit(pending, next_obs[i], bool(terminated[i])))
            elif len(pending) == self.nstep:
                rows.append(self._emit(pending, next_obs[i], False))
        return self._stack(rows)

    def flush(self, obs: np.ndarray) -> Optional[dict[str, np.ndarray]]:
        rows: list[tuple] = []
        for i, pending in enumerate(self._pending):
            while pending:
                rows.append(self._emit(pending, obs[i], False))
        return self._stack(rows)

    def _emit(self, pending: deque, bootstrap_obs: np.ndarray, done: bool) -> tuple:
        ret = 0.0
        for k, (_, _, r) in enumerate(pending):
            ret += (self.gamma ** k) * r
        o, a, _ = pending.popleft()
        return (o, a, ret, bootstrap_obs, done, self.gamma ** (len(pending) + 1))

    @staticmethod
    def _stack(rows: list[tuple]) -> Optional[dict[str, np.ndarray]]:
        if not rows:
            return None
        cols = list(zip(*rows))
        return {"obs": np.stack(cols[0]), "action": np.stack(cols[1]), "reward": np.asarray(cols[2], np.float32),
                "next_obs": np.stack(cols[3]), "done": np.asarray(cols[4], np.bool_),
                "discount": np.asarray(cols[5], np.float32)}
