"""``rqrl eval``: play greedy episodes with a saved policy, report its return, optionally film it.

Accepted files (both loaded with ``torch.load(path, weights_only=True)``):

* ``final.pt`` as the coordinator writes it: the Q-network's ``state_dict`` (``encoder.0.weight``, ...);
* a learner checkpoint: ``{"policy": {"model": <state_dict>, ...}, "last_iter": ..., ...}``
  (also a bare policy state ``{"model": <state_dict>, ...}``).

The network's hidden sizes and dueling head are read from the tensor shapes, so a checkpoint
trained with another ``policy.model`` than the config's still loads; its input and output sizes
must match the env's observation and action spaces (the error names the tensor that does not).

Usage::

    rqrl eval cartpole_dqn/final.pt --episodes 10
    rqrl eval cartpole_dqn/final.pt --config deploy/configs/cartpole_dqn.py --video cartpole.gif

Heavy imports (torch, gymnasium) happen inside the functions, so building the ``rqrl`` parser
stays fast.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

DEFAULT_EXP = "eval"
VIDEO_SUFFIXES = (".gif", ".mp4")


class EvalError(Exception):
    """A bad checkpoint, config, env or video path; the one-line message names the file or tensor."""


@dataclass
class EvalResult:
    """Returns and lengths of the played episodes (one entry per episode)."""

    returns: list[float]
    lengths: list[int]
    env_id: str
    seed: int
    video: Optional[Path] = None
    video_frames: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return float(sum(self.returns) / len(self.returns))

    @property
    def std(self) -> float:
        m = self.mean
        return float(math.sqrt(sum((r - m) ** 2 for r in self.returns) / len(self.returns)))

    def summary(self) -> str:
        """``mean ± std return over N episodes`` plus min / max / length, one line."""
        n = len(self.returns)
        return (f"{self.mean:.2f} ± {self.std:.2f} return over {n} episode{'s' if n != 1 else ''} "
                f"(min {min(self.returns):g}, max {max(self.returns):g}, "
                f"mean length {sum(self.lengths) / n:.1f}; {self.env_id}, seed {self.seed})")


# ---------------------------------------------------------------------------- loading
def _first_line(e: BaseException, limit: int = 200) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(e).__name__}: {line[:limit]}" if line else type(e).__name__


def load_q_state(path: str | Path) -> tuple[dict[str, Any], str]:
    """The Q-network ``state_dict`` stored in ``path`` and what kind of file it was.

    Returns:
        ``(state_dict, kind)`` with ``kind`` ``"Q-network state_dict"``, ``"learner checkpoint"``
        or ``"policy state"``.

    Raises:
        EvalError: missing file, not a torch file, not loadable with ``weights_only=True``, or
            neither layout; the message names the file.
    """
    import torch

    p = Path(path)
    if not p.exists():
        raise EvalError(f"checkpoint file {str(p)!r} does not exist")
    if not p.is_file():
        raise EvalError(f"checkpoint {str(p)!r} is not a file")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises RuntimeError, UnpicklingError, EOFError, ... for bad files
        raise EvalError(f"{p}: not a torch checkpoint loadable with torch.load(weights_only=True) "
                        f"({_first_line(e)})") from None
    if isinstance(obj, dict) and isinstance(obj.get("policy"), dict) and isinstance(obj["policy"].get("model"), dict):
        state, kind = obj["policy"]["model"], "learner checkpoint"
    elif isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        state, kind = obj["model"], "policy state"
    elif isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        state, kind = obj, "Q-network state_dict"
    else:
        what = f"top-level keys {sorted(map(str, obj))[:8]}" if isinstance(obj, dict) else f"a {type(obj).__name__}"
        raise EvalError(f"{p}: holds neither a Q-network state_dict (keys like 'encoder.0.weight') nor a "
                        f"learner checkpoint ('policy' -> 'model'); found {what}")
    for k, v in state.items():
        if not isinstance(v, torch.Tensor):
            raise EvalError(f"{p}: entry {k!r} of the {kind} is a {type(v).__name__}, not a tensor")
    return state, kind


_ENCODER = re.compile(r"^encoder\.(\d+)\.(weight|bias)$")


def infer_model(state: dict[str, Any], where: str) -> dict[str, Any]:
    """``policy.model`` (obs_shape, action_shape, hidden_size_list, dueling) read from a QNetwork state_dict.

    Raises:
        EvalError: unexpected or missing tensors, or layers whose shapes do not chain; names the tensor.
    """
    layers: dict[int, dict[str, Any]] = {}
    heads = {"advantage.weight", "advantage.bias", "value.weight", "value.bias", "head.weight", "head.bias"}
    unexpected = []
    for k, v in state.items():
        m = _ENCODER.match(k)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = v
        elif k not in heads:
            unexpected.append(k)
    if unexpected:
        raise EvalError(f"{where}: unexpected tensor(s) {sorted(unexpected)[:5]} for a DQN Q-network "
                        "(expected encoder.N.weight/bias and advantage/value or head)")

    hidden: list[int] = []
    in_dim: Optional[int] = None
    for pos, idx in enumerate(sorted(layers)):
        if idx != 2 * pos:
            raise EvalError(f"{where}: tensor 'encoder.{idx}.*' is out of place (Linear layers sit at "
                            f"encoder.0, encoder.2, ...; expected encoder.{2 * pos})")
        w = layers[idx].get("weight")
        if w is None or w.dim() != 2:
            raise EvalError(f"{where}: tensor 'encoder.{idx}.weight' is missing or not 2-D")
        if in_dim is None:
            in_dim = int(w.shape[1])
        elif int(w.shape[1]) != hidden[-1]:
            raise EvalError(f"{where}: tensor 'encoder.{idx}.weight' has shape {tuple(w.shape)} but the "
                            f"previous layer outputs {hidden[-1]}")
        hidden.append(int(w.shape[0]))

    dueling = "advantage.weight" in state
    out_key = "advantage.weight" if dueling else "head.weight"
    if out_key not in state:
        raise EvalError(f"{where}: no output layer: expected 'advantage.weight' + 'value.weight' (dueling) or 'head.weight'")
    out_w = state[out_key]
    if out_w.dim() != 2:
        raise EvalError(f"{where}: tensor {out_key!r} has shape {tuple(out_w.shape)}, expected 2-D")
    last = hidden[-1] if hidden else int(out_w.shape[1])
    if int(out_w.shape[1]) != last:
        raise EvalError(f"{where}: tensor {out_key!r} has shape {tuple(out_w.shape)} but the last hidden layer outputs {last}")
    if dueling and "value.weight" not in state:
        raise EvalError(f"{where}: dueling head without tensor 'value.weight'")
    return {"obs_shape": in_dim if in_dim is not None else last, "action_shape": int(out_w.shape[0]),
            "hidden_size_list": hidden, "dueling": dueling}


# ---------------------------------------------------------------------------- video
def _video_backend(path: Path) -> str:
    """``gif`` (Pillow), ``imageio`` or ``moviepy`` for ``path``, checked before any episode runs."""
    suffix = path.suffix.lower()
    if suffix not in VIDEO_SUFFIXES:
        raise EvalError(f"--video {str(path)!r}: the file name must end in .gif or .mp4")
    if suffix == ".gif":
        return "gif"
    if importlib.util.find_spec("imageio") and importlib.util.find_spec("imageio_ffmpeg"):
        return "imageio"
    if importlib.util.find_spec("moviepy"):
        return "moviepy"
    raise EvalError(f"--video {str(path)!r}: writing .mp4 needs imageio with imageio-ffmpeg "
                    "(pip install \"imageio[ffmpeg]\") or moviepy; neither is installed. Use --video out.gif instead")


class _VideoWriter:
    """Collects rgb frames (H, W, 3) uint8 and writes a GIF (Pillow) or an MP4 (imageio / moviepy)."""

    def __init__(self, path: Path, backend: str, fps: float) -> None:
        self.path, self.backend, self.fps = path, backend, max(1.0, float(fps))
        self.frames: list[Any] = []
        self.count = 0
        self._writer = None
        if backend == "imageio":
            import imageio.v2 as imageio

            self._writer = imageio.get_writer(str(path), fps=self.fps, macro_block_size=1)

    def add(self, frame: Any) -> None:
        import numpy as np

        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.shape[2] not in (3, 4):
            raise EvalError(f"env render() returned an array of shape {frame.shape}, expected (H, W, 3)")
        frame = np.ascontiguousarray(frame[..., :3], dtype=np.uint8)
        self.count += 1
        if self.backend == "gif":
            from PIL import Image

            # Quantise now: 1 byte per pixel held until the file is written.
            self.frames.append(Image.fromarray(frame).quantize(colors=256, method=Image.Quantize.FASTOCTREE))
        elif self.backend == "imageio":
            self._writer.append_data(frame)
        else:
            self.frames.append(frame)

    def close(self) -> None:
        if self.backend == "imageio":
            self._writer.close()
            return
        if not self.frames:
            raise EvalError(f"--video {str(self.path)!r}: no frames were rendered")
        if self.backend == "gif":
            # GIF delays are in 1/100 s and viewers slow anything under 2/100 s down: 20 ms at least.
            ms = max(20, int(round(1000.0 / self.fps / 10.0)) * 10)
            self.frames[0].save(self.path, save_all=True, append_images=self.frames[1:], duration=ms, loop=0)
        else:
            try:
                from moviepy import ImageSequenceClip  # moviepy >= 2
            except ImportError:
                from moviepy.editor import ImageSequenceClip  # moviepy 1.x
            ImageSequenceClip(self.frames, fps=self.fps).write_videofile(str(self.path), logger=None)


# ---------------------------------------------------------------------------- evaluation
def _make_env(env_id: str, env_kwargs: dict[str, Any], render: bool) -> Any:
    import gymnasium as gym

    kwargs = dict(env_kwargs)
    if render:
        kwargs["render_mode"] = "rgb_array"
    try:
        return gym.make(env_id, **kwargs)
    except Exception as e:  # gymnasium raises several error types for an unknown id / bad kwargs
        raise EvalError(f"cannot build env {env_id!r} (config key env.env_id / env.env_kwargs): {_first_line(e)}") from None


def _check_spaces(env: Any, env_id: str, model: dict[str, Any], where: str) -> None:
    import gymnasium as gym
    import numpy as np

    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(act_space, gym.spaces.Discrete):
        raise EvalError(f"env {env_id!r} has action space {act_space}; a DQN policy needs a Discrete one")
    if obs_space.shape is None:
        raise EvalError(f"env {env_id!r} has observation space {obs_space} without a shape")
    obs_dim = int(np.prod(obs_space.shape))
    first = "encoder.0.weight" if model["hidden_size_list"] else ("advantage.weight" if model["dueling"] else "head.weight")
    out = "advantage.weight" if model["dueling"] else "head.weight"
    if model["obs_shape"] != obs_dim:
        raise EvalError(f"{where}: tensor {first!r} takes {model['obs_shape']}-dim observations but env {env_id!r} "
                        f"gives {obs_dim} (shape {obs_space.shape}); pass the training config with --config")
    if model["action_shape"] != int(act_space.n):
        raise EvalError(f"{where}: tensor {out!r} outputs {model['action_shape']} actions but env {env_id!r} "
                        f"has {int(act_space.n)}; pass the training config with --config")


def evaluate_checkpoint(path: str | Path, cfg: Any = None, episodes: Optional[int] = None, seed: Optional[int] = None,
                        video: str | Path | None = None, video_episodes: int = 1) -> EvalResult:
    """Play ``episodes`` greedy episodes with the policy saved in ``path``.

    Args:
        path: ``final.pt`` or a learner checkpoint (see module docstring).
        cfg: a compiled config (``common.config``); default ``compile_config({"exp_name": "eval"})``.
        episodes: number of episodes; default ``cfg.env.n_evaluator_episode``.
        seed: episode ``i`` resets with seed ``seed + i``; default ``cfg.seed``.
        video: a ``.gif`` or ``.mp4`` path; the first ``video_episodes`` episodes are filmed.

    Raises:
        EvalError: see :func:`load_q_state`, :func:`infer_model`; env and video problems.
    """
    import copy

    import numpy as np

    from common.config import compile_config
    from common.finite import NonFiniteError, check_arrays
    from common.policy import create_policy

    if cfg is None:
        cfg = compile_config({"exp_name": DEFAULT_EXP})
    episodes = int(cfg.env.n_evaluator_episode if episodes is None else episodes)
    if episodes < 1:
        raise EvalError(f"--episodes must be >= 1, got {episodes}")
    seed = int(cfg.seed if seed is None else seed)
    video_path = Path(video) if video else None
    backend = _video_backend(video_path) if video_path else None
    if video_path and video_episodes < 1:
        raise EvalError(f"--video-episodes must be >= 1, got {video_episodes}")

    where = str(path)
    state, kind = load_q_state(path)
    try:
        check_arrays(state, f"{where} ({kind})")
    except NonFiniteError as e:
        raise EvalError(f"{e}: refusing to evaluate non-finite weights") from None
    cfg = copy.deepcopy(cfg)
    notes: list[str] = []
    ptype = (cfg.get("create") or {}).get("policy", {}).get("type", "dqn")
    if ptype == "dqn":
        model = infer_model(state, where)
        want = cfg.policy.model
        if list(want.hidden_size_list) != model["hidden_size_list"] or bool(want.dueling) != model["dueling"]:
            notes.append(f"the {kind} has hidden_size_list {model['hidden_size_list']}, dueling {model['dueling']} "
                         f"(config: {list(want.hidden_size_list)}, {bool(want.dueling)}); using the {kind}'s")
        cfg.policy.model.update(model)

    env = _make_env(cfg.env.env_id, dict(cfg.env.env_kwargs), render=video_path is not None)
    writer: Optional[_VideoWriter] = None
    try:
        if ptype == "dqn":
            _check_spaces(env, cfg.env.env_id, dict(cfg.policy.model), where)
        policy = create_policy(cfg, enable_field=("eval",), device="cpu")
        try:
            policy.load_weights({k: v.detach().to("cpu").float().numpy() for k, v in state.items()})
        except ValueError as e:
            raise EvalError(f"{where}: {e}") from None

        if video_path is not None:
            video_path.parent.mkdir(parents=True, exist_ok=True)
            writer = _VideoWriter(video_path, backend, (env.metadata or {}).get("render_fps") or 30)
        max_s = float(cfg.policy.get("eval", {}).get("evaluator", {}).get("max_episode_seconds", 60.0) or 0)
        returns: list[float] = []
        lengths: list[int] = []
        for i in range(episodes):
            film = writer is not None and i < video_episodes
            obs, _ = env.reset(seed=seed + i)
            if film:
                writer.add(_render(env, cfg.env.env_id))
            ret, length, start = 0.0, 0, time.monotonic()
            while True:
                action = int(policy.greedy(np.asarray(obs, dtype=np.float32).reshape(1, -1))[0])
                obs, reward, terminated, truncated, _ = env.step(action)
                ret += float(reward)
                length += 1
                if film:
                    writer.add(_render(env, cfg.env.env_id))
                if terminated or truncated:
                    break
                if max_s and time.monotonic() - start > max_s:
                    notes.append(f"episode {i} cut after {max_s:g} s (policy.eval.evaluator.max_episode_seconds)")
                    break
            if not np.isfinite(ret):
                raise EvalError(f"env {cfg.env.env_id!r} returned a non-finite reward in episode {i}")
            returns.append(ret)
            lengths.append(length)
        frames = 0
        if writer is not None:
            frames = writer.count
            writer.close()
            writer = None
    finally:
        env.close()
    return EvalResult(returns, lengths, cfg.env.env_id, seed, video_path, frames, notes)


def _render(env: Any, env_id: str) -> Any:
    try:
        frame = env.render()
    except Exception as e:  # e.g. gymnasium.error.DependencyNotInstalled (pygame for classic control)
        raise EvalError(f"cannot render env {env_id!r} for --video: {_first_line(e)}") from None
    if frame is None:
        raise EvalError(f"env {env_id!r} rendered nothing in render_mode='rgb_array'; --video needs an env that supports it")
    return frame


# ---------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``rqrl eval`` arguments (shared by ``rqrl eval`` and ``python -m coordinator.evaluate``)."""
    p.add_argument("checkpoint", help="final.pt (a Q-network state_dict) or a learner checkpoint file")
    p.add_argument("--config", default=None,
                   help="config file of the run (env, model); default: the built-in CartPole-v1 DQN defaults")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set env.env_kwargs.max_episode_steps=1000")
    p.add_argument("--episodes", type=int, default=None,
                   help="greedy episodes to play (default: env.n_evaluator_episode, 5)")
    p.add_argument("--seed", type=int, default=None, help="episode i resets with seed SEED+i (default: the config's seed)")
    p.add_argument("--video", default=None, metavar="OUT.gif|OUT.mp4",
                   help="film the first episode(s): .gif with Pillow; .mp4 needs imageio[ffmpeg] or moviepy")
    p.add_argument("--video-episodes", type=int, default=1, help="how many episodes to film (default 1)")


def run(args: argparse.Namespace) -> int:
    """Run ``rqrl eval`` from parsed arguments; prints the result; returns the exit code (0, or 1 on errors)."""
    from common.config import ConfigError, apply_overrides, compile_config, load_config

    try:
        if args.config:
            cfg = load_config(args.config)
        else:
            cfg = compile_config({"exp_name": DEFAULT_EXP})
        if args.overrides:
            cfg = apply_overrides(cfg, list(args.overrides))
        if args.video:
            # Classic-control envs render through pygame/SDL: no window, no audio device needed.
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
            os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        import torch

        torch.set_num_threads(1)  # one observation at a time: threads only add overhead
        result = evaluate_checkpoint(args.checkpoint, cfg, args.episodes, args.seed, args.video, args.video_episodes)
    except (EvalError, ConfigError) as e:
        print(f"rqrl eval: error: {e}", file=sys.stderr)
        return 1
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    print(result.summary(), flush=True)
    if result.video is not None:
        print(f"video: {result.video} ({result.video_frames} frames)", flush=True)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rqrl eval", description="Play greedy episodes with a saved rqrl policy.")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
