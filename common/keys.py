"""Every Redis key rqrl uses, built in one place so ``redis-cli`` users and the code agree.

Layout (``{exp}`` is a run's namespace, ``{exp_name}/{run_name}``: see :func:`namespace`; a task
built by hand without ``run_name`` uses ``{exp_name}`` alone)::

    rq:queue:collector, rq:queue:learner     RQ queues (names below; RQ builds the keys)
    rqrl:{exp}:events                        stream: worker events -> coordinator (trimmed by the coordinator, only what it read)
    rqrl:{exp}:evals                         list: one JSON eval result per eval task of the run (never capped)
    rqrl:{exp}:buffer:{buffer_id}:meta       stream: one entry per step-data chunk
    rqrl:{exp}:data:{data_id}                string (msgpack), with a TTL; emptied (tombstone) once consumed
    rqrl:{exp}:policy:{policy_id}            hash: version, train_iter, n_chunks, chunk:<i>
    rqrl:{exp}:ckpt:{name}                   hash: same layout as a policy, torch checkpoint bytes
    rqrl:{exp}:policy:{policy_id}:updates    pub/sub channel: "<version> <envstep_limit>" per publication
    rqrl:{exp}:envstep                       counter: env steps sent by all collectors (replay-ratio limiter)
    rqrl:{exp}:commander                     hash: commander summary for ``rqrl status``
    rqrl:{exp}:stop                          string: why the run stopped; absent while running
    rqrl:{exp}:phases                        hash: phase name -> unix seconds (launch, first train step, ...)
    rqrl:{exp}:run                           string: id of the current run (tasks of older runs exit)
    rqrl:{exp}:coordinator                   string with a TTL: the live coordinator's name
    rqrl:{exp}:write_probe                   string with a TTL: the coordinator's write probe (held or refused: Redis takes no writes)
    rqrl:{exp}:buffer:{buffer_id}:stats      hash: produced / resent / consumed / expired / corrupt / malformed / duplicate chunks, env steps
    rqrl:{exp}:tasks                         hash: task_id -> task record (JSON) of the coordinator's running tasks
    rqrl:{exp}:task:{task_id}:lease          string: present while the task may write (revoked when declared dead)
    rqrl:{exp}:task:{task_id}:heartbeat      string with a TTL, refreshed by a running task
    rqrl:{exp}:task:{task_id}:evaluated      hash (TTL): the final.pt bundle an eval task played
    rqrl:{exp}:learner_group:{group_id}      list (TTL): rank 0's rendezvous address, one copy per other rank
    rqrl:workers:{queue}                     set of rqrl worker names on the queue (refreshed: common/worker_presence.py)
    rqrl:worker:{name}:alive                 string with a TTL, refreshed by a live rqrl worker
    rqrl:runs                                set of run namespaces (``{exp_name}/{run_name}``) seen by coordinators

Step data on a Redis Cluster (common/data_shards.py) puts the shard's hash tag
(:func:`slot_tag`, e.g. ``{shard1.0}``) after the run's namespace, as in
``rqrl:{exp}:{shard1.0}:data:{data_id}`` and ``rqrl:{exp}:{shard1.0}:buffer:{buffer_id}:meta``,
so one run's chunks, streams and stats of one shard share a hash slot.
"""

from __future__ import annotations

PREFIX = "rqrl"

COLLECTOR_QUEUE = "collector"
LEARNER_QUEUE = "learner"

# Consumer-group names on the streams.
COORDINATOR_GROUP = "coordinator"
LEARNER_GROUP = "learner"


def _check(name: str, value: str) -> str:
    # Braces too: the first {...} of a key is its Redis Cluster hash tag (slot_tag), never a name's.
    if not value or any(c in value for c in ": \t\n*?[]{}"):
        raise ValueError(f"{name} {value!r} is not a valid key component (empty, or contains ':', space, "
                         "braces or glob chars)")
    return value


# Names in an experiment folder that are not runs: ./{exp_name}/latest (the newest run) and
# ./{exp_name}/tensorboard/ (links to every run's TensorBoard events).
RESERVED_RUN_NAMES = ("latest", "tensorboard")


def check_path_component(name: str, value: str) -> str:
    """``value`` as one plain folder name below the working folder, or ValueError naming ``name``.

    ``exp_name`` and ``run_name`` are both key components and folders (``./{exp_name}/{run_name}/``):
    a ``/`` would nest or escape (an absolute path, ``..``), and ``.`` / ``..`` name the working
    folder or its parent, so all of them are refused, as are key-breaking characters (:func:`_check`).
    """
    if isinstance(value, str) and ("/" in value or "\\" in value or value in (".", "..")):
        raise ValueError(f"{name} {value!r} must be one plain folder name: no '/' (nor an absolute path), "
                         "not '.' or '..'")
    return _check(name, value)


def namespace(exp_name: str, run_name: str = "") -> str:
    """The key namespace of one run, ``{exp_name}/{run_name}``: the one place that decides it.

    It is also the run folder's path relative to the output directory (``./{exp_name}/{run_name}/``),
    so workers writing logs under ``./{namespace}/log`` land in the run folder. An empty
    ``run_name`` (tasks built by hand, tests) gives the experiment name alone.

    Raises:
        ValueError: an empty or ill-formed component; either one is a path (``/``, ``.``, ``..``:
            :func:`check_path_component`).
    """
    check_path_component("exp_name", exp_name)
    if not run_name:
        return exp_name
    if run_name in RESERVED_RUN_NAMES:
        raise ValueError(f"run_name {run_name!r} is taken by the experiment folder's own "
                         f"{'link to the newest run' if run_name == 'latest' else 'TensorBoard links'}")
    return f"{exp_name}/{check_path_component('run_name', run_name)}"


def split_namespace(ns: str) -> tuple[str, str]:
    """``(exp_name, run_name)`` of a namespace made by :func:`namespace` (run_name "" when none)."""
    exp_name, sep, run_name = ns.rpartition("/")
    return (exp_name, run_name) if sep else (ns, "")


def exp_prefix(exp: str) -> str:
    """``rqrl:{exp}`` — the prefix every key of one run (namespace ``exp``) shares."""
    return f"{PREFIX}:{_check('exp_name', exp)}"


def runs() -> str:
    """Set of run namespaces, so ``rqrl status`` can list runs."""
    return f"{PREFIX}:runs"


def events(exp: str) -> str:
    """Stream of worker events (started / finished / failed / learner_info)."""
    return f"{exp_prefix(exp)}:events"


def evals(exp: str) -> str:
    """List of the run's eval results (JSON), kept whole: the events stream is trimmed."""
    return f"{exp_prefix(exp)}:evals"


def _step_data_prefix(exp: str, tag: str) -> str:
    """``rqrl:{exp}``, or ``rqrl:{exp}:{tag}`` for step data on a Redis Cluster (:func:`slot_tag`)."""
    return f"{exp_prefix(exp)}:{tag}" if tag else exp_prefix(exp)


def buffer_meta(exp: str, buffer_id: str, tag: str = "") -> str:
    """Stream of step-data metadata for the replay buffer ``buffer_id`` (``tag``: :func:`slot_tag`)."""
    return f"{_step_data_prefix(exp, tag)}:buffer:{_check('buffer_id', buffer_id)}:meta"


def buffer_stats(exp: str, buffer_id: str, tag: str = "") -> str:
    """Exactly-once accounting of one buffer's chunks (collectors and learner update it atomically;
    ``tag``: :func:`slot_tag`)."""
    return f"{_step_data_prefix(exp, tag)}:buffer:{_check('buffer_id', buffer_id)}:stats"


def data(exp: str, data_id: str, tag: str = "") -> str:
    """One msgpack blob of stacked transitions (``tag``: :func:`slot_tag`)."""
    return f"{_step_data_prefix(exp, tag)}:data:{_check('data_id', data_id)}"


def data_staged(exp: str, data_id: str, tag: str = "") -> str:
    """Where a chunk's blob is written before the chunk script renames it to :func:`data` (lives
    only inside one MULTI/EXEC; matched by :func:`data_pattern`, so a leftover is cleaned with the rest)."""
    return f"{data(exp, data_id, tag)}:staged"


def data_pattern(exp: str, tag: str = "") -> str:
    """SCAN pattern matching every step-data blob of one experiment (of one slot tag, where given)."""
    return f"{_step_data_prefix(exp, tag)}:data:*"


def buffers_pattern(exp: str, tag: str = "") -> str:
    """SCAN pattern matching every buffer's metadata stream and stats hash of one experiment (of one
    slot tag, where given)."""
    return f"{_step_data_prefix(exp, tag)}:buffer:*"


# Redis Cluster's hash slots (CLUSTER KEYSLOT: CRC16 of the key's {hash tag}, mod 16384).
CLUSTER_SLOTS = 16384


def slot_tag(index: int, count: int) -> str:
    """The hash tag of step-data shard ``index`` of ``count`` on one Redis Cluster: ``{shard2.57}``.

    Every step-data key of one run and shard carries it, so the chunk scripts' keys share one hash
    slot (a script's keys must, in a cluster); the tags of ``count`` shards fall in ``count`` equal
    ranges of the 16384 slots, in order, so that on a cluster whose primaries hold equal slot
    ranges (as ``redis-cli --cluster create`` makes them) the shards spread over the primaries.
    The same ``(index, count)`` gives the same tag in every process.

    Raises:
        ValueError: ``index`` is not in ``[0, count)``.
    """
    from redis.crc import key_slot

    if not 0 <= index < count:
        raise ValueError(f"slot tag: shard index {index} is not in [0, {count})")
    lo, hi = index * CLUSTER_SLOTS // count, (index + 1) * CLUSTER_SLOTS // count
    k = 0
    while not lo <= key_slot(f"shard{index}.{k}".encode()) < hi:
        k += 1
    return f"{{shard{index}.{k}}}"


def policy(exp: str, policy_id: str) -> str:
    """Versioned policy weights (hash)."""
    return f"{exp_prefix(exp)}:policy:{_check('policy_id', policy_id)}"


def league_snapshot(exp: str, player_id: str) -> str:
    """A league snapshot's weights: a versioned blob like :func:`policy` (hash), copied from it."""
    return f"{exp_prefix(exp)}:league:snapshot:{_check('player_id', player_id)}"


def league_elo(exp: str) -> str:
    """The league's Elo ratings (hash: player id -> rating), written by the league commander."""
    return f"{exp_prefix(exp)}:league:elo"


def league_payoff(exp: str) -> str:
    """Main's results against each opponent (hash: player id -> JSON ``{"wins", "draws", "losses"}``)."""
    return f"{exp_prefix(exp)}:league:payoff"


def policy_updates(exp: str, policy_id: str) -> str:
    """Pub/sub channel announcing each policy publication (small text, never the weights)."""
    return f"{policy(exp, policy_id)}:updates"


def collect_setting(exp: str) -> str:
    """The current collect setting (JSON: ``{"setting": {...}, "ts": unix seconds}``), written by
    the coordinator whenever it changes and read by collectors with every chunk."""
    return f"{exp_prefix(exp)}:collect_setting"


def worker_notice(worker_name: str) -> str:
    """Set (with a TTL) once a stock forking collector worker has logged that it cannot keep envs
    between tasks, so its log says so once rather than at every task."""
    return f"{PREFIX}:worker:{_check('worker_name', worker_name)}:env_notice"


def workers_alive(queue: str) -> str:
    """Set of the names of rqrl's workers on ``queue`` (common/worker_presence.py), added to at
    every refresh of their :func:`worker_alive` key, so a Redis that lost it has it back within
    one refresh."""
    return f"{PREFIX}:workers:{_check('queue', queue)}"


def worker_alive(worker_name: str) -> str:
    """String with a TTL that a live rqrl worker refreshes (common/worker_presence.py)."""
    return f"{PREFIX}:worker:{_check('worker_name', worker_name)}:alive"


def envstep(exp: str) -> str:
    """Counter of env steps sent by all collectors, compared with the learner's envstep_limit."""
    return f"{exp_prefix(exp)}:envstep"


def ckpt(exp: str, name: str) -> str:
    """A learner checkpoint (hash, same layout as a policy)."""
    return f"{exp_prefix(exp)}:ckpt:{_check('ckpt name', name)}"


def final_ckpt_name(ckpt_name: str, model: bool = False) -> str:
    """The end-of-run checkpoint of the player whose resumable checkpoint is ``ckpt_name`` (``model``:
    its acting weights as ``rqrl eval`` loads them, what final.pt is copied from): ``final`` /
    ``final_model`` for the solo commander's "latest" (the names runs had before players), else
    ``{ckpt_name}_final`` / ``{ckpt_name}_final_model``, so two players' learners never share one."""
    base = "final" if ckpt_name == "latest" else f"{_check('ckpt name', ckpt_name)}_final"
    return f"{base}_model" if model else base


def commander(exp: str) -> str:
    """Commander summary hash written by the coordinator."""
    return f"{exp_prefix(exp)}:commander"


def stop(exp: str) -> str:
    """Stop flag: present (value = reason) once the run must end."""
    return f"{exp_prefix(exp)}:stop"


def phases(exp: str) -> str:
    """The run's phase timestamps (hash: phase name -> unix seconds), each written by the process
    that passed the phase (common/phases.py)."""
    return f"{exp_prefix(exp)}:phases"


def run(exp: str) -> str:
    """Id of the experiment's current run; a task stamped with another run id is stale."""
    return f"{exp_prefix(exp)}:run"


def coordinator_alive(exp: str) -> str:
    """Liveness key (TTL) of the coordinator that owns the experiment; a second one refuses to start."""
    return f"{exp_prefix(exp)}:coordinator"


def write_probe(exp: str) -> str:
    """The key the coordinator writes each liveness pass to learn whether Redis takes writes."""
    return f"{exp_prefix(exp)}:write_probe"


def tasks(exp: str) -> str:
    """The coordinator's running-task records, persisted for a restart."""
    return f"{exp_prefix(exp)}:tasks"


def lease(exp: str, task_id: str) -> str:
    """A task's write lease: granted at dispatch, deleted when the task is declared dead or ends."""
    return f"{exp_prefix(exp)}:task:{_check('task_id', task_id)}:lease"


def heartbeat(exp: str, task_id: str) -> str:
    """Liveness key of a running task, kept alive with a TTL."""
    return f"{exp_prefix(exp)}:task:{_check('task_id', task_id)}:heartbeat"


def evaluated_policy(exp: str, task_id: str) -> str:
    """The policy an eval task played, as a final.pt bundle (versioned blob with a TTL)."""
    return f"{exp_prefix(exp)}:task:{_check('task_id', task_id)}:evaluated"


def learner_group(exp: str, group_id: str) -> str:
    """Rendezvous of a data-parallel learner group: rank 0 pushes ``host:port world_size`` once
    per other rank, each of which pops one copy (BLPOP) and joins its TCPStore."""
    return f"{exp_prefix(exp)}:learner_group:{_check('group_id', group_id)}"


def runs_keys_pattern(exp_name: str) -> str:
    """SCAN pattern matching every key of every run of experiment ``exp_name`` (``rqrl:{exp_name}/*``)."""
    return f"{exp_prefix(exp_name)}/*"


def all_keys_pattern(exp: str) -> str:
    """SCAN pattern matching every key of one namespace (one run; not the runs below an experiment)."""
    return f"{exp_prefix(exp)}:*"
