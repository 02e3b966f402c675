"""Unit tests for common/spaces.py: every classic-control / toy-text space trains or is refused at start."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import psutil
import pytest
import torch
from easydict import EasyDict
from gymnasium import spaces as gs

from common import spaces
from common.config import compile_config
from common.policy import create_policy
from common.spaces import SpaceError, SpaceSpec
from tests.conftest import REPO, newest_env_id
from tests.fakes import FakeComm

SHIFTED_ID = "RqrlTestShiftedActions-v0"
IMAGE_ID = "RqrlTestImageObs-v0"


class ShiftedActionEnv(gym.Env):
    """Box(2,) observations, actions Discrete(3, start=-1): the env checks every action it gets."""

    observation_space = gs.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gs.Discrete(3, start=-1)

    def __init__(self) -> None:
        self.seen: list[int] = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), f"action {action!r} outside {self.action_space}"
        self.seen.append(int(action))
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), 0.0, False, False, {}


class ImageEnv(gym.Env):
    """uint8 H x W x C observations, too small for the default conv torso."""

    observation_space = gs.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = gs.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros((8, 8, 3), np.uint8), {}

    def step(self, action):
        return np.zeros((8, 8, 3), np.uint8), 0.0, True, False, {}


for _id, _cls in ((SHIFTED_ID, ShiftedActionEnv), (IMAGE_ID, ImageEnv)):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_cls)




def cfg_for(env_id: str, algo: str = "dqn", **model) -> EasyDict:
    """A compiled config for ``env_id`` with tiny networks (shapes left to the env unless given)."""
    if algo == "dqn":
        m = {"hidden_size_list": [16]}
    else:
        m = {"encoder_hidden_size_list": [16], "actor_head_hidden_size": 16, "critic_head_hidden_size": 16}
    m.update(model)
    return compile_config({"exp_name": "spaces_test", "env": {"env_id": env_id}, "policy": {"model": m}},
                          {"policy": {"type": algo}})


# ---------------------------------------------------------------- classic control and toy text

BOX_ENVS = [
    # env id, obs shape, action kind, action_n / action_dim, bounds
    ("CartPole-v1", (4,), "discrete", 2, None),
    ("Acrobot-v1", (6,), "discrete", 3, None),
    ("MountainCar-v0", (2,), "discrete", 3, None),
    ("MountainCarContinuous-v0", (2,), "box", 1, ((-1.0,), (1.0,))),
    ("Pendulum-v1", (3,), "box", 1, ((-2.0,), (2.0,))),
]

DISCRETE_OBS_ENVS = [("FrozenLake-v1", 16, 4), (newest_env_id("Taxi"), 500, 6), (newest_env_id("CliffWalking"), 48, 4)]


@pytest.mark.parametrize("env_id,obs_shape,kind,n,bounds", BOX_ENVS)
def test_box_observation_envs(env_id, obs_shape, kind, n, bounds):
    spec = spaces.probe(cfg_for(env_id))
    assert spec.env_id == env_id
    assert (spec.obs_kind, spec.obs_shape, spec.obs_dim, spec.obs_dtype) == ("box", obs_shape, obs_shape[0], np.float32)
    assert spec.model_obs_shape == obs_shape[0]
    assert spec.action_kind == kind
    assert spec.model_action_shape == n
    if kind == "discrete":
        assert (spec.action_n, spec.action_start, spec.action_dim) == (n, 0, 0)
    else:
        assert (spec.action_n, spec.action_dim) == (0, n)
        assert (spec.action_low, spec.action_high) == bounds
    # Plain data: survives a round trip through a checkpoint / JSON.
    assert SpaceSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("env_id,n_obs,n_act", DISCRETE_OBS_ENVS)
def test_discrete_observation_envs_are_int64_scalars(env_id, n_obs, n_act):
    spec = spaces.probe(cfg_for(env_id))
    assert (spec.obs_kind, spec.obs_shape, spec.obs_n, spec.obs_dim) == ("discrete", (), n_obs, n_obs)
    assert spec.obs_dtype == np.int64
    assert spec.model_obs_shape == n_obs
    assert (spec.action_kind, spec.action_n) == ("discrete", n_act)
    env = gym.make(env_id)
    try:
        obs, _ = env.reset(seed=0)
        stored = spec.obs_batch(np.asarray([obs, obs]))
        assert stored.dtype == np.int64 and stored.shape == (2,)
        assert stored[0] == int(obs)
    finally:
        env.close()


def test_discrete_observation_with_start_is_stored_as_index():
    spec = spaces.from_spaces("X-v0", gs.Discrete(5, start=10), gs.Discrete(2))
    np.testing.assert_array_equal(spec.obs_batch(np.array([10, 14])), [0, 4])
    assert spec.obs_batch(np.array([10, 14])).dtype == np.int64


@pytest.mark.parametrize("env_id,algo", [(e[0], a) for e in BOX_ENVS for a in ("dqn", "ppo") if not (e[2] == "box" and a == "dqn")]
                         + [(e[0], a) for e in DISCRETE_OBS_ENVS for a in ("dqn", "ppo")])
def test_policies_act_on_every_supported_env(env_id, algo):
    """Spaces read from the env are enough to build the policy and step the real env with its actions."""
    cfg = cfg_for(env_id, algo)
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    torch.manual_seed(0)
    policy = create_policy(cfg, spec, modes=("collect", "eval"), device="cpu")
    env = gym.make(env_id)
    try:
        obs, _ = env.reset(seed=0)
        batch = spec.obs_batch(np.asarray(obs)[None])
        setting = {"eps": 0.5} if algo == "dqn" else {}
        env_action, record = policy.act(batch, setting, np.random.default_rng(0))
        for a in (env_action[0], policy.act_eval(batch, np.random.default_rng(0))[0]):
            assert env.action_space.contains(np.asarray(a, dtype=env.action_space.dtype)), (env_id, a)
            env.step(a)
        for name, (shape, dtype) in policy.schema().items():
            if name in record:
                assert record[name].shape == (1, *shape) and record[name].dtype == dtype, (name, record[name])
    finally:
        env.close()


def test_dqn_refuses_box_actions_by_name():
    cfg = cfg_for("Pendulum-v1", "dqn")
    spec = spaces.probe(cfg)
    with pytest.raises(SpaceError, match="Pendulum-v1.*Box") as e:
        create_policy(cfg, spec, modes=("eval",), device="cpu")
    assert "\n" not in str(e.value)


def test_blackjack_tuple_observation_refused_in_one_line():
    with pytest.raises(SpaceError) as e:
        spaces.probe(cfg_for("Blackjack-v1"))
    msg = str(e.value)
    assert "\n" not in msg
    assert "Blackjack-v1" in msg and "Tuple" in msg and "observation" in msg


def test_unknown_env_id_refused_naming_the_key():
    with pytest.raises(SpaceError, match="NoSuchEnv-v9.*env.env_id"):
        spaces.probe(cfg_for("NoSuchEnv-v9"))


# ---------------------------------------------------------------- Discrete actions with a start

def test_dqn_actions_of_discrete_with_negative_start():
    cfg = cfg_for(SHIFTED_ID)
    cfg.policy.eval.eps = 0.0  # greedy evals
    spec = spaces.probe(cfg)
    assert (spec.action_kind, spec.action_n, spec.action_start) == ("discrete", 3, -1)
    spaces.check_model(cfg, spec)
    torch.manual_seed(0)
    policy = create_policy(cfg, spec, modes=("collect", "eval"), device="cpu")
    obs = np.random.default_rng(1).uniform(-1, 1, (256, 2)).astype(np.float32)

    greedy = policy.act_eval(obs, np.random.default_rng(0))
    assert greedy.min() >= -1 and greedy.max() <= 1
    with torch.no_grad():
        q = policy.model(torch.as_tensor(obs))
    np.testing.assert_array_equal(greedy, q.argmax(dim=1).numpy() - 1)

    # Full exploration reaches every action; the stored index is the env action minus start.
    env_action, record = policy.act(obs, {"eps": 1.0}, np.random.default_rng(2))
    assert set(env_action.tolist()) == {-1, 0, 1}
    np.testing.assert_array_equal(record["action"], env_action + 1)
    assert record["action"].min() == 0 and record["action"].max() == 2

    # The real env accepts them (it asserts action_space.contains).
    env = gym.make(SHIFTED_ID)
    try:
        env.reset(seed=0)
        for a in env_action[:20]:
            env.step(a)
        env.step(greedy[0])
    finally:
        env.close()


def test_ppo_actions_of_discrete_with_negative_start():
    cfg = cfg_for(SHIFTED_ID, "ppo")
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    torch.manual_seed(0)
    policy = create_policy(cfg, spec, modes=("collect", "eval"), device="cpu")
    obs = np.random.default_rng(1).uniform(-1, 1, (512, 2)).astype(np.float32)
    env_action, record = policy.act(obs, {}, np.random.default_rng(2))
    assert set(env_action.tolist()) == {-1, 0, 1}  # near-uniform initial policy
    np.testing.assert_array_equal(record["action"], env_action + 1)
    greedy = policy.act_eval(obs, np.random.default_rng(0))
    assert greedy.min() >= -1 and greedy.max() <= 1


# ---------------------------------------------------------------- refused spaces

def test_a_small_uint8_image_is_read_as_an_image_and_the_default_torso_refused_in_one_line():
    cfg = cfg_for(IMAGE_ID)
    spec = spaces.probe(cfg)
    assert (spec.obs_kind, spec.obs_layout, spec.obs_shape) == ("image", "hwc", (8, 8, 3))
    with pytest.raises(SpaceError) as e:
        spaces.check_model(cfg, spec)
    msg = str(e.value)
    assert "\n" not in msg
    assert IMAGE_ID in msg and "policy.model.conv" in msg and "(8, 8, 3)" in msg
    cfg.policy.model.conv = [[8, 3, 1]]
    spaces.check_model(cfg, spec)  # a torso that fits is accepted


@pytest.mark.parametrize("obs,act,words", [
    (gs.Box(0, 10, (3,), np.int32), gs.Discrete(2), ("observation", "int32")),
    (gs.MultiDiscrete([2, 3]), gs.Discrete(2), ("observation", "MultiDiscrete")),
    (gs.Box(-1, 1, (2,), np.float32), gs.MultiBinary(3), ("action", "MultiBinary")),
    (gs.Box(-1, 1, (2,), np.float32), gs.Box(-np.inf, np.inf, (2,), np.float32), ("action", "finite")),
    (gs.Box(-1, 1, (2,), np.float32), gs.Box(-1, 1, (2, 2), np.float32), ("action", "1-D")),
])
def test_other_unsupported_spaces_refused_by_name(obs, act, words):
    with pytest.raises(SpaceError) as e:
        spaces.from_spaces("Some-v0", obs, act)
    msg = str(e.value)
    assert "Some-v0" in msg and "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_multi_dimensional_float_box_observation():
    spec = spaces.from_spaces("Grid-v0", gs.Box(-1, 1, (2, 3), np.float32), gs.Discrete(2))
    assert spec.obs_shape == (2, 3) and spec.obs_dim == 6 and spec.model_obs_shape == [2, 3]


# ---------------------------------------------------------------- check_model

def test_check_model_fills_unset_shapes():
    cfg = cfg_for("Acrobot-v1")
    assert cfg.policy.model.obs_shape is None and cfg.policy.model.action_shape is None
    spaces.check_model(cfg, spaces.probe(cfg))
    assert cfg.policy.model.obs_shape == 6 and cfg.policy.model.action_shape == 3


def test_check_model_accepts_agreeing_values():
    cfg = cfg_for("Acrobot-v1", obs_shape=6, action_shape=3)
    spaces.check_model(cfg, spaces.probe(cfg))
    assert cfg.policy.model.obs_shape == 6 and cfg.policy.model.action_shape == 3
    cfg = cfg_for("Acrobot-v1", obs_shape=[6])
    spaces.check_model(cfg, spaces.probe(cfg))


def test_check_model_refuses_disagreeing_action_shape():
    cfg = cfg_for("Acrobot-v1", action_shape=2)
    with pytest.raises(SpaceError) as e:
        spaces.check_model(cfg, spaces.probe(cfg))
    msg = str(e.value)
    assert "\n" not in msg
    assert "policy.model.action_shape" in msg and "Acrobot-v1" in msg and "Discrete(3)" in msg


def test_check_model_refuses_disagreeing_obs_shape():
    cfg = cfg_for("Acrobot-v1", obs_shape=4)
    with pytest.raises(SpaceError) as e:
        spaces.check_model(cfg, spaces.probe(cfg))
    msg = str(e.value)
    assert "\n" not in msg
    assert "policy.model.obs_shape" in msg and "Acrobot-v1" in msg and "(6,)" in msg


def test_check_model_refuses_box_action_size_mismatch():
    cfg = cfg_for("Pendulum-v1", "ppo", action_shape=2)
    with pytest.raises(SpaceError, match=r"policy\.model\.action_shape.*Pendulum-v1.*Box"):
        spaces.check_model(cfg, spaces.probe(cfg))


# ---------------------------------------------------------------- rqrl train refuses before launch

def test_rqrl_train_refuses_wrong_action_shape_before_launching(monkeypatch, capsys):
    from coordinator import cli, launcher
    from common import embedded_redis

    def must_not_run(*a, **k):
        raise AssertionError("rqrl train launched something despite a config that disagrees with the env")

    monkeypatch.setattr(launcher, "Launcher", must_not_run)
    monkeypatch.setattr(embedded_redis.EmbeddedRedis, "start", must_not_run)
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    rc = cli.main(["train", str(REPO / "deploy" / "configs" / "cartpole_dqn.py"),
                   "--set", "env.env_id=Acrobot-v1", "--set", "policy.model.action_shape=2"])

    err = capsys.readouterr().err.strip()
    assert rc == 1, err
    assert "policy.model.action_shape" in err and "Acrobot-v1" in err
    assert len(err.splitlines()) == 1, err
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before, "rqrl train started child processes"


# ---------------------------------------------------------------- a collector task on every space

@pytest.mark.parametrize("env_id,algo", [("Pendulum-v1", "ppo"), ("MountainCarContinuous-v0", "ppo"), ("Acrobot-v1", "dqn"),
                                         ("FrozenLake-v1", "dqn"), (newest_env_id("Taxi"), "ppo"), (newest_env_id("CliffWalking"), "dqn"),
                                         (SHIFTED_ID, "dqn"), (SHIFTED_ID, "ppo")])
def test_collector_task_produces_schema_rows_the_policy_learns_from(env_id, algo):
    """In process, no Redis: a collector task's chunks follow the policy schema (shape and dtype) and
    one learn step on them gives finite figures, for every supported space."""
    from workers.collector import Collector

    model = {"hidden_size_list": [16]} if algo == "dqn" else \
        {"encoder_hidden_size_list": [16], "actor_head_hidden_size": 16, "critic_head_hidden_size": 16}
    cfg = compile_config({"exp_name": "spaces_test", "env": {"env_id": env_id, "collector_env_num": 2},
                          "policy": {"model": model, "learn": {"batch_size": 16},
                                     "collect": {"n_sample": 16, "collector": {"task_env_steps": 64}}}},
                         {"policy": {"type": algo}})
    spec = spaces.probe(cfg)
    learner_cfg = copy.deepcopy(cfg)
    spaces.check_model(learner_cfg, spec)
    torch.manual_seed(0)
    learner = create_policy(learner_cfg, spec, modes=("learn",), device="cpu")
    comm = FakeComm(learner.get_weights())
    setting = {"eps": 0.5} if algo == "dqn" else {"rollout_rows": 16}
    task = {"eval_flag": False, "seed": 0, "task_id": "t1", "collect_setting": setting, "envstep": 0}
    info = Collector(cfg, task, comm).run()
    assert info["env_steps"] == 64
    assert comm.sent and sum(m["env_steps"] for m in comm.meta) == 64
    schema = learner.schema()
    for arrays in comm.sent:
        assert set(arrays) == set(schema)
        n = len(arrays["obs"])
        for name, (shape, dtype) in schema.items():
            assert arrays[name].shape == (n, *shape) and arrays[name].dtype == dtype, (name, arrays[name].dtype)
    batch = {k: np.concatenate([a[k] for a in comm.sent]) for k in schema}
    assert len(batch["obs"]) == 64  # every env step became one row (n-step / GAE rows, flushed at the end)
    figures = learner.learn(batch)
    assert all(np.isfinite(v) for v in figures.values()), figures
