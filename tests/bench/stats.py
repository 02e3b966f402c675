"""Figures with their spread, and goals judged against the whole spread, for the benchmark suite."""

from __future__ import annotations

import math
import operator
import statistics
from typing import Any, Callable, Optional


def spread(values: list[float], digits: int = 3) -> dict[str, Any]:
    """``{"min", "median", "max", "n", "values"}`` of the repeats (``values`` kept as measured)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"min": None, "median": None, "max": None, "n": 0, "values": []}
    return {"min": round(min(vals), digits), "median": round(statistics.median(vals), digits),
            "max": round(max(vals), digits), "n": len(vals), "values": [round(v, digits) for v in vals]}


def repeat(fn: Callable[[], float], repeats: int, digits: int = 3) -> dict[str, Any]:
    """Run ``fn`` ``repeats`` times; its results as :func:`spread`."""
    return spread([fn() for _ in range(repeats)], digits)


_OPS = {"<=": operator.le, ">=": operator.ge}


def verdict(fig: Optional[dict[str, Any]], goal: str) -> str:
    """"met" / "not met" when every repeat is on one side of ``goal`` (e.g. ``">= 0.8"``), else
    "spread crosses the goal"; "no figure" when nothing was measured."""
    if not fig or fig.get("median") is None:
        return "no figure"
    if not goal:  # a figure reported without a goal
        return "-"
    op_name, target = goal.split()
    ok = [_OPS[op_name](v, float(target)) for v in fig["values"]]
    if all(ok):
        return "met"
    if not any(ok):
        return "not met"
    return "spread crosses the goal"


def fmt(fig: Optional[dict[str, Any]], unit: str = "") -> str:
    """``median (min–max, n=N)`` for a table cell; a single repeat shows just the value."""
    if not fig or fig.get("median") is None:
        return "-"
    u = unit if unit == "×" else f" {unit}" if unit else ""
    if fig["n"] == 1:
        return f"{fig['median']:g}{u} (n=1)"
    return f"{fig['median']:g}{u} ({fig['min']:g}–{fig['max']:g}, n={fig['n']})"


EXACT_SPLITS = 1_000_000  # beyond this many splits the rank test takes the normal approximation


def rank_test_p(a: list[float], b: list[float]) -> Optional[float]:
    """Two-sided p-value of the Mann-Whitney U test of ``a`` against ``b`` (U counts a tie as half):
    twice the smaller one-sided p, each the share of all ways to split the pooled values into
    groups of ``len(a)`` and ``len(b)`` whose U is at least / at most the observed one (exact:
    scipy's ``permutation_test`` enumerates the splits; capped at 1). With equal group sizes U's
    distribution is symmetric and this is the share of splits at least as far from its mean. With
    5 values a side the smallest p is 2/252 = 0.0079. Past :data:`EXACT_SPLITS` splits (from 12
    values a side: 2.7e6; 20 a side: 1.4e11) enumerating is out of reach, and scipy's
    ``mannwhitneyu`` gives the normal approximation instead, with its tie and continuity
    corrections. None when a side has fewer than 2 values.
    """
    if min(len(a), len(b)) < 2:
        return None
    from scipy import stats  # here: the benchmarks that only time things need no scipy

    if math.comb(len(a) + len(b), len(a)) > EXACT_SPLITS:
        return float(stats.mannwhitneyu(list(a), list(b), alternative="two-sided", method="asymptotic").pvalue)

    def u(x: Any, y: Any, axis: int = -1) -> Any:
        return stats.mannwhitneyu(x, y, axis=axis, method="asymptotic").statistic

    return float(stats.permutation_test((list(a), list(b)), u, permutation_type="independent", vectorized=True,
                                        alternative="two-sided", n_resamples=float("inf")).pvalue)
