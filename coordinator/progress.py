"""The live progress line of ``rqrl train`` (and the rates and time left of ``rqrl status``).

One line: env steps, train iterations, the last eval reward against ``stop_value``, the run's
wall seconds, the mean return of the last 100 training episodes (collectors send each as it
finishes: workers/episode_shipper.py; ``-`` before the first), the policy lag of the data the
learner takes in (mean / p95 in versions over its last chunks, from its reports; absent before
the first and in the closing line), the rates (env steps/s, train
iterations/s) and the time left against whichever budget binds first (``commander.max_env_step``,
``max_train_iter``, ``max_wall_seconds``: the one that, at the current rates, runs out soonest).
On a terminal rich draws it in place with a bar of that budget; without one (a pipe, a log file,
CI) it is a plain line every 5 s.

While the run goes the rates are over the last :data:`RATE_WINDOW_S` seconds of the learner's
reports (``learner_info`` events: the learner's count of env steps received and its train
iteration, with the reporting time); the closing line takes summary.json's figures, and its
rates are the run's averages, ``envstep / wall_seconds`` and ``train_iter / wall_seconds``.
"""

from __future__ import annotations

import collections
import sys
import time
from typing import Any, Optional, TextIO

from common import events
from common.messages import MessageError
from coordinator.episode_log import RETURN_WINDOW, parse_episodes

# Seconds of learner reports the live rates are taken over (a window: recent speed, not the
# run's average, which the warm-up drags down).
RATE_WINDOW_S = 30.0
# The budgets a run can give up at (config keys under ``commander``; 0 = no limit).
BUDGETS = ("max_env_step", "max_train_iter", "max_wall_seconds")


def budgets_of(cfg: Any) -> dict[str, float]:
    """The config's non-zero give-up limits, by their ``commander`` key."""
    return {k: float(cfg.commander.get(k) or 0) for k in BUDGETS if float(cfg.commander.get(k) or 0) > 0}


def duration(seconds: float) -> str:
    """``3725`` -> ``1h02m``, ``125`` -> ``2m05s``, ``42.4`` -> ``42s``."""
    s = int(round(max(0.0, seconds)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def time_left(budgets: dict[str, float], envstep: float, train_iter: float, wall_seconds: float,
              env_steps_per_s: float, train_iter_per_s: float) -> Optional[tuple[str, float, float]]:
    """The budget that binds first: ``(key, seconds left, fraction used)``, or None without a
    budget (or without the rate one needs: no estimate before the first reports).

    Env-step and train-iteration budgets are converted to seconds at the given rates; the
    wall-clock budget counts itself.
    """
    found: list[tuple[float, str, float]] = []
    for key, limit in budgets.items():
        if key == "max_wall_seconds":
            found.append((limit - wall_seconds, key, wall_seconds / limit))
            continue
        done, rate = (envstep, env_steps_per_s) if key == "max_env_step" else (train_iter, train_iter_per_s)
        if rate > 0:
            found.append(((limit - done) / rate, key, done / limit))
    if not found:
        return None
    left, key, used = min(found)
    return key, max(0.0, left), min(1.0, max(0.0, used))


def rates_text(env_steps_per_s: float, train_iter_per_s: float) -> str:
    """``1,234 env steps/s, 56.7 train iter/s`` (the form summary figures are checked against)."""
    return f"{env_steps_per_s:,.0f} env steps/s, {train_iter_per_s:,.1f} train iter/s"


def left_text(budgets: dict[str, float], left: Optional[tuple[str, float, float]]) -> str:
    """``~2m10s left (max_env_step 100,000)``, or what stops the run when no budget is set."""
    if left is None:
        return "no budget: runs to stop_value" if not budgets else "time left: -"
    key, seconds, _ = left
    return f"~{duration(seconds)} left ({key} {budgets[key]:,.0f})"


class Progress:
    """The progress line of one run (module docstring).

    Args:
        stop_value: the config's ``env.stop_value``.
        t0: unix seconds where the run's clock starts (the launch, less a resumed run's earlier
            wall seconds: the coordinator's clock, so the line and summary.json agree); default now.
        resume: a resumed run's ``resume.json`` (coordinator/daemon.py): the line starts at its
            env steps, train iteration and last eval instead of 0.
        budgets: the give-up limits (:func:`budgets_of`); none: no time left is shown.
        stream: where the line goes (default stderr); a terminal gets rich's live line.
    """

    def __init__(self, stop_value: float, t0: Optional[float] = None, resume: Optional[dict[str, Any]] = None,
                 budgets: Optional[dict[str, float]] = None, stream: Optional[TextIO] = None) -> None:
        self.stop_value = stop_value
        self.envstep = 0
        self.train_iter = 0
        self.eval: Optional[float] = None
        self._returns: collections.deque[float] = collections.deque(maxlen=RETURN_WINDOW)
        self.train_return: Optional[float] = None  # the mean of _returns (summary.json's at the end)
        self.policy_lag: Optional[tuple[float, float]] = None  # (mean, p95) of the learner's last report
        self.t0 = time.time() if t0 is None else t0
        self.budgets = dict(budgets or {})
        if resume:
            state = resume.get("commander") or {}
            self.envstep = max(int(state.get("total_collector_env_step") or 0), int(resume.get("consumed_env_steps") or 0))
            self.train_iter = int(resume.get("ckpt_train_iter") or 0)
            evals = state.get("evaluator_info") or []
            self.eval = events.episode_figure(evals[-1], "reward_mean") if evals else None
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self._last_print = 0.0
        # (report time, env steps, train iter) of the learner's reports within the rate window
        self._reports: collections.deque[tuple[float, int, int]] = collections.deque()
        self._final: Optional[dict[str, float]] = None  # summary.json's wall seconds and average rates
        self._live: Any = None  # rich's Progress, on a terminal, once shown

    def update(self, ev: dict[str, Any]) -> None:
        if ev.get("type") == "learner_info":
            self.envstep = max(self.envstep, events.consumed_env_steps(ev))
            self.train_iter = max(self.train_iter, int(ev.get("train_iter", 0)))
            ts = float(ev.get("ts", time.time()))
            self._reports.append((ts, self.envstep, self.train_iter))
            mean, p95 = events.figure(ev, "policy_lag_mean"), events.figure(ev, "policy_lag_p95")
            if mean is not None and p95 is not None:
                self.policy_lag = (mean, p95)
            while len(self._reports) > 2 and ts - self._reports[0][0] > RATE_WINDOW_S:
                self._reports.popleft()
        elif ev.get("type") == "finished" and ev.get("eval_flag") is True:
            self.eval = events.episode_figure(ev, "reward_mean")  # None ("-"): the eval finished no episode
        elif ev.get("type") == "scalars" and "episodes" in ev:
            try:
                self._returns.extend(e.ret for e in parse_episodes(ev))
            except MessageError:
                return  # the coordinator logs a bad event; the line goes on without it
            if self._returns:
                self.train_return = sum(self._returns) / len(self._returns)

    def from_summary(self, summary: dict[str, Any]) -> None:
        """Take the run's final figures (summary.json) for the closing line: its env steps, train
        iterations, last eval, wall seconds, and its average rates over the whole run."""
        self.envstep = int(summary.get("envstep") or self.envstep)
        self.train_iter = int(summary.get("train_iter") or self.train_iter)
        if "last_eval_reward_mean" in summary:
            self.eval = events.figure(summary, "last_eval_reward_mean")
        if "train_return_mean" in summary:
            self.train_return = events.figure(summary, "train_return_mean")
        wall = float(summary.get("wall_seconds") or 0.0)
        if wall > 0:
            self._final = {"wall": wall, "env": self.envstep / wall, "iter": self.train_iter / wall}

    def seconds(self) -> float:
        return self._final["wall"] if self._final else time.time() - self.t0

    def rates(self) -> tuple[float, float]:
        """(env steps/s, train iterations/s): over the rate window while the run goes, the run's
        averages once summary.json is in."""
        if self._final:
            return self._final["env"], self._final["iter"]
        if len(self._reports) < 2:
            return 0.0, 0.0
        (t_a, e_a, i_a), (t_b, e_b, i_b) = self._reports[0], self._reports[-1]
        dt = max(1e-6, t_b - t_a)
        return (e_b - e_a) / dt, (i_b - i_a) / dt

    def left(self) -> Optional[tuple[str, float, float]]:
        env_rate, iter_rate = self.rates()
        return time_left(self.budgets, self.envstep, self.train_iter, self.seconds(), env_rate, iter_rate)

    def figures(self) -> str:
        ev = "-" if self.eval is None else f"{self.eval:.1f}"
        return (f"env steps {self.envstep:>8,} | train iter {self.train_iter:>7,} | "
                f"eval {ev:>6} / {self.stop_value:g} | {self.seconds():6.1f} s")

    def return_text(self) -> str:
        """``return  187.3``: the mean return of the last 100 training episodes (``-`` before the
        first); then ``| lag 3.2/8`` (the policy lag's mean / p95 in versions) while the run goes."""
        text = f"return {'-' if self.train_return is None else f'{self.train_return:.1f}':>6}"
        if self.policy_lag is None or self._final:
            return text
        return f"{text} | lag {self.policy_lag[0]:.1f}/{self.policy_lag[1]:.0f}"

    def tail(self) -> str:
        """Rates and time left (the final line: averages, and no time left)."""
        env_rate, iter_rate = self.rates()
        if self._final:
            return f"avg {rates_text(env_rate, iter_rate)}"
        return f"{rates_text(env_rate, iter_rate)} | {left_text(self.budgets, self.left())}"

    def line(self) -> str:
        return f"{self.figures()} | {self.return_text()} | {self.tail()}"

    def show(self, final: bool = False) -> None:
        """Draw the line: on a terminal in place (rich), else as a plain line every 5 s and at the end."""
        if not self.tty:
            now = time.time()
            if final or now - self._last_print >= 5.0:
                print(self.line(), file=self.stream, flush=True)
                self._last_print = now
            return
        if self._live is None:
            self._live = _live(self.stream)
        self._live.update(self._renderable(), refresh=True)
        if final:
            self.close()

    def _renderable(self) -> Any:
        """The figures, a bar of the binding budget (pulsing without one; full at the end), the
        rates and time left: one line where the terminal is wide enough, else two (without the
        bar where even that is too narrow), so no figure is cut off."""
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        left = self.left()
        if self._final:
            bar = ProgressBar(total=1.0, completed=1.0, width=12)
        elif self.budgets:
            bar = ProgressBar(total=1.0, completed=left[2] if left else 0.0, width=12)
        else:
            bar = ProgressBar(total=None, width=12)
        figures, tail = f"{self.figures()} | {self.return_text()}", self.tail()
        width = self._live.console.width
        row = Table.grid(padding=(0, 1))
        if width >= len(figures) + len(tail) + 16:
            row.add_row(Text(figures), bar, Text(tail))
            return row
        # The training return goes on a line of its own where it would make the figures wrap.
        lines = [Text(figures)] if width >= len(figures) else [Text(self.figures()), Text(self.return_text())]
        if width >= len(tail) + 13:
            row.add_row(bar, Text(tail))
            return Group(*lines, row)
        return Group(*lines, Text(tail))  # a narrow terminal: the figures, not the bar

    def close(self) -> None:
        """Stop the live line (it stays on screen; the cursor is shown again). Safe to call twice."""
        if self._live is not None:
            self._live.stop()
            self._live = None


def _live(stream: TextIO) -> Any:
    """rich's Live display on ``stream`` (a terminal), refreshed by :meth:`Progress.show` (no
    thread of its own); it leaves ``sys.stdout`` / ``sys.stderr`` alone, as the launcher forks
    children while it is live."""
    from rich.console import Console
    from rich.live import Live

    live = Live(console=Console(file=stream, highlight=False), auto_refresh=False, redirect_stdout=False,
                redirect_stderr=False, transient=False)
    live.start()
    return live
