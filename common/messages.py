"""What crosses process boundaries as JSON, one dataclass each: the collector task and the learner
task (commander -> worker, through RQ), a collector's and a learner's finish info (worker ->
coordinator, a ``finished`` event on ``rqrl:{ns}:events``), chunk metadata (collector -> learner,
the chunk's entry on its buffer's stream), the eval record (``rqrl:{ns}:evals``, ``evals.jsonl``) and
a finished training episode (collector -> coordinator, ``episodes.jsonl``).

Each has ``from_dict(d)``, which checks every field it knows and raises :class:`MessageError`
naming the message and the field (a dataclass built directly, as a commander builds its tasks,
is not checked: ``from_dict`` is the gate at the receiving end), and ``to_dict()``, the wire
form: exactly the keys a worker or coordinator of the previous version writes and reads, so the
two interoperate. Optional fields left at their default are left out of the wire form. Tasks refuse unknown fields (a task is a
command: a field nobody reads is a mistake); the messages workers send keep them in ``extra``
and write them back (a newer worker's figures pass through an older reader unharmed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Optional

from common import keys

_MAX_ID_LEN = 200
_INT64 = 2**63
_INT64_SHOWN = "2**63"


class MessageError(ValueError):
    """A message that does not check, naming the message and the bad field (:attr:`field`, "" when
    the message as a whole is wrong: not a dict, missing keys, unknown fields)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class _Check:
    """Field checks on dict ``d`` of the message named ``where`` (e.g. ``task t1``): each returns
    the value, None for an absent optional field, or raises MessageError naming the field."""

    def __init__(self, d: dict[str, Any], where: str) -> None:
        self.d, self.where = d, where

    def bad(self, name: str, why: str) -> MessageError:
        return MessageError(f"{self.where}: field {name!r} = {self.d.get(name)!r:.80} {why}", name)

    def key_part(self, name: str, required: bool = True) -> Optional[str]:
        """A string usable as one component of a Redis key (:func:`common.keys._check`)."""
        if name not in self.d and not required:
            return None
        v = self.d[name]
        if not isinstance(v, str):
            raise self.bad(name, f"is {type(v).__name__}, must be a string")
        try:
            keys._check(name, v)
        except ValueError:
            raise self.bad(name, "is empty or contains ':', space or glob characters") from None
        if len(v) > _MAX_ID_LEN:
            raise self.bad(name, f"is longer than {_MAX_ID_LEN} characters")
        return v

    def string(self, name: str) -> Optional[str]:
        if name in self.d and not isinstance(self.d[name], str):
            raise self.bad(name, "must be a string")
        return self.d.get(name)

    def boolean(self, name: str) -> Optional[bool]:
        if name in self.d and not isinstance(self.d[name], bool):
            raise self.bad(name, f"is {type(self.d[name]).__name__}, must be true or false")
        return self.d.get(name)

    def integer(self, name: str, lo: int = 0, hi: int = _INT64, shown: str = "") -> Optional[int]:
        """An int in [lo, hi) (not a bool); ``shown`` says the range in the error instead."""
        if name in self.d and not (_is_int(self.d[name]) and lo <= self.d[name] < hi):
            raise self.bad(name, f"must be an integer in {shown or f'[{lo}, {_INT64_SHOWN if hi == _INT64 else hi})'}")
        return self.d.get(name)

    def real(self, name: str) -> Optional[float]:
        """A finite number (a NaN or infinite figure reads as absent: :func:`common.events.figure`)."""
        v = self.d.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.bad(name, "must be a number")
        return float(v) if math.isfinite(v) else None

    def dict_(self, name: str) -> dict[str, Any]:
        v = self.d[name]
        if not isinstance(v, dict):
            raise self.bad(name, f"is {type(v).__name__}, must be a dict")
        return v


def _start(d: Any, kind: str, required: tuple[str, ...], optional: tuple[str, ...]) -> _Check:
    """The checks every task gets first: a dict, of this kind, with its required fields and no other."""
    if not isinstance(d, dict):
        raise MessageError(f"{kind} task must be a dict, got {type(d).__name__}")
    tid = d.get("task_id", "<no task_id>")
    where = f"task {tid if isinstance(tid, str) else repr(tid)}"
    if d.get("task_type", kind) != kind:
        raise MessageError(f"{where}: task_type {d.get('task_type')!r} is not {kind!r}", "task_type")
    missing = [k for k in required if k not in d]
    if missing:
        raise MessageError(f"{where}: missing keys {missing}")
    unknown = sorted(map(str, set(d) - set(required) - set(optional) - {"task_type"}))
    if unknown:
        raise MessageError(f"{where}: unknown fields {unknown} for a {kind} task")
    return _Check(d, where)


def _task_ids(c: _Check) -> dict[str, Any]:
    """The identity fields both tasks share: ids, the run's name (a valid namespace) and the config."""
    out: dict[str, Any] = {name: c.key_part(name) for name in ("task_id", "exp_name", "run_id", "buffer_id", "policy_id")}
    run_name = c.d.get("run_name", "")
    try:
        keys.namespace(out["exp_name"], run_name)
    except (ValueError, TypeError):
        raise c.bad("run_name", "must be a string without ':', '/', space or glob characters") from None
    out["run_name"] = run_name
    out["seed"] = c.integer("seed")
    out["redis_url"] = c.string("redis_url")
    out["config"] = c.dict_("config")
    return out


_MAX_SHARDS = 1024


def _shards(c: _Check, with_index: bool) -> dict[str, Any]:
    """``data_shards`` (how many data shards the run has; absent: step data on the control Redis)
    and, with ``with_index``, ``data_shard`` (the one a collector task writes to, in [0, data_shards))."""
    n = c.integer("data_shards", 1, _MAX_SHARDS + 1, f"[1, {_MAX_SHARDS}]")
    if not with_index:
        return {"data_shards": n}
    if n is None:
        if "data_shard" in c.d:
            raise c.bad("data_shard", "needs data_shards (the run's number of data shards)")
        return {"data_shards": None, "data_shard": None}
    index = c.integer("data_shard", 0, n, f"[0, data_shards={n})")
    if index is None:
        raise c.bad("data_shard", f"is missing: with data_shards it must be an integer in [0, {n})")
    return {"data_shards": n, "data_shard": index}


def _wire(msg: Any, keep_default: tuple[str, ...] = ()) -> dict[str, Any]:
    """``msg``'s fields as a dict, optional ones at their default left out (except ``keep_default``)."""
    out: dict[str, Any] = {}
    for f in fields(msg):
        v = getattr(msg, f.name)
        if f.name != "extra" and (v != f.default or f.name in keep_default):
            out[f.name] = v
    return out


class _Task:
    """What the two task messages share: the run's namespace and the wire form (``task_type`` first)."""

    KIND: ClassVar[str]
    exp_name: str
    run_name: str

    @property
    def ns(self) -> str:
        """The run's key namespace (:func:`common.keys.namespace`)."""
        return keys.namespace(self.exp_name, self.run_name)

    def to_dict(self) -> dict[str, Any]:
        return {"task_type": self.KIND, **_wire(self)}


@dataclass(frozen=True)
class CollectorTask(_Task):
    """A collector or eval task (:meth:`coordinator.commander.SoloCommander.get_collector_task`).

    Fields: the task's and its run's ids (key components, at most 200 characters); ``eval_flag``
    (an eval task); ``collect_setting`` (name -> finite number or bool, the algorithm's to check);
    ``config`` (the run's plain config, recompiled by the worker); ``run_name`` ("" = the
    experiment's own namespace); ``envstep`` (env steps collected so far, for the chunks'
    ``envstep``); ``seed``; ``redis_url`` (a task run outside RQ); ``eval_policy_key`` and
    ``eval_episodes`` (a confirmation eval: the evaluated policy to replay and its episode count);
    ``data_shards`` / ``data_shard`` (the run's number of data shards and the index of the one this
    task writes its chunks to, common/data_shards.py; absent in older tasks and without shards:
    step data on the control Redis); ``opponent`` (a two-player game's training task under the league
    commander: the league player the task's games are against, ``main`` for the task's own
    weights, ``main@{train_iter}`` for a snapshot, coordinator/league.py). ``task_type`` is always
    ``"collector"`` on the wire.
    """

    KIND: ClassVar[str] = "collector"
    task_id: str
    exp_name: str
    run_id: str
    buffer_id: str
    policy_id: str
    eval_flag: bool
    collect_setting: dict[str, Any]
    config: dict[str, Any]
    run_name: str = ""
    envstep: Optional[int] = None
    seed: Optional[int] = None
    redis_url: Optional[str] = None
    eval_policy_key: Optional[str] = None
    eval_episodes: Optional[int] = None
    data_shards: Optional[int] = None
    data_shard: Optional[int] = None
    opponent: Optional[str] = None

    @classmethod
    def from_dict(cls, d: Any) -> "CollectorTask":
        """Raises: MessageError: not a dict, a wrong ``task_type``, missing or unknown keys, a field
        of the wrong type or value (named)."""
        c = _start(d, cls.KIND, ("task_id", "exp_name", "run_id", "buffer_id", "policy_id", "eval_flag",
                                 "collect_setting", "config"),
                   ("run_name", "envstep", "seed", "redis_url", "eval_policy_key", "eval_episodes", "data_shards",
                    "data_shard", "opponent"))
        ids = _task_ids(c)
        if not isinstance(d["eval_flag"], bool):
            raise c.bad("eval_flag", f"is {type(d['eval_flag']).__name__}, must be true or false")
        cs = d["collect_setting"]
        if not isinstance(cs, dict):
            raise MessageError(f"{c.where}: field 'collect_setting' is {type(cs).__name__}, must be a dict of numbers",
                               "collect_setting")
        for k, v in cs.items():
            if not isinstance(k, str) or not (_is_real(v) or isinstance(v, bool)):
                raise MessageError(f"{c.where}: field 'collect_setting.{k}' = {v!r:.80} must be a finite number or "
                                   "a bool", "collect_setting")
        key = d.get("eval_policy_key")
        if key is not None:
            if not (isinstance(key, str) and key.startswith(keys.exp_prefix(keys.namespace(ids["exp_name"], ids["run_name"]))
                                                            + ":task:") and key.endswith(":evaluated")):
                raise c.bad("eval_policy_key", "must be the key of an evaluated policy of this experiment")
            if not d["eval_flag"]:
                raise c.bad("eval_policy_key", "is only for eval tasks (eval_flag true)")
        opponent = c.key_part("opponent", required=False)
        if opponent is not None:
            if d["eval_flag"]:
                raise c.bad("opponent", "is only for training tasks (eval_flag false): evals play the env's own opponent")
        return cls(**ids, eval_flag=d["eval_flag"], collect_setting=cs, envstep=c.integer("envstep"),
                   eval_policy_key=key, eval_episodes=c.integer("eval_episodes", 1, 10_001, "[1, 10000]"),
                   opponent=opponent, **_shards(c, with_index=True))


@dataclass(frozen=True)
class LearnerTask(_Task):
    """A learner task (:meth:`coordinator.commander.SoloCommander.get_learner_task`).

    Fields as :class:`CollectorTask` where shared; ``resume`` (load checkpoint ``ckpt_name``
    first: a replacement after a failure); ``ckpt_name`` (the learner's own resumable checkpoint,
    ``keys.ckpt(ns, ckpt_name)``; absent in older tasks, and left off the wire, when "latest");
    ``group_id`` / ``rank`` / ``world_size`` (one rank of a data-parallel learner group,
    workers/ddp.py: all three or none, rank in [0, world_size)); ``data_shards`` (the run's number
    of data shards, all of which the learner reads; absent: step data on the control Redis).
    """

    KIND: ClassVar[str] = "learner"
    task_id: str
    exp_name: str
    run_id: str
    buffer_id: str
    policy_id: str
    config: dict[str, Any]
    run_name: str = ""
    resume: Optional[bool] = None
    seed: Optional[int] = None
    redis_url: Optional[str] = None
    ckpt_name: str = "latest"
    group_id: Optional[str] = None
    rank: Optional[int] = None
    world_size: Optional[int] = None
    data_shards: Optional[int] = None

    @classmethod
    def from_dict(cls, d: Any) -> "LearnerTask":
        """Raises: MessageError: as :meth:`CollectorTask.from_dict`."""
        c = _start(d, cls.KIND, ("task_id", "exp_name", "run_id", "buffer_id", "policy_id", "config"),
                   ("run_name", "resume", "seed", "redis_url", "ckpt_name", "group_id", "rank", "world_size",
                    "data_shards"))
        ids = _task_ids(c)
        group: dict[str, Any] = {}
        if {"world_size", "rank", "group_id"} & set(d):
            size = c.integer("world_size", 1, 1025, "[1, 1024]")
            if size is None:
                raise c.bad("world_size", "must be an integer in [1, 1024]")
            rank = c.integer("rank", 0, size, f"[0, world_size={size})")
            if rank is None:
                raise c.bad("rank", f"must be an integer in [0, world_size={size})")
            if not isinstance(d.get("group_id"), str) or len(d["group_id"]) > _MAX_ID_LEN:
                raise c.bad("group_id", f"must be a string of at most {_MAX_ID_LEN} characters")
            group = {"world_size": size, "rank": rank, "group_id": c.key_part("group_id")}
        return cls(**ids, **group, resume=c.boolean("resume"),
                   ckpt_name=c.key_part("ckpt_name", required=False) or "latest", **_shards(c, with_index=False))


def _figures(c: _Check, names: tuple[str, ...]) -> dict[str, Optional[float]]:
    return {name: c.real(name) for name in names}


def _extra(d: dict[str, Any], known: type) -> dict[str, Any]:
    names = {f.name for f in fields(known)} | set(getattr(known, "OLD_NAMES", ()))
    return {k: v for k, v in d.items() if k not in names}


@dataclass(frozen=True)
class CollectorFinish:
    """A collector's finish info (workers/collector.py ``finish_info`` and ``run_collector_task``),
    the body of its ``finished`` event: env steps and episodes of the task, the policy version it
    acted with. A task that finished no episode has no per-episode figures (``reward_*``,
    ``*_per_episode``: None, left off the wire). Read from older collectors: ``step_count``
    (the seed's name of ``env_steps``). ``extra``: every other field (the event's ``type``,
    ``ts``, ``task_type``, ``worker``, timings, delays), kept as sent.
    """

    OLD_NAMES: ClassVar[tuple[str, ...]] = ("step_count",)
    policy_version: int
    env_steps: int
    eval_flag: bool
    task_id: Optional[str] = None
    buffer_id: Optional[str] = None
    real_episode_count: Optional[int] = None
    reward_mean: Optional[float] = None
    reward_std: Optional[float] = None
    avg_step_per_episode: Optional[float] = None
    avg_time_per_episode: Optional[float] = None
    avg_time_per_step: Optional[float] = None
    duration: Optional[float] = None
    policy_envstep: Optional[int] = None
    confirmation: Optional[bool] = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CollectorFinish":
        """Raises: MessageError: a missing or ill-typed field (named)."""
        c = _Check(d, f"finish info of collector task {d.get('task_id', '?')}")
        if "env_steps" not in d and "step_count" in d:  # a collector before the glossary's names
            d = {**{k: v for k, v in d.items() if k != "step_count"}, "env_steps": d["step_count"]}
            c = _Check(d, c.where)
        for name in ("policy_version", "env_steps", "eval_flag"):
            if name not in d:
                raise c.bad(name, "is missing")
        if not isinstance(d["eval_flag"], bool):
            raise c.bad("eval_flag", f"is {type(d['eval_flag']).__name__}, must be true or false")
        return cls(policy_version=c.integer("policy_version", -1), env_steps=c.integer("env_steps"),
                   eval_flag=d["eval_flag"], task_id=c.string("task_id"), buffer_id=c.string("buffer_id"),
                   real_episode_count=c.integer("real_episode_count"), policy_envstep=c.integer("policy_envstep"),
                   confirmation=c.boolean("confirmation"),
                   **_figures(c, ("reward_mean", "reward_std", "avg_step_per_episode", "avg_time_per_episode",
                                  "avg_time_per_step", "duration")),
                   extra=_extra(d, cls))

    def to_dict(self) -> dict[str, Any]:
        return {**self.extra, **_wire(self)}


@dataclass(frozen=True)
class LearnerFinish:
    """A learner's finish info (workers/learner.py), the body of its ``finished`` event: its
    ``learn_info`` (``train_iter``, ``consumed_env_steps``, ``learner_done``), its ``buffer_id`` and
    its closing figures (``extra``, with the event's own fields). Read from older learners:
    ``collector_envstep`` (the seed's name of ``consumed_env_steps``, written under the new one).
    """

    OLD_NAMES: ClassVar[tuple[str, ...]] = ("collector_envstep",)
    buffer_id: str
    train_iter: int = 0
    consumed_env_steps: Optional[int] = None
    learner_done: Optional[bool] = None
    task_id: Optional[str] = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LearnerFinish":
        """Raises: MessageError: a missing or ill-typed field (named)."""
        c = _Check(d, f"finish info of learner task {d.get('task_id', '?')}")
        if not isinstance(d.get("buffer_id"), str):
            raise c.bad("buffer_id", "must be a string (the learner's buffer id)")
        consumed = "collector_envstep" if "consumed_env_steps" not in d and "collector_envstep" in d \
            else "consumed_env_steps"
        return cls(buffer_id=d["buffer_id"], train_iter=c.integer("train_iter") or 0,
                   consumed_env_steps=c.integer(consumed), learner_done=c.boolean("learner_done"),
                   task_id=c.string("task_id"), extra=_extra(d, cls))

    def to_dict(self) -> dict[str, Any]:
        return {**self.extra, **_wire(self, keep_default=("train_iter",))}


@dataclass(frozen=True)
class ChunkMeta:
    """The stream entry of one chunk on ``rqrl:{ns}:buffer:{buffer_id}:meta``: its blob's
    ``data_id``, rows (``n_samples``), the env steps it covers (``env_steps``), the oldest policy
    version among its rows, and (from collectors that send them) its task, blob bytes, the run's
    env steps when it was cut (``envstep``) and unix ``ts``. ``extra``: any other field."""

    data_id: str
    n_samples: int
    env_steps: int
    policy_version: int
    task_id: Optional[str] = None
    nbytes: Optional[int] = None
    envstep: Optional[int] = None
    ts: Optional[float] = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "chunk metadata") -> "ChunkMeta":
        """Raises: MessageError: a missing or ill-typed field (named), ``where`` naming the entry."""
        c = _Check(d, where)
        if not isinstance(d.get("data_id"), str):
            raise c.bad("data_id", "must be a string")
        for name in ("n_samples", "env_steps", "policy_version"):
            if name not in d:
                raise c.bad(name, "is missing")
        return cls(data_id=d["data_id"], n_samples=c.integer("n_samples"), env_steps=c.integer("env_steps"),
                   policy_version=c.integer("policy_version", -1), task_id=c.string("task_id"),
                   nbytes=c.integer("nbytes"), envstep=c.integer("envstep"), ts=c.real("ts"), extra=_extra(d, cls))

    def to_dict(self) -> dict[str, Any]:
        return {**self.extra, **_wire(self)}


@dataclass(frozen=True)
class EvalRecord:
    """One finished eval task as the coordinator records it (``rqrl:{ns}:evals``, ``evals.jsonl``;
    :func:`coordinator.eval_log.eval_record`): its task and run, the run's env steps at its receipt
    (``envstep``), the policy version played and the env steps that version was trained on
    (``policy_envstep``), ``episodes`` finished (0: no ``reward_mean`` / ``reward_std``, never 0.0),
    whether it was a ``confirmation``, the coordinator's unix ``time`` and the run's ``wall_seconds``.
    Read from records written before the glossary's names: ``train_iter`` (``policy_version``)."""

    OLD_NAMES: ClassVar[tuple[str, ...]] = ("train_iter",)
    task_id: str
    envstep: int
    time: float
    run_id: str = ""
    policy_version: int = 0
    policy_envstep: int = 0
    episodes: int = 0
    confirmation: bool = False
    wall_seconds: float = 0.0
    reward_mean: Optional[float] = None
    reward_std: Optional[float] = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalRecord":
        """Raises: MessageError: a missing or ill-typed field (named)."""
        if "policy_version" not in d and "train_iter" in d:
            d = {**{k: v for k, v in d.items() if k != "train_iter"}, "policy_version": d["train_iter"]}
        c = _Check(d, f"eval record of task {d.get('task_id', '?')}")
        if not isinstance(d.get("task_id"), str):
            raise c.bad("task_id", "must be a string")
        for name in ("envstep", "time"):
            if name not in d:
                raise c.bad(name, "is missing")
        return cls(task_id=d["task_id"], envstep=c.integer("envstep"), time=c.real("time") or 0.0,
                   run_id=c.string("run_id") or "", policy_version=c.integer("policy_version", -1) or 0,
                   policy_envstep=c.integer("policy_envstep") or 0, episodes=c.integer("episodes") or 0,
                   confirmation=bool(c.boolean("confirmation")), wall_seconds=c.real("wall_seconds") or 0.0,
                   reward_mean=c.real("reward_mean"), reward_std=c.real("reward_std"), extra=_extra(d, cls))

    def to_dict(self) -> dict[str, Any]:
        keep = ("run_id", "policy_version", "policy_envstep", "episodes", "confirmation", "wall_seconds")
        return {**self.extra, **_wire(self, keep_default=keep)}


@dataclass(frozen=True)
class TrainEpisode:
    """One finished training episode as a collector reports it (workers/episode_shipper.py; one
    item of the JSON list in a ``scalars`` event's ``episodes`` field): the run's env steps when it
    ended (``envstep``, as the collector counts them: its task's starting ``envstep`` plus its own),
    its ``return`` (env reward units, the wire name; ``ret`` here), ``length`` (env steps), the
    policy version that acted at its end and the unix time ``ts`` it ended."""

    envstep: int
    ret: float
    length: int
    policy_version: int
    ts: float

    @classmethod
    def from_dict(cls, d: Any, where: str = "training episode") -> "TrainEpisode":
        """Raises: MessageError: not a dict, or a missing or ill-typed field (named)."""
        if not isinstance(d, dict):
            raise MessageError(f"{where} must be a dict, got {type(d).__name__}")
        c = _Check(d, where)
        for name in ("envstep", "return", "length", "policy_version", "ts"):
            if name not in d:
                raise c.bad(name, "is missing")
        ret, ts = c.real("return"), c.real("ts")
        if ret is None or ts is None:  # a NaN return is refused at the collector (check_finite): not an episode
            raise c.bad("return" if ret is None else "ts", "must be a finite number")
        return cls(envstep=c.integer("envstep"), ret=ret, length=c.integer("length", 1),
                   policy_version=c.integer("policy_version", -1), ts=ts)

    def to_dict(self) -> dict[str, Any]:
        return {"envstep": self.envstep, "return": self.ret, "length": self.length,
                "policy_version": self.policy_version, "ts": self.ts}
