"""Data sources: how a learner forms its batches, and what collectors and the learner must know of it.

An algorithm names its source (``Algorithm.data_source``, common/policy/base.py). A source is a
:class:`DataSourceSpec` registered here (torch-free: the coordinator and the config check read it)
plus the learner-side class it names (``implementation``, imported only by learner tasks; see
workers/sources/__init__.py for the class's contract)::

    register_source(DataSourceSpec(
        name="fifo", implementation="my_package.fifo:FifoSource",
        chunk_rows="emitted",             # each batch of rows the adder emits is sent as it comes
        waits_for_new_version=False,      # collectors go on acting after a chunk
        learner_groups=False,             # one learner must see every row
        publish_every_iter=True))         # collectors act with the newest weights (low policy lag)

Built in:

    replay        workers/sources/replay.py        a replay buffer sampled under the replay-ratio limiter
    on_policy     workers/sources/on_policy.py     only the rows of the learner's current policy version
    consume_once  workers/sources/consume_once.py  every row once, oldest first (IMPALA's queue of trajectories)

A new source is one module that registers its spec and defines its class (name it in
``create_config.policy.import_names`` with the algorithm that uses it); the collector, the learner,
the config check and the coordinator need no edit.
"""

from __future__ import annotations

from dataclasses import dataclass

CHUNK_ROWS = ("n_sample", "emitted")


@dataclass(frozen=True)
class DataSourceSpec:
    """What the rest of the system needs to know of a data source.

    Attributes:
        name: the ``Algorithm.data_source`` it is registered under.
        implementation: ``"module:Class"`` of the learner-side source (workers/sources/).
        chunk_rows: ``"n_sample"``: collectors send chunks of at least ``policy.collect.n_sample``
            rows; ``"emitted"``: every batch of rows the adder emits goes out at once (so a chunk
            holds the rows of one policy version, as on-policy data needs).
        waits_for_new_version: after each chunk a collector waits (pub/sub) for the next policy
            version before acting on (on-policy data: rows of an old version are never trained on).
        learner_groups: a data-parallel learner group (``policy.learn.learner_num`` > 1) may use
            it (each rank sees only part of the rows).
        publish_every_iter: the learner publishes its weights (and reports) every train
            iteration, not every ``send_policy_freq``.
        replay_buffer: it keeps a replay buffer sized by ``policy.other.replay_buffer``: its
            memory is estimated before the run and prioritized replay may be switched on.
    """

    name: str
    implementation: str
    chunk_rows: str = "n_sample"
    waits_for_new_version: bool = False
    learner_groups: bool = False
    publish_every_iter: bool = False
    replay_buffer: bool = False

    def __post_init__(self) -> None:
        if self.chunk_rows not in CHUNK_ROWS:
            raise ValueError(f"data source {self.name!r}: chunk_rows must be one of {CHUNK_ROWS}, got {self.chunk_rows!r}")
        if ":" not in self.implementation:
            raise ValueError(f"data source {self.name!r}: implementation must be 'module:Class', got {self.implementation!r}")


SOURCES: dict[str, DataSourceSpec] = {}


def register_source(spec: DataSourceSpec) -> DataSourceSpec:
    """Register ``spec`` under its name (again with the same spec is a no-op).

    Raises:
        KeyError: another spec is registered under that name.
    """
    if SOURCES.get(spec.name, spec) != spec:
        raise KeyError(f"data source {spec.name!r} is already registered as {SOURCES[spec.name]}")
    SOURCES[spec.name] = spec
    return spec


def get_source(name: str) -> DataSourceSpec:
    """The spec registered as ``name``.

    Raises:
        KeyError: unknown name (lists the known ones).
    """
    if name not in SOURCES:
        raise KeyError(f"unknown data source {name!r}; known: {sorted(SOURCES)}")
    return SOURCES[name]


register_source(DataSourceSpec("replay", "workers.sources.replay:ReplayFeeder", learner_groups=True, replay_buffer=True))
register_source(DataSourceSpec("on_policy", "workers.sources.on_policy:OnPolicySource", chunk_rows="emitted",
                               waits_for_new_version=True, publish_every_iter=True))
register_source(DataSourceSpec("consume_once", "workers.sources.consume_once:ConsumeOnceSource", chunk_rows="emitted",
                               waits_for_new_version=False, publish_every_iter=True))
