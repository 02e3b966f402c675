"""The run's training episodes: ``episodes.jsonl`` in the run folder and the mean return of the last 100.

Collectors send every finished training episode, batched at most once a second per task
(workers/episode_shipper.py), as the ``episodes`` field of a ``scalars`` event; the same event's
``scalars`` put ``train/episode_return`` and ``train/episode_length`` into TensorBoard. Each
episode becomes one line of ``episodes.jsonl`` (beside ``evals.jsonl``)::

    {"envstep": 1840, "return": 23.0, "length": 23, "policy_version": 112, "time": 1764700000.123, "task_id": "..."}

``envstep`` is the run's env steps at the episode's end as its collector counted them,
``time`` the coordinator's unix time at its receipt (one clock for the run, as evals.jsonl's).
A line is appended when its event is routed, before the event's ack: an event a coordinator
routed but died before acking is routed again by its successor, so a crash can repeat lines.
The window of the last 100 returns (``rqrl status``: :meth:`EpisodeLog.summary_fields`) starts
empty with each coordinator.
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import Any

from common.messages import MessageError, TrainEpisode

# Episodes the mean return of rqrl status and the progress line is over (SB3's ep_rew_mean window).
RETURN_WINDOW = 100


def parse_episodes(ev: dict[str, Any]) -> list[TrainEpisode]:
    """The training episodes of a decoded ``scalars`` event (none when it has no ``episodes`` field,
    as a learner's or an older collector's).

    Raises:
        MessageError: the field is not a JSON list of episodes, naming the task and the bad field.
    """
    raw = ev.get("episodes")
    if raw is None:
        return []
    where = f"episodes of task {ev.get('task_id', '?')}"
    try:
        items = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except ValueError as e:
        raise MessageError(f"{where}: not JSON ({e})", "episodes") from None
    if not isinstance(items, list):
        raise MessageError(f"{where}: must be a list, got {type(items).__name__}", "episodes")
    return [TrainEpisode.from_dict(item, f"{where}[{i}]") for i, item in enumerate(items)]


class EpisodeLog:
    """The training episodes of the run whose folder is ``out`` (module docstring)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.count = 0  # episodes logged by this coordinator
        self._returns: collections.deque[float] = collections.deque(maxlen=RETURN_WINDOW)

    def add(self, task_id: str, episodes: list[TrainEpisode]) -> None:
        """Append ``episodes`` (of task ``task_id``) to ``episodes.jsonl`` and to the window."""
        if not episodes:
            return
        now = round(time.time(), 3)
        with open(self.out / "episodes.jsonl", "a") as f:
            for e in episodes:
                f.write(json.dumps({"envstep": e.envstep, "return": e.ret, "length": e.length,
                                    "policy_version": e.policy_version, "time": now, "task_id": task_id}) + "\n")
        self._returns.extend(e.ret for e in episodes)
        self.count += len(episodes)

    def mean_return(self) -> float | None:
        """The mean return of the last :data:`RETURN_WINDOW` episodes (env reward units); None before the first."""
        return sum(self._returns) / len(self._returns) if self._returns else None

    def summary_fields(self) -> dict[str, Any]:
        """``train_return_mean`` (the window's mean) and ``train_episodes`` (episodes this coordinator
        logged), for the run's summary; none before the first episode."""
        mean = self.mean_return()
        return {} if mean is None else {"train_return_mean": round(mean, 3), "train_episodes": self.count}
