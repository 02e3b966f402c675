"""Unit tests for coordinator/clean.py (``rqrl clean``) on fakeredis with real RQ queues and registries."""

from __future__ import annotations

import pytest
from rq import Queue
from rq.executions import Execution
from rq.job import Job, JobStatus

from common import keys
from coordinator import clean
from coordinator.cli import main as rqrl_main
from common.rq_json import TaskSerializer

FUNC = {"collector": "workers.collector.run_collector_task", "learner": "workers.learner.run_learner_task"}


def enqueue(conn, kind, exp, task_id):
    """A job whose task belongs to namespace ``exp`` (``EXP`` or a run's ``EXP/RUN``)."""
    exp_name, run_name = keys.split_namespace(exp)
    task = {"exp_name": exp_name, "task_id": task_id, **({"run_name": run_name} if run_name else {})}
    q = Queue(kind, connection=conn, serializer=TaskSerializer)
    return q, q.enqueue_call(FUNC[kind], args=(task,), job_id=task_id)


def make_started(conn, kind, exp, task_id):
    q, job = enqueue(conn, kind, exp, task_id)
    q.remove(job)
    with conn.pipeline() as pipe:
        Execution.create(job, 600, pipe)
        job.set_status(JobStatus.STARTED, pipeline=pipe)
        pipe.execute()
    return job


def make_failed(conn, kind, exp, task_id):
    q, job = enqueue(conn, kind, exp, task_id)
    q.remove(job)
    job.set_status(JobStatus.FAILED)
    q.failed_job_registry.add(job, ttl=600, exc_string="boom")
    return job


def fill_experiment(conn, exp, prefix):
    """Keys of every type one experiment has, plus queued / started / failed RQ jobs."""
    conn.xadd(keys.events(exp), {"type": "started"})
    conn.xadd(keys.buffer_meta(exp, "buf1"), {"data_id": "d1"})
    conn.set(keys.data(exp, "d1"), b"x" * 100, ex=600)
    conn.hset(keys.policy(exp, "pol1"), mapping={"version": 3, "chunk:0": b"w"})
    conn.hset(keys.commander(exp), mapping={"envstep": 10})
    conn.set(keys.heartbeat(exp, f"{prefix}_collector_1"), "1", px=10_000)
    conn.incrby(keys.envstep(exp), 500)
    conn.sadd(keys.runs(), exp)
    enqueue(conn, "collector", exp, f"{prefix}_collector_1")
    enqueue(conn, "collector", exp, f"{prefix}_collector_2")
    make_started(conn, "learner", exp, f"{prefix}_learner_1")
    make_failed(conn, "collector", exp, f"{prefix}_collector_0")
    return {f"{prefix}_collector_1", f"{prefix}_collector_2", f"{prefix}_learner_1", f"{prefix}_collector_0"}


@pytest.fixture
def two_exps(fake_redis):
    a_jobs = fill_experiment(fake_redis, "exp_a", "a")
    # "exp_ab" shares a prefix with "exp_a" as a string: it must survive cleaning exp_a.
    b_jobs = fill_experiment(fake_redis, "exp_ab", "b")
    return fake_redis, a_jobs, b_jobs


def all_keys(conn):
    return {k.decode() for k in conn.keys("*")}


def rq_job_ids(conn):
    ids = set()
    for kind in ("collector", "learner"):
        q = Queue(kind, connection=conn, serializer=TaskSerializer)
        ids |= set(q.get_job_ids())
        for reg in (q.started_job_registry, q.failed_job_registry, q.finished_job_registry):
            ids |= set(reg.get_job_ids(cleanup=False))
    return ids


def test_dry_run_lists_and_deletes_nothing(two_exps, capsys):
    conn, a_jobs, _ = two_exps
    before = {k: conn.type(k) for k in conn.keys("*")}
    assert clean.clean(conn, "exp_a") == 0
    out = capsys.readouterr().out
    assert {k: conn.type(k) for k in conn.keys("*")} == before
    for line_start in ("rqrl:exp_a:events  ", "rqrl:exp_a:data:d1  "):
        assert any(line.startswith(line_start) for line in out.splitlines()), line_start
    assert "stream  1 entries" in out
    assert "hash    2 fields" in out
    assert "string  100 bytes" in out
    assert "exp_a: 7 keys, 4 RQ jobs" in out
    for jid in a_jobs:
        assert jid in out
    assert "rqrl:exp_ab" not in out and "b_collector" not in out
    assert "dry run: nothing deleted" in out


def test_plan_finds_jobs_everywhere(two_exps):
    conn, a_jobs, _ = two_exps
    p = clean.plan(conn, "exp_a")
    where = {j.job_id: (j.queue, j.where, j.status) for j in p.jobs}
    assert set(where) == a_jobs
    assert where["a_learner_1"] == ("learner", ["started"], "started")
    assert where["a_collector_0"] == ("collector", ["failed"], "failed")
    assert where["a_collector_1"][1] == ["queued"]
    assert p.listed == ["exp_a"] and not p.coordinator


def test_yes_deletes_exactly_that_experiment(two_exps, capsys):
    conn, a_jobs, b_jobs = two_exps
    b_keys = {k for k in all_keys(conn) if k.startswith("rqrl:exp_ab:")}
    assert clean.clean(conn, "exp_a", yes=True) == 0
    out = capsys.readouterr().out
    assert "deleted 7 keys and 4 RQ jobs of exp_a" in out
    left = all_keys(conn)
    assert not any(k.startswith("rqrl:exp_a:") for k in left)
    assert b_keys <= left
    assert conn.smembers(keys.runs()) == {b"exp_ab"}
    assert rq_job_ids(conn) == b_jobs
    for jid in a_jobs:
        assert not Job.exists(jid, connection=conn)
        assert not conn.exists(f"rq:job:{jid}")
    for jid in b_jobs:
        assert Job.exists(jid, connection=conn)
    # Nothing left to do, and the other experiment still lists in full.
    assert clean.clean(conn, "exp_a", yes=True) == 0
    assert "nothing to clean" in capsys.readouterr().out
    assert len(clean.plan(conn, "exp_ab").keys) == 7


def test_refuses_while_coordinator_alive(two_exps, capsys):
    conn, a_jobs, _ = two_exps
    conn.set(keys.coordinator_alive("exp_a"), "coordinator-host-42", px=15_000)
    before = all_keys(conn)
    assert clean.clean(conn, "exp_a", yes=True) == 1
    captured = capsys.readouterr()
    assert "refusing" in captured.err and "coordinator-host-42" in captured.err and "--force" in captured.err
    assert all_keys(conn) == before
    # A dry run still lists, and says --yes would need --force.
    assert clean.clean(conn, "exp_a") == 0
    assert "--force" in capsys.readouterr().out
    # --force deletes, the coordinator key included.
    assert clean.clean(conn, "exp_a", yes=True, force=True) == 0
    assert not any(k.startswith("rqrl:exp_a:") for k in all_keys(conn))
    assert not (rq_job_ids(conn) & a_jobs)


def test_one_run_or_every_run_of_an_experiment(fake_redis, capsys):
    s1, s2 = "exp_c/20261130T021500Z-s1", "exp_c/20261130T021500Z-s2"
    jobs1, jobs2 = fill_experiment(fake_redis, s1, "c1"), fill_experiment(fake_redis, s2, "c2")
    other = fill_experiment(fake_redis, "exp_cd/20261130T021500Z-s1", "d")  # a prefix as a string only
    assert {j.job_id for j in clean.plan(fake_redis, s1).jobs} == jobs1
    assert {j.job_id for j in clean.plan(fake_redis, "exp_c").jobs} == jobs1 | jobs2
    assert clean.clean(fake_redis, s1, yes=True) == 0  # one run: the other seed's run stays
    left = all_keys(fake_redis)
    assert not any(k.startswith(f"rqrl:{s1}:") for k in left) and any(k.startswith(f"rqrl:{s2}:") for k in left)
    assert rq_job_ids(fake_redis) == jobs2 | other
    assert clean.clean(fake_redis, "exp_c", yes=True) == 0  # the experiment: every run of it
    assert "deleted 7 keys and 4 RQ jobs of exp_c" in capsys.readouterr().out
    assert not any(k.startswith("rqrl:exp_c/") for k in all_keys(fake_redis))
    assert rq_job_ids(fake_redis) == other
    assert fake_redis.smembers(keys.runs()) == {b"exp_cd/20261130T021500Z-s1"}


def test_invalid_exp_name(fake_redis, capsys):
    assert clean.clean(fake_redis, "bad:name") == 1
    assert "exp_name" in capsys.readouterr().err


def test_job_with_unreadable_payload_is_left_alone(fake_redis, capsys):
    fill_experiment(fake_redis, "exp_a", "a")
    _, job = enqueue(fake_redis, "collector", "exp_a", "broken")
    fake_redis.hset(job.key, "data", b"not a pickle")
    p = clean.plan(fake_redis, "exp_a")
    assert "broken" not in {j.job_id for j in p.jobs}
    assert any("broken" in w for w in p.warnings)


@pytest.fixture
def patched_connect(monkeypatch, two_exps):
    conn = two_exps[0]
    monkeypatch.setattr("common.connection.connect", lambda url=None, **kw: conn)
    return two_exps


def test_cli_dry_run_then_yes(patched_connect, capsys):
    conn, a_jobs, b_jobs = patched_connect
    assert rqrl_main(["clean", "--exp", "exp_a"]) == 0
    assert "dry run" in capsys.readouterr().out
    assert any(k.startswith("rqrl:exp_a:") for k in all_keys(conn))
    assert rqrl_main(["clean", "--exp", "exp_a", "--yes"]) == 0
    assert not any(k.startswith("rqrl:exp_a:") for k in all_keys(conn))
    assert rq_job_ids(conn) == b_jobs


def test_cli_refuses_alive_coordinator(patched_connect, capsys):
    conn = patched_connect[0]
    conn.set(keys.coordinator_alive("exp_a"), "c1")
    assert rqrl_main(["clean", "--exp", "exp_a", "--yes"]) == 1
    assert "refusing" in capsys.readouterr().err
    assert rqrl_main(["clean", "--exp", "exp_a", "--yes", "--force"]) == 0
