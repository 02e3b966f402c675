"""The closing block: why a run stopped and its figures, rendered from its summary.json.

The coordinator prints it after writing summary.json; ``rqrl train`` prints it again from the
same file (with its own exit phase), so the two never disagree and nobody reads log text.
"""

from __future__ import annotations

from typing import Any

from common import phases


def _fmt(value: Any) -> str:
    """An eval figure: 2 decimals, or ``-`` (no eval, or one that finished no episode)."""
    return f"{value:.2f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def render(summary: dict[str, Any]) -> str:
    """The closing lines of a run from its summary (summary.json's fields: ``exp_name``,
    ``run_name``, ``status``, ``wall_seconds``, ``envstep``, ``train_iter``,
    ``last_eval_reward_mean``, ``stop_value``, ``final_pt``, ``final_policy_version``,
    ``final_eval_task``, ``final_eval``, ``curve_png`` and ``phases``)."""
    final = summary.get("final_pt") or ""
    last_eval = summary.get("final_eval") or {}
    closing_note = f", the closing eval at {last_eval.get('envstep')} env steps" if last_eval.get("closing") else ""
    final_note = ""
    if final:
        final_note = (f" (policy version {summary.get('final_policy_version')}"
                      + (", the weights the converging eval played)" if summary.get("final_eval_task") else ")"))
    return "\n".join([
        f"rqrl {summary['exp_name']}/{summary['run_name']}: {summary['status']}",
        f"  wall time      {float(summary['wall_seconds']):.1f} s",
        f"  env steps      {summary['envstep']}",
        f"  train iters    {summary['train_iter']}",
        f"  last eval      {_fmt(summary.get('last_eval_reward_mean'))} (stop_value {summary.get('stop_value')}"
        f"{closing_note})",
        f"  final policy   {final or 'not saved'}" + final_note,
        f"  curve          {summary.get('curve_png') or 'no evaluations'}",
        f"  phases         {phases.render(summary.get('phases') or {})}",
    ])
