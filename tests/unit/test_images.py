"""Image observations: layout detection, the conv encoder's input, and uint8 from the adder to the batch."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from common import serialization, spaces
from common.config import compile_config
from common.policy import create_policy, nets
from common.policy.nstep import NStepAdder
from workers.replay_buffer import ReplayBuffer, check_chunk

ACT = gym.spaces.Discrete(3)


@pytest.mark.parametrize("shape,layout,chw", [
    ((84, 84), "hw", (1, 84, 84)),
    ((4, 84, 84), "chw", (4, 84, 84)),
    ((210, 160, 3), "hwc", (3, 210, 160)),
    ((3, 3, 3), "hwc", (3, 3, 3)),  # a tie goes to channels-last
])
def test_uint8_boxes_are_images_with_their_channel_axis_detected(shape, layout, chw):
    spec = spaces.from_spaces("X-v0", gym.spaces.Box(0, 255, shape, np.uint8), ACT)
    assert (spec.obs_kind, spec.obs_layout, spec.image_chw, spec.obs_dtype) == ("image", layout, chw, np.uint8)
    assert spaces.SpaceSpec.from_dict(spec.to_dict()) == spec


def test_uint8_bool_and_integer_vectors_and_wide_integer_grids_are_refused_by_name():
    with pytest.raises(spaces.SpaceError, match="'X-v0'.*uint8 Box observation is an image or grid and must be 2-D"):
        spaces.from_spaces("X-v0", gym.spaces.Box(0, 255, (7,), np.uint8), ACT)
    with pytest.raises(spaces.SpaceError, match="'X-v0'.*bool Box observation .* must be 2-D"):
        spaces.from_spaces("X-v0", gym.spaces.Box(0, 1, (7,), bool), ACT)
    with pytest.raises(spaces.SpaceError, match=r"dtype int16 with bounds \[-1, 5\].*within \[0, 255\]"):
        spaces.from_spaces("X-v0", gym.spaces.Box(-1, 5, (8, 8), np.int16), ACT)
    with pytest.raises(spaces.SpaceError, match=r"dtype int32 with bounds \[0, 1000\]"):
        spaces.from_spaces("X-v0", gym.spaces.Box(0, 1000, (8, 8), np.int32), ACT)


@pytest.mark.parametrize("box, layout, high", [
    (gym.spaces.Box(0, 1, (10, 10, 4), bool), "hwc", 1.0),  # MinAtar Breakout's grid
    (gym.spaces.Box(0, 1, (10, 10), np.uint8), "hw", 1.0),  # a binary grid as uint8
    (gym.spaces.Box(0, 5, (3, 8, 8), np.int64), "chw", 5.0),  # categories 0..5
    (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), "chw", 255.0),  # pixels
])
def test_bool_and_small_integer_grids_are_image_channels_stored_as_uint8(box, layout, high):
    spec = spaces.from_spaces("Grid-v0", box, ACT)
    assert (spec.obs_kind, spec.obs_layout, spec.image_high, spec.obs_dtype) == ("image", layout, high, np.uint8)
    assert spaces.SpaceSpec.from_dict(spec.to_dict()) == spec
    box.seed(0)
    obs = np.stack([box.sample() for _ in range(3)])
    stored = spec.obs_batch(obs)
    assert stored.dtype == np.uint8 and stored.shape == obs.shape
    np.testing.assert_array_equal(stored, obs.astype(np.int64))  # 0/1 for bool, categories as they are


def test_an_integer_grid_value_outside_its_uint8_range_is_refused_not_wrapped():
    spec = spaces.from_spaces("Grid-v0", gym.spaces.Box(0, 5, (8, 8), np.int32), ACT)
    obs = np.zeros((1, 8, 8), np.int32)
    obs[0, 2, 3] = 300  # an env breaking its own bounds: uint8 would store 44
    with pytest.raises(spaces.SpaceError, match=r"'Grid-v0'.*holds 0\.\.300"):
        spec.obs_batch(obs)


def test_the_scale_to_0_1_follows_the_box_high_not_the_dtype():
    rng = np.random.default_rng(0)
    cpu = torch.device("cpu")
    # A uint8 Box(0, 1) grid: its 1s are 1.0, not 1/255.
    grid = spaces.from_spaces("G-v0", gym.spaces.Box(0, 1, (10, 10, 4), np.uint8), ACT)
    x = rng.integers(0, 2, (2, 10, 10, 4)).astype(np.uint8)
    torch.testing.assert_close(nets.obs_tensor(grid, x, cpu), torch.from_numpy(x.transpose(0, 3, 1, 2)).float())
    # A bool grid, stored as uint8 0/1: the same.
    binary = spaces.from_spaces("B-v0", gym.spaces.Box(0, 1, (10, 10, 4), bool), ACT)
    stored = binary.obs_batch(x.astype(bool))
    torch.testing.assert_close(nets.obs_tensor(binary, stored, cpu), torch.from_numpy(x.transpose(0, 3, 1, 2)).float())
    # Categories 0..5 divide by 5; pixels by 255.
    cat = spaces.from_spaces("C-v0", gym.spaces.Box(0, 5, (8, 8), np.int64), ACT)
    c = rng.integers(0, 6, (2, 8, 8))
    torch.testing.assert_close(nets.obs_tensor(cat, cat.obs_batch(c), cpu), torch.from_numpy(c[:, None]).float() / 5)
    pix = spaces.from_spaces("P-v0", gym.spaces.Box(0, 255, (8, 8), np.uint8), ACT)
    p = rng.integers(0, 256, (2, 8, 8), dtype=np.uint8)
    torch.testing.assert_close(nets.obs_tensor(pix, p, cpu), torch.from_numpy(p[:, None]).float() / 255)


def test_a_bool_grid_stays_uint8_from_the_adder_through_a_chunk_and_the_replay_buffer_to_a_learn_step():
    spec = spaces.from_spaces("Grid-v0", gym.spaces.Box(0, 1, (10, 10, 4), bool), ACT)
    cfg = compile_config({"policy": {"model": {"conv": [[16, 3, 1]], "hidden_size_list": [32]},
                                     "learn": {"batch_size": 8}}})
    spaces.check_model(cfg, spec)
    policy = create_policy(cfg, spec)
    assert policy.schema()["obs"] == ((10, 10, 4), np.uint8)
    rng = np.random.default_rng(2)
    adder = NStepAdder(2, 1, 0.9)
    obs = spec.obs_batch(rng.random((2, 10, 10, 4)) < 0.1)
    rows = None
    for _ in range(6):
        nxt = spec.obs_batch(rng.random((2, 10, 10, 4)) < 0.1)
        _, record = policy.act(obs, {"eps": 0.5}, rng)
        rows = adder.add(obs, record, np.ones(2), nxt, np.zeros(2, bool), np.zeros(2, bool)) or rows
        obs = nxt
    assert rows["obs"].dtype == np.uint8 and set(np.unique(rows["obs"])) <= {0, 1}
    chunk = serialization.loads(serialization.dumps(rows))
    buf = ReplayBuffer(100, policy.schema())
    buf.extend(chunk, 0)
    batch = buf.sample(8, rng)
    assert batch["obs"].dtype == np.uint8 and batch["next_obs"].dtype == np.uint8
    before = {k: v.copy() for k, v in policy.get_weights().items()}
    assert np.isfinite(policy.learn(batch)["total_loss"])
    assert any(not np.array_equal(before[k], v) for k, v in policy.get_weights().items())


def test_a_spec_saved_before_images_loads_as_a_flat_box():
    d = spaces.from_spaces("X-v0", gym.spaces.Box(-1, 1, (4,), np.float32), ACT).to_dict()
    del d["obs_layout"], d["image_high"]
    assert spaces.SpaceSpec.from_dict(d).obs_kind == "box"


def test_a_spec_saved_before_grids_loads_with_the_pixel_scale():
    d = spaces.from_spaces("X-v0", gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), ACT).to_dict()
    del d["image_high"]
    assert spaces.SpaceSpec.from_dict(d).image_high == 255.0


def test_obs_tensor_scales_on_the_device_and_puts_channels_first_for_every_layout():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (2, 2, 6, 5), dtype=np.uint8)  # (B, C, H, W)
    for layout, stored in (("chw", img), ("hwc", img.transpose(0, 2, 3, 1)), ("hw", img[:, :1, :, :][:, 0])):
        spec = spaces.from_spaces("X-v0", gym.spaces.Box(0, 255, stored.shape[1:], np.uint8), ACT)
        assert spec.obs_layout == layout
        x = nets.obs_tensor(spec, stored, torch.device("cpu"))
        want = img if layout != "hw" else img[:, :1]
        assert x.dtype == torch.float32 and tuple(x.shape) == want.shape
        torch.testing.assert_close(x, torch.from_numpy(want).float() / 255)


def test_wrong_conv_configs_fail_in_one_line_naming_the_key():
    spec = spaces.from_spaces("X-v0", gym.spaces.Box(0, 255, (1, 20, 20), np.uint8), ACT)
    cfg = compile_config({})
    with pytest.raises(spaces.SpaceError, match=r"policy.model.conv.*\(1, 20, 20\).*to nothing"):
        spaces.check_model(cfg, spec)
    cfg = compile_config({"policy": {"model": {"conv": [[16, 3]]}}})
    with pytest.raises(spaces.SpaceError, match=r"policy.model.conv' must be"):
        spaces.check_model(cfg, spec)
    cfg = compile_config({"policy": {"model": {"obs_shape": 400}}})
    with pytest.raises(spaces.SpaceError, match=r"policy.model.obs_shape' is 400"):
        spaces.check_model(cfg, spec)


def test_uint8_stays_uint8_from_the_adder_through_a_chunk_and_the_replay_buffer_to_the_batch():
    spec = spaces.from_spaces("X-v0", gym.spaces.Box(0, 255, (4, 36, 36), np.uint8), ACT)
    cfg = compile_config({})
    spaces.check_model(cfg, spec)
    policy = create_policy(cfg, spec)
    schema = policy.schema()
    assert schema["obs"] == ((4, 36, 36), np.uint8) and schema["next_obs"] == ((4, 36, 36), np.uint8)
    rng = np.random.default_rng(1)
    adder = NStepAdder(2, 1, 0.9)
    obs = spec.obs_batch(rng.integers(0, 256, (2, 4, 36, 36), dtype=np.uint8))
    rows = None
    for _ in range(3):
        nxt = spec.obs_batch(rng.integers(0, 256, (2, 4, 36, 36), dtype=np.uint8))
        _, record = policy.act(obs, {"eps": 0.5}, rng)
        rows = adder.add(obs, record, np.ones(2), nxt, np.zeros(2, bool), np.zeros(2, bool)) or rows
        obs = nxt
    assert rows["obs"].dtype == np.uint8
    payload = serialization.dumps(rows)
    # Pixels travel as one byte each: the chunk is its two image fields plus a few hundred bytes.
    assert len(payload) < 2 * rows["obs"].nbytes + 512
    chunk = serialization.loads(payload)
    buf = ReplayBuffer(100, schema)
    assert buf.check(chunk, "chunk") == len(rows["obs"])
    buf.extend(chunk, 0)
    assert buf._data["obs"].dtype == np.uint8
    batch = buf.sample(8, rng)
    assert batch["obs"].dtype == np.uint8 and batch["next_obs"].dtype == np.uint8
    assert np.isfinite(policy.learn(batch)["total_loss"])


def test_a_chunk_with_float_pixels_is_refused_where_the_schema_keeps_uint8():
    schema = {"obs": ((2, 2), np.dtype(np.uint8))}
    with pytest.raises(ValueError, match="'obs' has dtype float32, expected uint8"):
        check_chunk(schema, {"obs": np.zeros((3, 2, 2), np.float32)}, "chunk")
    assert check_chunk(schema, {"obs": np.zeros((3, 2, 2), np.uint8)}, "chunk") == 3


def test_ppo_and_sac_learn_from_uint8_images():
    spec = spaces.from_spaces("X-v0", gym.spaces.Box(0, 255, (36, 36, 3), np.uint8), ACT)
    cfg = compile_config({"policy": {"learn": {"batch_size": 8}}}, {"policy": {"type": "ppo"}})
    spaces.check_model(cfg, spec)
    policy = create_policy(cfg, spec)
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (16, 36, 36, 3), dtype=np.uint8)
    _, record = policy.act(obs, {}, rng)
    batch = dict(record, obs=obs, adv=np.ones(16, np.float32), ret=np.ones(16, np.float32))
    assert np.isfinite(policy.learn(batch)["total_loss"])
    # SAC: Box actions from pixels, a conv torso in the actor and in each critic.
    box = spaces.from_spaces("X-v0", gym.spaces.Box(0, 255, (36, 36, 3), np.uint8), gym.spaces.Box(-2, 2, (2,)))
    cfg = compile_config({"policy": {"learn": {"batch_size": 8}}}, {"policy": {"type": "sac"}})
    spaces.check_model(cfg, box)
    sac = create_policy(cfg, box, device="cpu")
    assert sac.schema()["obs"] == ((36, 36, 3), np.dtype(np.uint8))
    env_action, _ = sac.act(obs, {}, rng)
    assert env_action.shape == (16, 2) and np.all(np.abs(env_action) <= 2.0)
    before = {k: v.copy() for k, v in sac.get_weights().items()}
    batch = {"obs": obs, "action": rng.uniform(-1, 1, (16, 2)).astype(np.float32),
             "reward": rng.normal(size=16).astype(np.float32), "next_obs": obs[::-1].copy(),
             "done": np.zeros(16, bool), "discount": np.full(16, 0.99, np.float32)}
    info = sac.learn(batch)
    assert all(np.isfinite(v) for v in info.values() if isinstance(v, float))
    after = sac.get_weights()
    conv = [k for k in after if ".torso." in k or ".0.net.0." in k]
    assert conv and any(not np.array_equal(before[k], after[k]) for k in conv), "the actor's conv torso did not learn"
