"""Unit tests for common/keys.py: the documented Redis key layout and component validation."""

from __future__ import annotations

import fnmatch
import re

import pytest

from common import keys

EXP = "cartpole_dqn"


@pytest.mark.parametrize("built, expected", [
    (lambda: keys.exp_prefix(EXP), "rqrl:cartpole_dqn"),
    (lambda: keys.events(EXP), "rqrl:cartpole_dqn:events"),
    (lambda: keys.buffer_meta(EXP, "buffer_1a2b"), "rqrl:cartpole_dqn:buffer:buffer_1a2b:meta"),
    (lambda: keys.data(EXP, "collector_task_ab_cd"), "rqrl:cartpole_dqn:data:collector_task_ab_cd"),
    (lambda: keys.policy(EXP, "policy_9"), "rqrl:cartpole_dqn:policy:policy_9"),
    (lambda: keys.ckpt(EXP, "latest"), "rqrl:cartpole_dqn:ckpt:latest"),
    (lambda: keys.policy_updates(EXP, "policy_9"), "rqrl:cartpole_dqn:policy:policy_9:updates"),
    (lambda: keys.envstep(EXP), "rqrl:cartpole_dqn:envstep"),
    (lambda: keys.commander(EXP), "rqrl:cartpole_dqn:commander"),
    (lambda: keys.stop(EXP), "rqrl:cartpole_dqn:stop"),
    (lambda: keys.run(EXP), "rqrl:cartpole_dqn:run"),
    (lambda: keys.coordinator_alive(EXP), "rqrl:cartpole_dqn:coordinator"),
    (lambda: keys.write_probe(EXP), "rqrl:cartpole_dqn:write_probe"),
    (lambda: keys.heartbeat(EXP, "learner_task_0123"), "rqrl:cartpole_dqn:task:learner_task_0123:heartbeat"),
    (lambda: keys.buffer_stats(EXP, "buffer_1a2b"), "rqrl:cartpole_dqn:buffer:buffer_1a2b:stats"),
    (lambda: keys.tasks(EXP), "rqrl:cartpole_dqn:tasks"),
    (lambda: keys.lease(EXP, "learner_task_0123"), "rqrl:cartpole_dqn:task:learner_task_0123:lease"),
    (lambda: keys.runs(), "rqrl:runs"),
    (lambda: keys.learner_group(EXP, "group_0123"), "rqrl:cartpole_dqn:learner_group:group_0123"),
    (lambda: keys.all_keys_pattern(EXP), "rqrl:cartpole_dqn:*"),
    (lambda: keys.phases(EXP), "rqrl:cartpole_dqn:phases"),
])
def test_builders_match_documented_layout(built, expected):
    assert built() == expected


def test_docstring_table_matches_builders():
    """Every ``rqrl:`` line of the module docstring is produced by some builder."""
    doc_keys = re.findall(r"^\s+(rqrl:\S+)", keys.__doc__, flags=re.M)
    assert len(doc_keys) >= 13
    subst = {"{exp}": "E", "{buffer_id}": "B", "{data_id}": "D", "{policy_id}": "P", "{name}": "N",
             "{task_id}": "T", "{group_id}": "G", "{queue}": "Q"}
    built = {
        keys.events("E"), keys.buffer_meta("E", "B"), keys.data("E", "D"), keys.policy("E", "P"),
        keys.ckpt("E", "N"), keys.policy_updates("E", "P"), keys.envstep("E"), keys.commander("E"),
        keys.stop("E"), keys.run("E"), keys.coordinator_alive("E"), keys.write_probe("E"), keys.heartbeat("E", "T"),
        keys.runs(), keys.buffer_stats("E", "B"), keys.tasks("E"), keys.lease("E", "T"), keys.evals("E"),
        keys.evaluated_policy("E", "T"), keys.learner_group("E", "G"), keys.phases("E"),
        keys.workers_alive("Q"), keys.worker_alive("N"),
    }
    documented = set()
    for k in doc_keys:
        for a, b in subst.items():
            k = k.replace(a, b)
        documented.add(k)
    assert documented == built


def test_queue_and_group_names():
    assert keys.COLLECTOR_QUEUE == "collector"
    assert keys.LEARNER_QUEUE == "learner"
    assert keys.PREFIX == "rqrl"
    assert keys.COORDINATOR_GROUP != keys.LEARNER_GROUP


@pytest.mark.parametrize("bad", ["", "a:b", "a b", "a*", "x?", "[a]", "tab\there", "new\nline"])
def test_invalid_exp_name_rejected_naming_component(bad):
    with pytest.raises(ValueError, match="exp_name"):
        keys.exp_prefix(bad)
    with pytest.raises(ValueError, match="exp_name"):
        keys.events(bad)
    with pytest.raises(ValueError, match="exp_name"):
        keys.all_keys_pattern(bad)


@pytest.mark.parametrize("builder, component", [
    (lambda v: keys.buffer_meta(EXP, v), "buffer_id"),
    (lambda v: keys.data(EXP, v), "data_id"),
    (lambda v: keys.policy(EXP, v), "policy_id"),
    (lambda v: keys.policy_updates(EXP, v), "policy_id"),
    (lambda v: keys.ckpt(EXP, v), "ckpt name"),
    (lambda v: keys.heartbeat(EXP, v), "task_id"),
    (lambda v: keys.buffer_stats(EXP, v), "buffer_id"),
    (lambda v: keys.lease(EXP, v), "task_id"),
])
@pytest.mark.parametrize("bad", ["", "has:colon", "has space", "star*", "q?"])
def test_invalid_components_rejected_naming_component(builder, component, bad):
    with pytest.raises(ValueError) as ei:
        builder(bad)
    msg = str(ei.value)
    assert component in msg
    assert repr(bad) in msg


def test_valid_components_with_dashes_dots_underscores():
    assert keys.data("exp-1.a", "id_x-9.z") == "rqrl:exp-1.a:data:id_x-9.z"


def test_experiment_keys_match_pattern():

    pattern = keys.all_keys_pattern(EXP)
    for k in (keys.events(EXP), keys.data(EXP, "d"), keys.heartbeat(EXP, "t"), keys.stop(EXP)):
        assert fnmatch.fnmatchcase(k, pattern)
    assert not fnmatch.fnmatchcase(keys.events("other"), pattern)
    assert not fnmatch.fnmatchcase(keys.runs(), pattern)


def test_run_namespace_is_the_key_prefix_and_the_run_folder():
    ns = keys.namespace("cartpole_dqn", "20261130T021500Z-s1")
    assert ns == "cartpole_dqn/20261130T021500Z-s1"
    assert keys.events(ns) == "rqrl:cartpole_dqn/20261130T021500Z-s1:events"
    assert keys.split_namespace(ns) == ("cartpole_dqn", "20261130T021500Z-s1")
    assert keys.namespace("cartpole_dqn") == "cartpole_dqn" and keys.split_namespace("cartpole_dqn") == ("cartpole_dqn", "")
    # One run's keys are not matched by another's pattern, nor by the experiment's own.
    other = keys.namespace("cartpole_dqn", "20261130T021500Z-s2")
    assert not fnmatch.fnmatchcase(keys.events(other), keys.all_keys_pattern(ns))
    assert not fnmatch.fnmatchcase(keys.events(ns), keys.all_keys_pattern("cartpole_dqn"))
    assert fnmatch.fnmatchcase(keys.events(ns), keys.runs_keys_pattern("cartpole_dqn"))
    for bad in ("a/b", "a:b", "", "a b"):
        with pytest.raises(ValueError):
            keys.namespace("cartpole_dqn", bad) if bad else keys.namespace("", "r")


def test_slot_tags_fall_in_equal_ranges_of_the_slots_in_order_and_are_stable():
    from redis.crc import key_slot

    for count in (1, 2, 3, 4, 8, 16):
        tags = [keys.slot_tag(i, count) for i in range(count)]
        assert tags == [keys.slot_tag(i, count) for i in range(count)]  # the same in every process
        for i, tag in enumerate(tags):
            slot = key_slot(keys.data(EXP, "d", tag).encode())
            assert i * keys.CLUSTER_SLOTS // count <= slot < (i + 1) * keys.CLUSTER_SLOTS // count, (count, i, tag)
            # every step-data key of the shard shares that slot (its scripts' keys must)
            for k in (keys.data_staged(EXP, "d2", tag), keys.buffer_meta(EXP, "B", tag), keys.buffer_stats(EXP, "B", tag)):
                assert key_slot(k.encode()) == slot, k
    with pytest.raises(ValueError, match=r"shard index 3 is not in \[0, 3\)"):
        keys.slot_tag(3, 3)


def test_a_slot_tag_goes_after_the_namespace_and_scan_patterns_keep_to_it():
    tag = keys.slot_tag(1, 4)
    assert keys.data(EXP, "D", tag) == f"rqrl:{EXP}:{tag}:data:D"
    assert fnmatch.fnmatchcase(keys.data(EXP, "D", tag), keys.data_pattern(EXP, tag))
    assert not fnmatch.fnmatchcase(keys.data(EXP, "D", keys.slot_tag(2, 4)), keys.data_pattern(EXP, tag))
    assert fnmatch.fnmatchcase(keys.buffer_meta(EXP, "B", tag), keys.buffers_pattern(EXP, tag))
    assert fnmatch.fnmatchcase(keys.buffer_meta(EXP, "B", tag), keys.all_keys_pattern(EXP))


@pytest.mark.parametrize("bad", ["{tag}", "a{b", "c}"])
def test_braces_in_a_name_are_refused_they_would_pick_the_hash_slot(bad):
    with pytest.raises(ValueError, match="braces"):
        keys.exp_prefix(bad)
