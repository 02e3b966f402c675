"""Unit tests for common/config.py: defaults, strict merge, errors, file loading, overrides."""

from __future__ import annotations

import os
import pickle
import textwrap
from pathlib import Path

import pytest
from easydict import EasyDict

from common.config import (SYSTEM_DEFAULTS, ConfigError, apply_overrides, compile_config, load_config,
                           merge_strict)
from common.policy import get_algorithm
from common.policy.dqn import CONFIG as DQN_CONFIG

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "cfg.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


# ---------------------------------------------------------------- compile_config defaults / merge

def test_defaults_when_main_config_empty():
    cfg = compile_config({})
    assert isinstance(cfg, EasyDict)
    assert cfg.exp_name == SYSTEM_DEFAULTS["exp_name"]
    assert cfg.env.env_id == "CartPole-v1"
    assert cfg.env.manager.type == "sync"
    assert cfg.commander.collector_task_space == SYSTEM_DEFAULTS["commander"]["collector_task_space"]
    # The policy section: system (infrastructure) defaults with DQN's own hyperparameters over them.
    assert cfg.policy.learn.learner.send_policy_freq == SYSTEM_DEFAULTS["policy"]["learn"]["learner"]["send_policy_freq"]
    assert cfg.policy.nstep == DQN_CONFIG["nstep"] and cfg.policy.model.obs_shape is None
    assert cfg.policy.learn.batch_size == 64
    assert cfg.policy.other.eps.type == "exp"
    assert cfg.create.policy.type == "dqn"
    assert cfg.create.learner.type == "base"
    assert cfg.create.commander.type == "solo"


def test_default_config_is_a_copy():
    cfg = compile_config({"policy": {"learn": {"batch_size": 7, "learner": {"send_info_freq": 3}}}})
    assert cfg.policy.learn.batch_size == 7
    assert compile_config({}).policy.learn.batch_size == 64
    assert get_algorithm("dqn").config["learn"]["batch_size"] == 64
    assert SYSTEM_DEFAULTS["policy"]["learn"]["learner"]["send_info_freq"] == 20


def test_algorithm_config_holds_only_its_hyperparameters():
    """Infrastructure defaults (limiter, hooks, task_env_steps, data TTL, policy wait) are the system's."""
    for name in ("dqn", "ppo"):
        own = get_algorithm(name).config
        assert "learner" not in own.get("learn", {}) and "collector" not in own.get("collect", {})
        assert "train_iter_per_env_step" not in own.get("learn", {})
        cfg = compile_config({}, {"policy": {"type": name}})
        assert cfg.policy.collect.collector.task_env_steps == 20_000 and cfg.policy.collect.collector.data_ttl == 600


def test_deep_merge_keeps_sibling_defaults():
    cfg = compile_config({"policy": {"learn": {"batch_size": 128, "learner": {"hook": {"log_show_after_iter": 5}}}}})
    assert cfg.policy.learn.batch_size == 128
    assert cfg.policy.learn.learning_rate == 1e-3  # sibling untouched
    assert cfg.policy.learn.learner.hook.log_show_after_iter == 5
    assert cfg.policy.learn.learner.hook.save_ckpt_after_iter == 500
    assert cfg.policy.learn.learner.send_policy_freq == SYSTEM_DEFAULTS["policy"]["learn"]["learner"]["send_policy_freq"]
    assert cfg.policy.model.hidden_size_list == [128, 128]


def test_unknown_key_names_dotted_key_and_suggests_nearest():
    with pytest.raises(ConfigError) as ei:
        compile_config({"policy": {"learn": {"batch_sise": 128}}})
    msg = str(ei.value)
    assert "'policy.learn.batch_sise'" in msg
    assert "'policy.learn.batch_size'" in msg


def test_unknown_top_level_key_suggests():
    with pytest.raises(ConfigError) as ei:
        compile_config({"exp_nmae": "x"})
    assert "'exp_nmae'" in str(ei.value) and "'exp_name'" in str(ei.value)


@pytest.mark.parametrize("given, suggested", [
    ("batch_size", "'policy.learn.batch_size'"),        # a leaf's name given without its path
    ("policy.batch_size", "'policy.learn.batch_size'"),  # a level left out
    ("stop_valu", "'env.stop_value'"),                   # both: misspelt and without its path
])
def test_a_key_given_at_the_wrong_depth_suggests_where_it_lives(given, suggested):
    with pytest.raises(ConfigError, match=f"unknown config key '{given}'; did you mean {suggested}\\?"):
        apply_overrides(compile_config({}), [f"{given}=128"])


def test_unknown_key_without_close_match_has_no_suggestion():
    with pytest.raises(ConfigError) as ei:
        compile_config({"env": {"zzzzzzzz": 1}})
    assert "'env.zzzzzzzz'" in str(ei.value)
    assert "did you mean" not in str(ei.value)


def test_wrong_type_str_for_int():
    with pytest.raises(ConfigError) as ei:
        compile_config({"policy": {"learn": {"batch_size": "64"}}})
    msg = str(ei.value)
    assert "policy.learn.batch_size" in msg and "int" in msg and "str" in msg


def test_bool_refused_for_int():
    with pytest.raises(ConfigError, match="env.collector_env_num"):
        compile_config({"env": {"collector_env_num": True}})


def test_a_negative_seed_is_refused_before_anything_starts():
    base = compile_config({"exp_name": "e"})
    with pytest.raises(ConfigError, match="config key 'seed' must be >= 0, got -1"):
        apply_overrides(base, ["seed=-1"])


def test_int_refused_for_bool():
    with pytest.raises(ConfigError, match="policy.cuda"):
        compile_config({"policy": {"cuda": 1}})


def test_float_refused_for_int():
    with pytest.raises(ConfigError, match="policy.learn.batch_size"):
        compile_config({"policy": {"learn": {"batch_size": 64.0}}})


def test_int_accepted_for_float():
    cfg = compile_config({"env": {"stop_value": 200}, "policy": {"learn": {"learning_rate": 1}}})
    assert cfg.env.stop_value == 200
    assert cfg.policy.learn.learning_rate == 1


def test_scalar_for_dict_refused():
    with pytest.raises(ConfigError, match="'env'"):
        compile_config({"env": 5})


def test_tuple_accepted_for_list():
    cfg = compile_config({"policy": {"model": {"hidden_size_list": (16, 8)}}})
    assert list(cfg.policy.model.hidden_size_list) == [16, 8]


def test_env_kwargs_accepts_any_keys():
    cfg = compile_config({"env": {"env_kwargs": {"max_episode_steps": 200, "anything": {"nested": [1]}}}})
    assert cfg.env.env_kwargs.max_episode_steps == 200
    assert cfg.env.env_kwargs.anything.nested == [1]


def test_merge_strict_does_not_mutate_inputs():
    base = {"a": {"b": 1, "c": [1, 2]}}
    override = {"a": {"b": 2}}
    out = merge_strict(base, override)
    assert out == {"a": {"b": 2, "c": [1, 2]}}
    assert base == {"a": {"b": 1, "c": [1, 2]}}
    out["a"]["c"].append(3)
    assert base["a"]["c"] == [1, 2]


def test_compiled_config_pickles():
    cfg = compile_config({"exp_name": "p"})
    again = pickle.loads(pickle.dumps(cfg))
    assert again.exp_name == "p" and again.policy.learn.batch_size == 64


# ---------------------------------------------------------------- create_config

def test_unknown_policy_type():
    with pytest.raises(ConfigError) as ei:
        compile_config({}, {"policy": {"type": "ppo_nope"}})
    msg = str(ei.value)
    assert "create_config.policy.type" in msg and "ppo_nope" in msg and "dqn" in msg


def test_unknown_create_config_key():
    with pytest.raises(ConfigError, match="create_config.polcy"):
        compile_config({}, {"polcy": {"type": "dqn"}})


def test_create_config_import_names_missing_module():
    with pytest.raises(ModuleNotFoundError):
        compile_config({}, {"policy": {"type": "dqn", "import_names": ["no_such_module_rqrl_xyz"]}})


# ---------------------------------------------------------------- _validate

@pytest.mark.parametrize("main, key", [
    ({"env": {"collector_env_num": 0}}, "env.collector_env_num"),
    ({"env": {"evaluator_env_num": -1}}, "env.evaluator_env_num"),
    ({"env": {"n_evaluator_episode": 0}}, "env.n_evaluator_episode"),
    ({"commander": {"collector_task_space": 0}}, "commander.collector_task_space"),
    ({"commander": {"collector_task_space": "4"}}, "commander.collector_task_space"),
    ({"commander": {"collector_task_space": True}}, "commander.collector_task_space"),
    ({"commander": {"learner_task_space": 0}}, "commander.learner_task_space"),
    ({"env": {"manager": {"type": "threads"}}}, "env.manager.type"),
    ({"exp_name": "a:b"}, "exp_name"),
    ({"exp_name": "has space"}, "exp_name"),
    ({"exp_name": ""}, "exp_name"),
])
def test_validate_errors(main, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compile_config(main)


@pytest.mark.parametrize("value, why", [(-1, "must be an int >= 0"), (2.5, "expected int, got float")])
def test_ppo_lr_anneal_iters_must_be_a_count_of_train_iterations(value, why):
    with pytest.raises(ConfigError, match=rf"'policy\.learn\.lr_anneal_iters'.*{why}"):
        compile_config({"policy": {"learn": {"lr_anneal_iters": value}}}, {"policy": {"type": "ppo"}})


def test_async_manager_accepted():
    assert compile_config({"env": {"manager": {"type": "async"}}}).env.manager.type == "async"


# ---------------------------------------------------------------- load_config

def test_load_missing_file(tmp_path):
    p = tmp_path / "nope.py"
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert "nope.py" in str(ei.value) and "does not exist" in str(ei.value)


def test_load_directory_is_not_a_file(tmp_path):
    with pytest.raises(ConfigError, match="is not a file"):
        load_config(tmp_path)


def test_load_syntax_error_names_file_and_line(tmp_path):
    p = write(tmp_path, """\
        main_config = dict(
            exp_name="x",
        )
        def broken(:
        """, name="broken_cfg.py")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = str(ei.value)
    assert "broken_cfg.py" in msg
    assert "line 4" in msg


def test_load_file_raising(tmp_path):
    p = write(tmp_path, """\
        main_config = {}
        raise RuntimeError("boom from config")
        """, name="raises.py")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = str(ei.value)
    assert "raises.py" in msg and "RuntimeError" in msg and "boom from config" in msg


def test_load_no_main_config(tmp_path):
    p = write(tmp_path, "other = 1\n", name="empty_cfg.py")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert "empty_cfg.py" in str(ei.value) and "main_config" in str(ei.value)


def test_load_compile_error_names_file_and_key(tmp_path):
    p = write(tmp_path, "main_config = dict(policy=dict(learn=dict(batch_sise=3)))\n", name="typo.py")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = str(ei.value)
    assert "typo.py" in msg and "policy.learn.batch_sise" in msg and "policy.learn.batch_size" in msg


def test_load_unknown_policy_type_in_file(tmp_path):
    p = write(tmp_path, """\
        main_config = dict(exp_name="x")
        create_config = dict(policy=dict(type="nonexistent"))
        """, name="ctype.py")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert "ctype.py" in str(ei.value) and "create_config.policy.type" in str(ei.value)


def test_load_valid_file(tmp_path):
    p = write(tmp_path, """\
        main_config = dict(exp_name="from_file", seed=3, policy=dict(learn=dict(batch_size=16)))
        create_config = dict(policy=dict(type="dqn"))
        """)
    cfg = load_config(str(p))
    assert cfg.exp_name == "from_file" and cfg.seed == 3
    assert cfg.policy.learn.batch_size == 16
    assert cfg.create.policy.type == "dqn"


def test_deploy_cartpole_config_loads():
    cfg = load_config(REPO / "deploy" / "configs" / "cartpole_dqn.py")
    assert cfg.exp_name == "cartpole_dqn"
    assert cfg.env.stop_value == 195.0
    assert cfg.policy.model.obs_shape is None and cfg.policy.model.action_shape is None  # read from the env
    assert cfg.commander.max_wall_seconds == 300.0
    assert cfg.create.commander.type == "solo"


# ---------------------------------------------------------------- apply_overrides

def test_apply_override_int():
    cfg = compile_config({"exp_name": "o"})
    out = apply_overrides(cfg, ["policy.learn.batch_size=128"])
    assert out.policy.learn.batch_size == 128
    assert out.policy.learn.learning_rate == cfg.policy.learn.learning_rate
    assert cfg.policy.learn.batch_size == 64  # input untouched
    assert out.create.policy.type == "dqn"
    assert out.exp_name == "o"


def test_apply_overrides_multiple_and_types():
    cfg = compile_config({})
    out = apply_overrides(cfg, ["exp_name=run_2", "env.stop_value=150", "policy.cuda=False",
                                "policy.model.hidden_size_list=[8, 8]", "env.manager.type='async'"])
    assert out.exp_name == "run_2"
    assert out.env.stop_value == 150
    assert out.policy.cuda is False
    assert out.policy.model.hidden_size_list == [8, 8]
    assert out.env.manager.type == "async"


def test_apply_override_value_with_equals_sign():
    cfg = compile_config({})
    out = apply_overrides(cfg, ["env.env_id=a=b"])
    assert out.env.env_id == "a=b"


def test_apply_override_bad_key():
    with pytest.raises(ConfigError) as ei:
        apply_overrides(compile_config({}), ["policy.learn.batch_sise=1"])
    assert "policy.learn.batch_sise" in str(ei.value) and "policy.learn.batch_size" in str(ei.value)


def test_apply_override_wrong_type():
    with pytest.raises(ConfigError, match="policy.learn.batch_size"):
        apply_overrides(compile_config({}), ["policy.learn.batch_size=abc"])


def test_apply_override_malformed():
    with pytest.raises(ConfigError) as ei:
        apply_overrides(compile_config({}), ["policy.learn.batch_size"])
    assert "KEY=VALUE" in str(ei.value) and "policy.learn.batch_size" in str(ei.value)


def test_apply_override_validates():
    with pytest.raises(ConfigError, match="env.collector_env_num"):
        apply_overrides(compile_config({}), ["env.collector_env_num=0"])
    with pytest.raises(ConfigError, match="exp_name"):
        apply_overrides(compile_config({}), ["exp_name=a:b"])


def test_apply_override_env_kwargs_new_key():
    out = apply_overrides(compile_config({}), ["env.env_kwargs.max_episode_steps=300"])
    assert out.env.env_kwargs == {"max_episode_steps": 300}


def test_apply_override_env_kwargs_keeps_other_entries():
    # Regression: the open dict env.env_kwargs was replaced wholesale, dropping sibling entries.
    cfg = compile_config({"env": {"env_kwargs": {"max_episode_steps": 200, "sutton_barto_reward": True}}})
    out = apply_overrides(cfg, ["env.env_kwargs.max_episode_steps=300"])
    assert out.env.env_kwargs == {"max_episode_steps": 300, "sutton_barto_reward": True}


def test_apply_no_overrides_is_identity():
    cfg = compile_config({"exp_name": "same"})
    out = apply_overrides(cfg, [])
    assert out == cfg


def test_policy_cuda_accepts_bool_and_auto_only():
    assert compile_config({"policy": {"cuda": "auto"}}).policy.cuda == "auto"
    assert compile_config({"policy": {"cuda": True}}).policy.cuda is True
    with pytest.raises(ConfigError, match="policy.cuda"):
        compile_config({"policy": {"cuda": "maybe"}})


def test_cuda_true_without_cuda_fails_naming_the_key(monkeypatch):
    import torch

    from common.device import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="policy.cuda"):
        pick_device(compile_config({"policy": {"cuda": True}}), None)
    assert pick_device(compile_config({"policy": {"cuda": "auto"}}), None).type == "cpu"
    assert pick_device(compile_config({}), None).type == "cpu"
    from coordinator.cli import main

    assert main(["train", str(REPO / "deploy" / "configs" / "cartpole_dqn.py"), "--set", "policy.cuda=True"]) == 1


def test_non_positive_batch_size_and_n_sample_are_refused():
    for key in ("policy.learn.batch_size", "policy.collect.n_sample"):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            apply_overrides(compile_config({}), [f"{key}=-5"])


def test_deterministic_mode_takes_every_clock_out_of_the_run():
    from common.config import apply_overrides, is_deterministic

    base = compile_config({"exp_name": "e", "commander": {"eval_every_env_step": 0}})
    assert not is_deterministic(base) and not is_deterministic({})  # a config from before the mode
    cfg = apply_overrides(base, ["system.deterministic=True"])
    c = cfg.commander
    assert is_deterministic(cfg)
    assert (c.collector_task_space, c.eval_task_space, c.eval_interval, c.eval_every_train_iter, c.eval_max_share) \
        == (1, 0, 0.0, 0, 1.0)
    # With no env-step interval set, evals fall between tasks.
    assert c.eval_every_env_step == cfg.policy.collect.collector.task_env_steps
    assert cfg.policy.learn.learner.send_policy_freq == 1 and cfg.policy.collect.collector.task_max_seconds >= 1e9
    kept = compile_config({"exp_name": "e", "system": {"deterministic": True}, "commander": {"eval_every_env_step": 5000}})
    assert kept.commander.eval_every_env_step == 5000
    # Tasks end where evals and the budget fall.
    assert kept.policy.collect.collector.task_env_steps == 5000
    short = apply_overrides(kept, ["commander.max_env_step=3000"])
    assert short.policy.collect.collector.task_env_steps == 3000


def test_rqrl_train_refuses_more_than_one_collector_when_deterministic(tmp_path):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "coordinator.cli", "train", str(REPO / "deploy" / "configs" / "cartpole_dqn.py"),
                          "--deterministic", "--collectors", "3", "--dry-run"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode != 0 and "--collectors 3: a deterministic run has one collector worker" in res.stderr, res.stderr
    ok = subprocess.run([sys.executable, "-m", "coordinator.cli", "train", str(REPO / "deploy" / "configs" / "cartpole_dqn.py"),
                         "--deterministic", "--dry-run"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert ok.returncode == 0 and "with 1 collector worker (nothing launched" in ok.stdout, ok.stdout + ok.stderr
