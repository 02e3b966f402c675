"""common/policy/nets.py's ``to_device``: the one way a sampled batch becomes tensors.

On the CPU it is ``torch.as_tensor`` and never pins; on CUDA it stages in pinned memory and
copies without blocking (that half runs only where CUDA exists). Every algorithm's ``learn``
moves each batch field through it, so the CUDA staging covers all of them.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from common import spaces
from common.config import compile_config
from common.policy import create_policy, nets
from common.spaces import SpaceSpec

CPU = torch.device("cpu")
CARTPOLE = SpaceSpec("CartPole-v1", "box", (4,), 0, 0, "discrete", 2, 0, 0, (), ())
PENDULUM = SpaceSpec("Pendulum-v1", "box", (3,), 0, 0, "box", 0, 0, 1, (-2.0,), (2.0,))


def _arrays() -> list[tuple[np.ndarray, torch.dtype | None]]:
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(8, 4)).astype(np.float32), torch.float32),
            (rng.normal(size=(8, 4)), torch.float32),  # float64 rows, cast down
            (rng.random(8) < 0.5, torch.float32),  # done flags
            (rng.integers(0, 256, (8, 3, 5)).astype(np.uint8), None),  # image rows stay uint8
            (rng.integers(0, 6, 8), torch.int64)]


@pytest.fixture
def no_pinning(monkeypatch):
    def refuse(self, *a, **k):
        raise AssertionError("pin_memory called on the CPU path")
    monkeypatch.setattr(torch.Tensor, "pin_memory", refuse)


def test_cpu_path_is_torch_as_tensor_and_never_pins(no_pinning):
    for x, dtype in _arrays():
        got = nets.to_device(x, CPU, dtype)
        want = torch.as_tensor(x, dtype=dtype, device=CPU)
        assert got.dtype == want.dtype and got.device == CPU
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    x = np.arange(6, dtype=np.float32)
    assert nets.to_device(x, CPU, torch.float32).data_ptr() == x.ctypes.data  # still zero-copy, as before


def test_obs_tensor_on_the_cpu_never_pins(no_pinning):
    pix = spaces.from_spaces("P-v0", gym.spaces.Box(0, 255, (6, 6), np.uint8), gym.spaces.Discrete(2))
    p = np.random.default_rng(1).integers(0, 256, (2, 6, 6)).astype(np.uint8)
    torch.testing.assert_close(nets.obs_tensor(pix, p, CPU), torch.from_numpy(p[:, None]).float() / 255)


def _batch(policy, weight: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for k, (shape, dt) in policy.schema().items():
        dt = np.dtype(dt)
        out[k] = (rng.random((16, *shape)) < 0.2 if dt.kind == "b"
                  else rng.integers(0, 2, (16, *shape)).astype(dt) if dt.kind in "iu"
                  else rng.normal(size=(16, *shape)).astype(dt))
    if weight:
        out["weight"] = np.ones(16, np.float32)
    return out


@pytest.mark.parametrize("algo,spec,weight", [("dqn", CARTPOLE, True), ("ppo", CARTPOLE, False),
                                              ("sac", PENDULUM, True)])
def test_every_learn_moves_each_batch_field_through_to_device(algo, spec, weight, monkeypatch, no_pinning):
    cfg = compile_config({"exp_name": "t", "policy": {"learn": {"batch_size": 16}}}, {"policy": {"type": algo}})
    torch.manual_seed(0)
    policy = create_policy(cfg, spec, modes=("learn",), device="cpu")
    batch = _batch(policy, weight)
    moved: set[int] = set()
    real = nets.to_device

    def spy(x, device, dtype=None):
        moved.add(id(x))
        return real(x, device, dtype)

    monkeypatch.setattr(nets, "to_device", spy)
    policy.learn(batch)
    missed = [k for k, v in batch.items() if id(v) not in moved]
    assert not missed, f"{algo}.learn made tensors of {missed} without nets.to_device"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_path_lands_on_the_device_with_the_same_values():
    dev = torch.device("cuda")
    for x, dtype in _arrays():
        got = nets.to_device(x, dev, dtype)
        want = torch.as_tensor(x, dtype=dtype)
        assert got.device.type == "cuda" and got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    on_dev = torch.ones(3, device=dev)
    assert nets.to_device(on_dev, dev, torch.float32).data_ptr() == on_dev.data_ptr()  # no round trip


def test_get_weights_are_float32_copies_that_training_does_not_change():
    """nets.get_weights copies CPU float32 tensors with numpy and casts anything else (float64 here)
    through torch: either way the arrays are float32 and owned, so a later step leaves them be."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2).double())
    weights = nets.get_weights(model)
    assert {k: v.dtype for k, v in weights.items()} == {k: np.dtype(np.float32) for k in model.state_dict()}
    before = {k: v.copy() for k, v in weights.items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    for k, v in weights.items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
