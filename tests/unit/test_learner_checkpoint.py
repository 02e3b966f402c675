"""A learner resumed from its checkpoint continues where the saved one stopped: train_iter,
env steps consumed and weights (the seed's BaseLearner save/load hooks, through Redis)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from easydict import EasyDict

from tests.unit.test_prioritized_replay import dqn_batch, make_dqn
from workers.checkpoints import CheckpointStore
from workers.learner import BaseLearner

CPU = torch.device("cpu")


def _learner(cfg, store, tmp_path, seed):
    lcfg = copy.deepcopy(cfg.policy.learn.learner)
    lcfg.hook.update(log_show_after_iter=0, save_ckpt_after_iter=0, save_ckpt_after_run=True, load_ckpt_before_run="")
    return BaseLearner(lcfg, make_dqn(cfg, seed=seed), exp_name="ckpt_test", log_dir=str(tmp_path / f"log{seed}"),
                       checkpoint_store=store)


def test_load_checkpoint_restores_train_iter_env_steps_and_weights(fake_redis, small_cfg, tmp_path):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    store = CheckpointStore(fake_redis, "ckpt_test", Path(tmp_path / "unused"))
    first = _learner(cfg, store, tmp_path, seed=1)
    second = _learner(cfg, store, tmp_path, seed=2)  # different initial weights
    try:
        assert second.load_checkpoint("latest") is False and second.train_iter == 0
        for i in range(3):
            first.train(dqn_batch(n=16, seed=i), envstep=100 * (i + 1))
        first.save_checkpoint("latest")
        assert second.load_checkpoint("latest") is True
        assert (second.train_iter, second.consumed_env_steps) == (3, 300)
        saved, loaded = first.policy.state_dict(), second.policy.state_dict()
        model = next(k for k in saved if k.startswith("model"))
        for name, tensor in saved[model].items():
            assert torch.equal(tensor, loaded[model][name]), name
    finally:
        first.close()
        second.close()


def test_a_checkpoint_saved_under_the_seeds_field_name_still_loads(fake_redis, small_cfg, tmp_path):
    """Checkpoints written before consumed_env_steps was renamed carry ``collector_envstep``."""
    cfg = EasyDict(copy.deepcopy(small_cfg))
    store = CheckpointStore(fake_redis, "ckpt_test", Path(tmp_path / "unused"))
    first = _learner(cfg, store, tmp_path, seed=1)
    second = _learner(cfg, store, tmp_path, seed=2)
    try:
        first.train(dqn_batch(n=16, seed=0), envstep=250)
        state = first.checkpoint_state()
        state["collector_envstep"] = state.pop("consumed_env_steps")
        store.save("latest", state, first.train_iter)
        assert second.load_checkpoint("latest") is True
        assert (second.train_iter, second.consumed_env_steps) == (1, 250)
    finally:
        first.close()
        second.close()


def test_rqrl_eval_of_a_learner_checkpoint_says_what_it_is(fake_redis, small_cfg, tmp_path, capsys):
    """The run folder's ckpt/latest.pth (the learner's checkpoint, copied from Redis as the
    coordinator's resume point does) is refused in one line that points to final.pt / best.pt."""
    from common import blobstore, keys
    from coordinator import evaluate

    cfg = EasyDict(copy.deepcopy(small_cfg))
    store = CheckpointStore(fake_redis, "ckpt_test", Path(tmp_path / "unused"))
    learner = _learner(cfg, store, tmp_path, seed=1)
    try:
        learner.train(dqn_batch(n=16, seed=0), envstep=100)
        learner.save_checkpoint("latest")
    finally:
        learner.close()
    path = tmp_path / "latest.pth"
    path.write_bytes(blobstore.get_versioned(fake_redis, keys.ckpt("ckpt_test", "latest"))[1])
    assert evaluate.main([str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a learner checkpoint" in err[0] and "final.pt or best.pt" in err[0], err


def test_the_resumable_checkpoint_is_also_saved_by_time_where_iterations_are_long(fake_redis, small_cfg, tmp_path):
    """``save_ckpt_every_s`` saves 'latest' before ``save_ckpt_after_iter`` iterations are reached
    (the default 500 PPO iterations are ~1 M env steps); with it at 0 only the count does."""
    cfg = EasyDict(copy.deepcopy(small_cfg))
    store = CheckpointStore(fake_redis, "ckpt_test", Path(tmp_path / "unused"))
    learners = []
    for seed, every_s in ((1, 1e-9), (2, 0.0)):
        lcfg = copy.deepcopy(cfg.policy.learn.learner)
        lcfg.hook.update(log_show_after_iter=0, save_ckpt_after_iter=500, save_ckpt_every_s=every_s,
                         save_ckpt_after_run=False, load_ckpt_before_run="")
        learners.append(BaseLearner(lcfg, make_dqn(cfg, seed=seed), exp_name="ckpt_test",
                                    log_dir=str(tmp_path / f"log{seed}"), checkpoint_store=store))
    timed, counted = learners
    try:
        counted.train(dqn_batch(n=16, seed=0), envstep=100)
        assert store.load("latest", CPU) is None  # one iteration of 500, no time bound: nothing saved
        for i in range(2):
            timed.train(dqn_batch(n=16, seed=i), envstep=100 * (i + 1))
            assert store.load("latest", CPU)["train_iter"] == i + 1  # saved at every iteration: the bound has passed
    finally:
        for learner in learners:
            learner.close()
