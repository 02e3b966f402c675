"""What a policy needs to know about an env's spaces, read from the env itself.

:class:`SpaceSpec` describes the observation and action spaces in plain data (it travels in
checkpoints and is rebuilt in every process that builds the env). :func:`resolve` fills
``policy.model.obs_shape`` / ``action_shape`` from the env when the config leaves them unset,
and refuses a set value that disagrees, in one line naming the env id, the space and the key.

Supported (anything else is refused at start, by name):

    observation  Box of any shape, float dtype   -> float32 (*shape)
                 Box 2-D or 3-D of uint8, bool, or another integer dtype with bounds in [0, 255]
                 (an image or a grid)            -> uint8 (*shape) (see below)
                 Discrete(n, start)              -> int64 scalar (the index obs - start)
    action       Discrete(n, start)              -> the policy picks an index in [0, n); the env gets index + start
                 Box(low, high, (A,)), finite    -> float32 (A,), clipped or rescaled to [low, high] by the policy

Images and grids. A 2-D or 3-D Box of uint8 (pixels), bool (binary channels: MinAtar's
(10, 10, C) grids) or another integer dtype whose bounds lie in [0, 255] (categorical
channels) is an image (``obs_kind="image"``): it is stored and sent as uint8 (bool as 0/1),
and the policy's conv encoder (common/policy/nets.py) scales it to [0, 1] on its own device by
the Box's ``high`` (``image_high``: 255 for pixels, 1 for a binary grid, so a ``Box(0, 1)`` uint8
grid is not divided by 255). ``obs_layout`` says where the channels are:

    (H, W)       "hw"    one channel (e.g. AtariPreprocessing's grey frame)
    (C, H, W)    "chw"   when the first axis is smaller than the last (FrameStackObservation of
                         grey frames: (4, 84, 84))
    (H, W, C)    "hwc"   otherwise, ties included (gymnasium's render / RGB convention: (210, 160, 3);
                         MinAtar's (10, 10, C))

Such a Box of another rank, or an integer Box with bounds outside [0, 255], is refused by name.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from common.policy import algorithm_of
from common.space_spec import SpaceError, SpaceSpec  # re-exported: most readers import them from here


def from_spaces(env_id: str, observation_space: Any, action_space: Any) -> SpaceSpec:
    """Describe gymnasium spaces, or refuse them.

    Raises:
        SpaceError: an unsupported space, naming the env id and the space.
    """
    from gymnasium import spaces as gs

    def refuse(what: str, space: Any, why: str) -> SpaceError:
        return SpaceError(f"env {env_id!r}: {what} space {space} is not supported: {why}")

    obs, act = observation_space, action_space
    layout, obs_high = "", 255.0
    if isinstance(obs, gs.Discrete):
        okind, oshape, on, ostart = "discrete", (), int(obs.n), int(obs.start)
    elif isinstance(obs, gs.Box):
        oshape = tuple(int(s) for s in obs.shape)
        if obs.dtype == np.bool_ or np.issubdtype(obs.dtype, np.integer):
            kind = {np.dtype(np.uint8): "uint8", np.dtype(np.bool_): "bool"}.get(np.dtype(obs.dtype), "integer")
            if len(oshape) not in (2, 3):
                raise refuse("observation", obs, f"a {kind} Box observation is an image or grid and must be 2-D "
                                                 "(H, W) or 3-D (C, H, W) / (H, W, C)")
            if obs.dtype == np.bool_:
                obs_high = 1.0
            else:
                lo, obs_high = float(np.min(obs.low)), float(np.max(obs.high))
                if lo < 0 or obs_high > 255 or obs_high <= 0:
                    raise refuse("observation", obs, f"dtype {obs.dtype} with bounds [{lo:g}, {obs_high:g}]; an "
                                                     "integer grid is stored as uint8 and needs bounds within "
                                                     "[0, 255] (and a high above 0)")
            layout = "hw" if len(oshape) == 2 else ("chw" if oshape[0] < oshape[-1] else "hwc")
            okind, on, ostart = "image", 0, 0
        elif not np.issubdtype(obs.dtype, np.floating):
            raise refuse("observation", obs, f"dtype {obs.dtype}; a Box observation must be a float dtype "
                                             "(or uint8, bool or small integers for an image or grid)")
        else:
            okind, on, ostart = "box", 0, 0
    else:
        raise refuse("observation", obs, "only Box (float, or uint8 / bool / small-integer images and grids) "
                                         "and Discrete observations are")
    if isinstance(act, gs.Discrete):
        return SpaceSpec(env_id, okind, oshape, on, ostart, "discrete", int(act.n), int(act.start), 0, (), (), layout,
                         obs_high)
    if isinstance(act, gs.Box):
        if len(act.shape) != 1:
            raise refuse("action", act, "a Box action must be 1-D")
        low, high = np.asarray(act.low, np.float64), np.asarray(act.high, np.float64)
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            raise refuse("action", act, "Box actions need finite bounds")
        return SpaceSpec(env_id, okind, oshape, on, ostart, "box", 0, 0, int(act.shape[0]),
                         tuple(float(x) for x in low), tuple(float(x) for x in high), layout, obs_high)
    raise refuse("action", act, "only Discrete and Box actions are")


def import_env_modules(names: list[str] | tuple[str, ...]) -> None:
    """Import the modules that register custom envs (``env.import_names``).

    Raises:
        SpaceError: a module cannot be imported (names it and the config key).
    """
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:
            raise SpaceError(f"config key 'env.import_names': cannot import {name!r} ({type(e).__name__}: {e}); "
                             "install it, or run from the folder that holds it (or set PYTHONPATH)") from None


def make_importable(*folders: str) -> None:
    """Append ``folders`` to ``sys.path`` (once each): where a run's custom env modules live (the
    config file's folder, the cwd), whichever command runs."""
    import sys

    for folder in folders:
        if folder not in sys.path:
            sys.path.append(folder)


def probe(cfg: Any) -> SpaceSpec:
    """Build one env of ``cfg.env`` (after ``env.import_names``; with its preset and wrappers,
    common/envs.py), read its spaces, close it.

    Raises:
        SpaceError: the env cannot be built (names ``env.env_id``) or has unsupported spaces.
    """
    from common import envs

    import_env_modules(list(cfg.env.get("import_names", [])))
    env_id = cfg.env.env_id
    try:
        env = envs.make(cfg.env, train=True)
    except envs.EnvConfigError as e:
        raise SpaceError(str(e)) from None
    except Exception as e:  # gymnasium raises several error types for an unknown id / bad kwargs
        raise SpaceError(f"cannot build env {env_id!r} (config key env.env_id / env.env_kwargs / env.wrappers): "
                         f"{type(e).__name__}: {e}") from None
    try:
        return from_spaces(env_id, env.observation_space, env.action_space)
    finally:
        env.close()


def check_model(cfg: Any, spec: SpaceSpec) -> None:
    """Fill unset ``policy.model.obs_shape`` / ``action_shape`` from ``spec``; refuse disagreeing ones,
    and, for an image observation, a ``policy.model.conv`` that is malformed or leaves no pixels.

    Mutates ``cfg.policy.model`` in place.

    Raises:
        SpaceError: a set value disagrees with the env, or the config's algorithm cannot act in
            the env's action space (``Algorithm.action_kinds``), in one line naming env id,
            space and key.
    """
    _check_action_kind(cfg, spec)
    model = cfg.policy.model
    obs_what = (f"observation space Discrete({spec.obs_n})" if spec.obs_kind == "discrete"
                else f"observation space shape {spec.obs_shape}")
    act_what = (f"action space Discrete({spec.action_n})" if spec.action_kind == "discrete"
                else f"action space Box of size {spec.action_dim}")
    for key, want, what in (("obs_shape", spec.model_obs_shape, obs_what),
                            ("action_shape", spec.model_action_shape, act_what)):
        got = model.get(key)
        if got is None:
            model[key] = want
        elif _norm(got) != _norm(want):
            raise SpaceError(f"config key 'policy.model.{key}' is {got!r} but env {spec.env_id!r} has {what} "
                             f"(expected {want!r}); leave it unset to read it from the env")
    if spec.obs_kind == "image":
        _check_conv(model.get("conv"), spec, spec.image_chw, f"image {spec.obs_shape} (layout {spec.obs_layout})")
    if model.get("board") is not None:
        _check_board(model.board, model.get("conv"), spec, obs_what)
    if cfg.policy.learn.get("mirror_board"):
        _check_mirror(model.get("board"), spec, obs_what, act_what)
    if model.get("action_mask") and not (spec.action_kind == "discrete" and spec.obs_kind == "box"
                                         and spec.obs_dim > spec.action_n):
        raise SpaceError(f"config key 'policy.model.action_mask' is set but env {spec.env_id!r} has {obs_what} and "
                         f"{act_what}: the flags of the legal actions must end a flat Box observation longer than "
                         "the number of actions (common/games.py)")


def _check_action_kind(cfg: Any, spec: SpaceSpec) -> None:
    algo = algorithm_of(cfg)
    if spec.action_kind not in algo.action_kinds:
        kind = {"box": "Box", "discrete": "Discrete"}
        space = (f"Discrete({spec.action_n})" if spec.action_kind == "discrete"
                 else f"Box of size {spec.action_dim}")
        raise SpaceError(f"env {spec.env_id!r} (config key 'env.env_id') has action space {space}, but "
                         f"create_config.policy.type {algo.name!r} needs "
                         f"{' or '.join(kind[k] for k in algo.action_kinds)} actions")


def conv_out_hw(hw: tuple[int, int], conv: list[list[int]]) -> tuple[int, int]:
    """Spatial size (H, W) after unpadded convs ``[[channels, kernel, stride], ...]`` (may reach <= 0)."""
    h, w = hw
    for _, k, st in conv:
        h, w = (h - int(k)) // int(st) + 1, (w - int(k)) // int(st) + 1
    return h, w


def _check_conv(conv: Any, spec: SpaceSpec, chw: tuple[int, int, int], what: str) -> None:
    if not (isinstance(conv, (list, tuple)) and conv and all(
            isinstance(layer, (list, tuple)) and len(layer) == 3 and all(isinstance(x, int) and x > 0 for x in layer)
            for layer in conv)):
        raise SpaceError(f"config key 'policy.model.conv' must be a non-empty list of [channels, kernel, stride] "
                         f"positive ints for the {what} of env {spec.env_id!r}, got {conv!r}")
    h, w = conv_out_hw(chw[1:], conv)
    if h < 1 or w < 1:
        raise SpaceError(f"config key 'policy.model.conv' {conv!r} shrinks env {spec.env_id!r}'s {what} to nothing; "
                         f"use smaller kernels or strides (the default Nature torso needs at least 36x36)")


def _check_board(board: Any, conv: Any, spec: SpaceSpec, obs_what: str) -> None:
    if not (isinstance(board, (list, tuple)) and len(board) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in board)):
        raise SpaceError(f"config key 'policy.model.board' must be [height, width, planes] positive ints, got {board!r}")
    h, w, c = board
    if spec.obs_kind != "box" or spec.obs_dim < h * w * c:
        raise SpaceError(f"config key 'policy.model.board' {list(board)!r} needs a flat Box observation of at least "
                         f"{h * w * c} values, but env {spec.env_id!r} has {obs_what}")
    _check_conv(conv, spec, (c, h, w), f"board {h}x{w}x{c}")


def _check_mirror(board: Any, spec: SpaceSpec, obs_what: str, act_what: str) -> None:
    """``policy.learn.mirror_board`` needs the observation to be the board then one flag per
    column, and one action per column (PPO's mirror, common/policy/nets.py ``mirror_board``)."""
    if board is None:
        raise SpaceError("config key 'policy.learn.mirror_board' is set but 'policy.model.board' is not: only a "
                         "board's observation can be mirrored")
    h, w, c = (int(v) for v in board)
    if not (spec.action_kind == "discrete" and spec.action_n == w and spec.obs_dim == h * w * c + w):
        raise SpaceError(f"config key 'policy.learn.mirror_board' needs one action per column of the {h}x{w} board "
                         f"and the observation to be the board then {w} per-column flags ({h * w * c + w} values), "
                         f"but env {spec.env_id!r} has {obs_what} and {act_what}")


def _norm(v: Any) -> tuple[int, ...]:
    if isinstance(v, (list, tuple)):
        return tuple(int(x) for x in v)
    return (int(v),)
