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


def test_other_integer_boxes_and_uint8_vectors_are_refused_by_name():
    with pytest.raises(spaces.SpaceError, match="'X-v0'.*must be 2-D"):
        spaces.from_spaces("X-v0", gym.spaces.Box(0, 255, (7,), np.uint8), ACT)
    with pytest.raises(spaces.SpaceError, match="dtype int16"):
        spaces.from_spaces("X-v0", gym.spaces.Box(0, 255, (8, 8), np.int16), ACT)


def test_a_spec_saved_before_images_loads_as_a_flat_box():
    d = spaces.from_spaces("X-v0", gym.spaces.Box(-1, 1, (4,), np.float32), ACT).to_dict()
    del d["obs_layout"]
    assert spaces.SpaceSpec.from_dict(d).obs_kind == "box"


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
