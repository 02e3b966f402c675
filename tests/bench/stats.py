"""Figures with their spread, and goals judged against the whole spread, for the benchmark suite."""

from __future__ import annotations

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
