"""Runs: how they are named, where their folders are, and which ones Redis knows.

A run of experiment ``exp_name`` is called ``run_name`` (``{UTC time}-s{seed}`` by default, or
given); its files go to ``./{exp_name}/{run_name}/`` and its Redis keys under
``rqrl:{exp_name}/{run_name}:`` — both from :func:`common.keys.namespace`.
``./{exp_name}/latest`` is a symlink to the newest run's folder, and
``./{exp_name}/tensorboard/{run_name}`` one to each run's TensorBoard events (one TensorBoard
run per run: ``tensorboard --logdir ./{exp_name}/tensorboard``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

from common import keys


def new_run_name(seed: int, when: Optional[float] = None) -> str:
    """A run name from the UTC time (``when``, seconds since the epoch; default now) and the
    seed, e.g. ``20261130T021500Z-s1``."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if when is None else when)) + f"-s{seed}"


def reserve_run_dir(out_dir: Path, exp_name: str, seed: int, name: Optional[str] = None) -> Path:
    """Create and return a new run folder ``out_dir/exp_name/RUN`` that no other run has.

    ``name`` None: RUN = :func:`new_run_name`, with ``-2``, ``-3``, ... appended when another run
    took it first (mkdir is the arbiter, so runs started at the same second do not collide).

    Raises:
        ValueError: ``name`` is not a valid run name, or its folder exists already.
    """
    keys.namespace(exp_name, name or "")  # refuse a bad name before any folder is made
    exp_dir = out_dir / exp_name
    exp_dir.mkdir(parents=True, exist_ok=True)
    if name is not None:
        try:
            (exp_dir / name).mkdir()
        except FileExistsError:
            raise ValueError(f"run folder {exp_dir / name} exists already: choose another --name, "
                             "or continue that run with --resume") from None
        return exp_dir / name
    return reserve_free_dir(exp_dir, new_run_name(seed))


def reserve_free_dir(parent: Path, base: str) -> Path:
    """Create and return ``parent/base``, or ``base-2``, ``base-3``, ... when taken (mkdir is the
    arbiter between processes starting at the same second).

    Raises:
        ValueError: all of the first 999 names are taken.
    """
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = parent / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise ValueError(f"no free folder under {parent} for {base}")


def find_run_dir(out_dir: Path, exp_name: str, ref: str) -> Path:
    """The folder of an existing run of ``exp_name``: ``ref`` is its path (``./EXP/RUN``, or
    ``./EXP/latest``) or its name under ``out_dir/exp_name``; links are resolved.

    Raises:
        ValueError: no such folder, or it is not a run of ``exp_name`` (``out_dir/exp_name/RUN``).
    """
    exp_dir = (out_dir / exp_name).resolve()
    path = Path(ref) if Path(ref).is_dir() else out_dir / exp_name / ref
    if not path.is_dir():
        raise ValueError(f"no run folder {ref!r} (nor {out_dir / exp_name / ref})")
    path = path.resolve()
    if path.parent != exp_dir:
        raise ValueError(f"{path} is not a run of experiment {exp_name!r} (its runs are in {exp_dir}/)")
    return path


def link_latest(exp_dir: Path, run_name: str) -> None:
    """Point ``exp_dir/latest`` at ``run_name`` (a relative symlink, replaced atomically)."""
    tmp = exp_dir / f".latest.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_name, target_is_directory=True)
    os.replace(tmp, exp_dir / "latest")


def link_tensorboard(exp_dir: Path, run_name: str) -> None:
    """Make ``exp_dir/tensorboard/run_name`` a relative symlink to the run's ``tensorboard/`` folder.

    ``tensorboard --logdir ./EXP/tensorboard`` then shows each run once: TensorBoard follows
    symlinks, so pointed at ``./EXP`` it would also find every run again through ``latest``.
    """
    board = exp_dir / "tensorboard"
    board.mkdir(parents=True, exist_ok=True)
    link = board / run_name
    if not link.is_symlink():
        link.symlink_to(Path("..") / run_name / "tensorboard", target_is_directory=True)


def run_unfinished(conn: Any, ns: str) -> bool:
    """True when Redis holds the state of run ``ns`` and no stop flag (a coordinator died in it)."""
    return bool(conn.hexists(keys.commander(ns), "state") and conn.exists(keys.run(ns))
                and not conn.exists(keys.stop(ns)))


def list_runs(conn: Any, exp: Optional[str] = None) -> list[str]:
    """Run namespaces in ``rqrl:runs``, sorted; ``exp`` an experiment name keeps its runs, a
    namespace (``EXP/RUN``) keeps that run alone."""
    names = sorted(n.decode() for n in conn.smembers(keys.runs()))
    if exp is None:
        return names
    return [n for n in names if n == exp or keys.split_namespace(n)[0] == exp]


def newest_run(conn: Any, exp: str) -> Optional[str]:
    """The namespace of ``exp``'s run that started last (coordinator state ``t0``), or ``exp``
    itself when it names a run; None when Redis knows no run of it."""
    runs = list_runs(conn, exp)
    if exp in runs:
        return exp

    def started(ns: str) -> float:
        state = conn.hget(keys.commander(ns), "state")
        return float(json.loads(state)["t0"]) if state else 0.0

    return max(runs, key=started) if runs else None


def resolve_run_dir(path: Path) -> Path:
    """A run folder from ``path``: the folder itself, or an experiment folder's ``latest`` run."""
    if (path / "latest").is_dir() and not (path / "evals.jsonl").exists():
        return (path / "latest").resolve()
    return path
