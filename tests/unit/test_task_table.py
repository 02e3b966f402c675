"""The coordinator's task table (coordinator/task_table.py): what it asks of RQ for each task."""

from __future__ import annotations


def test_rqs_record_of_a_finished_task_lives_as_long_as_the_runs_step_data(fake_redis, small_cfg):
    """A finished job's hash and result stream expire after the step-data TTL, so a long run's Redis
    holds one TTL window of them (bench_soak: an eval a second kept 3,600 records an hour at 3,600 s)."""
    import logging

    from rq.job import Job

    from coordinator.commander import create_commander
    from coordinator.task_table import TaskTable

    small_cfg.policy.collect.collector.data_ttl = 321
    table = TaskTable(fake_redis, "e", small_cfg, create_commander(small_cfg), logging.getLogger("t"))
    pipe = fake_redis.pipeline()
    table.enqueue("collector", {"task_id": "collector_task_1", "eval_flag": True}, pipe)
    pipe.execute()
    job = Job.fetch("collector_task_1", connection=fake_redis)
    assert job.result_ttl == 321 and job.failure_ttl == 7 * 86400
