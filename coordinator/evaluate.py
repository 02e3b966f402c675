"""``rqrl eval``: play a saved policy's episodes as the run's evals do, report its return, optionally film it.

The file is a run's ``final.pt`` (common/policy/export.py): the acting weights with the
algorithm name, config and env spaces they were trained with, so any registered algorithm
plays the same way and no ``--config`` is needed. ``--config`` swaps in another env section
(e.g. another ``max_episode_steps``); a bare ``state_dict`` of tensors needs the run's config.
The policy acts as in the run's evals (``policy.eval``: a DQN is epsilon-greedy with
``policy.eval.eps``, 0.05 by default; ``--set policy.eval.eps=0`` plays greedily), with its
randomness drawn from ``--seed``: the same file, seed and settings give the same returns.
Files are read with ``torch.load(path, weights_only=True)``; non-finite weights are refused.

Usage::

    rqrl eval <exp_name>/latest/final.pt --episodes 10
    rqrl eval <exp_name>/<run_name>/final.pt --video episode.gif
    rqrl eval connect_four_ppo/latest/final.pt --opponent random|heuristic|human|OTHER.pt

``--opponent`` (two-player games, common/games.py) seats another player: a fixed one, another
saved policy (acting as its evals do), or you (``human``: the board in the terminal, your
column from the keyboard); the default is the env's own (Connect Four's heuristic).

Heavy imports (torch, gymnasium) happen inside the functions, so building the ``rqrl`` parser
stays fast.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
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


@dataclass
class Saved:
    """What a policy file holds: the acting weights, and (for an rqrl final.pt) how to rebuild the policy."""

    weights: dict[str, Any]
    kind: str
    config: Optional[dict[str, Any]] = None
    spaces: Optional[dict[str, Any]] = None
    train_iter: Optional[int] = None


def _check_file(path: str | Path) -> Path:
    """``path`` as a Path when it is a file, else EvalError naming it."""
    p = Path(path)
    if not p.exists():
        raise EvalError(f"policy file {str(p)!r} does not exist")
    if not p.is_file():
        raise EvalError(f"policy file {str(p)!r} is not a file")
    return p


def load_saved(path: str | Path) -> Saved:
    """Read ``final.pt`` (common/policy/export.py) or a bare ``state_dict`` of tensors.

    Raises:
        EvalError: missing file, not loadable with ``torch.load(weights_only=True)``, another
            layout, or a non-finite tensor; the message names the file and the tensor.
    """
    import torch

    from common.finite import NonFiniteError, check_arrays
    from common.policy import export

    p = _check_file(path)
    try:
        obj = export.load(p)
    except Exception as e:  # torch raises RuntimeError, UnpicklingError, EOFError, KeyError, ... for bad files
        # torch's own text suggests weights_only=False: never for a file of unknown origin.
        raise EvalError(f"{p}: not an rqrl policy file (torch.load(weights_only=True) refused it: "
                        f"{type(e).__name__})") from None
    if export.is_bundle(obj):
        saved = Saved(obj["weights"], f"{obj.get('algorithm')} policy", obj.get("config"), obj.get("spaces"),
                      obj.get("train_iter"))
    elif isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        saved = Saved(obj, "state_dict")
    elif isinstance(obj, dict) and {"policy", "train_iter"} <= set(obj):
        raise EvalError(f"{p}: a learner checkpoint (policy and optimizer state, for `rqrl train --resume`), not a "
                        "policy file: evaluate the run's final.pt or best.pt")
    else:
        what = f"top-level keys {sorted(map(str, obj))[:8]}" if isinstance(obj, dict) else f"a {type(obj).__name__}"
        raise EvalError(f"{p}: holds neither an rqrl final.pt (format {export.FORMAT!r}) nor a state_dict of "
                        f"tensors; found {what}")
    for k, v in saved.weights.items():
        if not isinstance(v, torch.Tensor):
            raise EvalError(f"{p}: weight {k!r} is a {type(v).__name__}, not a tensor")
    try:
        check_arrays(saved.weights, f"{p} ({saved.kind})")
    except NonFiniteError as e:
        raise EvalError(f"{e}: refusing to evaluate non-finite weights") from None
    return saved


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
def _make_env(env_cfg: Any, render: bool) -> Any:
    from common import envs

    extra = {"render_mode": "rgb_array"} if render else {}
    try:
        return envs.make(env_cfg, train=False, **extra)  # eval wrappers: true game scores
    except Exception as e:  # gymnasium raises several error types for an unknown id / bad kwargs
        raise EvalError(f"cannot build env {env_cfg.env_id!r} (config key env.env_id / env.env_kwargs / "
                        f"env.wrappers): {_first_line(e)}") from None


def _seat_opponent(env: Any, opponent: str, cfg: Any, spec: Any, seed: int) -> Any:
    """Seat ``opponent`` (``--opponent``) in the two-player game ``env``; returns ``env`` wrapped
    to count the games' outcomes (and, for ``human``, to show each game's end).

    Raises:
        EvalError: a single-player env, or an opponent file that cannot play this game.
    """
    import numpy as np

    from common import games

    game = env.unwrapped
    if not isinstance(game, games.TwoPlayerEnv):
        raise EvalError(f"--opponent is for two-player games (common/games.py); env {cfg.env.env_id!r} has one player")
    if opponent in games.FIXED_OPPONENTS:
        game.set_opponent(opponent)
    elif opponent == "human":
        game.set_opponent(lambda obs: _human_move(obs, game.game, int(game.action_space.n)))
    else:
        saved = load_saved(opponent)
        trained_on = (saved.config or {}).get("env", {}).get("env_id", "?")
        try:
            other_cfg, other_spec = _config_and_spec(opponent, saved, cfg, (), [])
        except EvalError:
            other_spec = None
        if other_spec != spec or trained_on not in (cfg.env.env_id, "?"):
            raise EvalError(f"--opponent {opponent}: its policy was trained on {trained_on!r}, not on {cfg.env.env_id!r}")
        other = _eval_policy(opponent, other_cfg, other_spec, saved)
        rng = np.random.default_rng(seed + 1)
        game.set_opponent(lambda obs: int(other.act_eval(spec.obs_batch(np.asarray(obs)[None]), rng)[0]))
    return _Outcomes(env, game.game if opponent == "human" else "", int(game.action_space.n))


def _human_move(obs: Any, game: str, n_actions: int) -> int:
    """Show the position (you are X) and read a legal move from stdin (again until it is one).

    Raises:
        EvalError: stdin closed.
    """
    import numpy as np

    from common.games import board_text

    legal = np.flatnonzero(np.asarray(obs)[-n_actions:] > 0.5).tolist()
    print(board_text(np.asarray(obs), game, n_actions), flush=True)
    while True:
        try:
            answer = input(f"your move as X, a column of {legal}: ")
        except (EOFError, RuntimeError):  # RuntimeError: no sys.stdin at all (<&-)
            raise EvalError("--opponent human: stdin closed before a move") from None
        if answer.strip().isdigit() and int(answer) in legal:
            return int(answer)
        print(f"not a legal move: {answer.strip()!r}", flush=True)


class _Outcomes:
    """``env`` counting each game's outcome for the policy (``info["outcome"]``: +1 / 0 / -1);
    with ``show`` (a game's name: you play it) the last position and the result of each game."""

    def __init__(self, env: Any, show: str, n_actions: int) -> None:
        self.env, self._show, self._n_actions = env, show, n_actions
        self.counts = {1: 0, 0: 0, -1: 0}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def step(self, action: Any) -> tuple:
        out = self.env.step(action)
        info = out[4]
        if "outcome" in info:
            self.counts[int(info["outcome"])] += 1
            if self._show:
                import numpy as np

                from common.games import board_text

                # The policy's view: your pieces, X, are the other player's.
                board = board_text(np.asarray(out[0]), self._show, self._n_actions, mover_first=False)
                verdict = {1: "the policy won", 0: "a draw", -1: "you won"}[int(info["outcome"])]
                print(f"{board}\ngame over: {verdict}", flush=True)
        return out

    def note(self, opponent: str) -> str:
        n = sum(self.counts.values())
        if self._show:
            return f"you won {self.counts[-1]}, drew {self.counts[0]} and lost {self.counts[1]} of {n} games"
        return (f"the policy won {self.counts[1]}, drew {self.counts[0]} and lost {self.counts[-1]} of {n} games "
                f"against {opponent}")


def evaluate_checkpoint(path: str | Path, cfg: Any = None, episodes: Optional[int] = None, seed: Optional[int] = None,
                        video: str | Path | None = None, video_episodes: int = 1, overrides: tuple[str, ...] = (),
                        opponent: Optional[str] = None) -> EvalResult:
    """Play ``episodes`` episodes with the policy saved in ``path``, acting as the run's evals do.

    Args:
        path: ``final.pt`` (its own config and spaces rebuild the policy) or a bare state_dict
            (then ``cfg`` must describe the policy that made it).
        cfg: a compiled config; with a final.pt only its ``env`` section is used (to play the
            policy on another env variant); default: the final.pt's, else the built-in defaults.
        episodes: number of episodes; default ``cfg.env.n_evaluator_episode``.
        seed: episode ``i`` resets with seed ``seed + i`` (modulo 2**32: env seeds are 32-bit),
            and the policy's eval randomness (``policy.eval``: a DQN's epsilon, PPO's sampling) draws from
            ``numpy.random.default_rng(seed)``, so a result is reproducible; default ``cfg.seed``.
        video: a ``.gif`` or ``.mp4`` path; the first ``video_episodes`` episodes are filmed.
        overrides: ``KEY=VALUE`` config overrides applied last.
        opponent: a two-player game's other seat (module docstring); None: the env's own.

    Raises:
        EvalError: see :func:`load_saved`; a policy that does not fit the env, env and video problems.
    """
    video_path = Path(video) if video else None
    backend = _video_backend(video_path) if video_path else None
    if video_path and video_episodes < 1:
        raise EvalError(f"--video-episodes must be >= 1, got {video_episodes}")
    saved = load_saved(path)
    notes: list[str] = []
    cfg, spec = _config_and_spec(path, saved, cfg, overrides, notes)
    episodes = int(cfg.env.n_evaluator_episode if episodes is None else episodes)
    if episodes < 1:
        raise EvalError(f"--episodes must be >= 1, got {episodes}")
    seed = int(cfg.seed if seed is None else seed)
    policy = _eval_policy(str(path), cfg, spec, saved)
    env = _make_env(cfg.env, render=video_path is not None)
    try:
        counted = _seat_opponent(env, opponent, cfg, spec, seed) if opponent is not None else None
        writer: Optional[_VideoWriter] = None
        if video_path is not None:
            video_path.parent.mkdir(parents=True, exist_ok=True)
            writer = _VideoWriter(video_path, backend, (env.metadata or {}).get("render_fps") or 30)
        try:
            returns, lengths = _play(counted or env, policy, cfg, spec, episodes, seed, writer, video_episodes, notes)
        except EvalError:
            if counted is not None and sum(counted.counts.values()):  # the games played before it
                print(f"note: {counted.note(opponent)}", file=sys.stderr, flush=True)
            raise
        if counted is not None:
            notes.append(counted.note(opponent))
        frames = 0
        if writer is not None:
            frames = writer.count
            writer.close()
    finally:
        env.close()
    return EvalResult(returns, lengths, cfg.env.env_id, seed, video_path, frames, notes)


def _config_and_spec(path: str | Path, saved: Saved, cfg: Any, overrides: tuple[str, ...],
                     notes: list[str]) -> tuple[Any, Any]:
    """The config to play with (the file's own, its env section swapped for ``cfg``'s; else ``cfg``, else
    the defaults; then ``overrides``) and the env's spaces, which must be those the policy was trained on."""
    from common import spaces
    from common.config import ConfigError, apply_overrides, compile_config

    where = str(path)
    try:
        if saved.config is not None:
            own = compile_config({k: v for k, v in saved.config.items() if k != "create"}, saved.config.get("create"))
            if cfg is not None:
                own.env = cfg.env
            cfg = own
        elif cfg is None:
            cfg = compile_config({"exp_name": DEFAULT_EXP})
            notes.append(f"{where} is a bare state_dict: assuming the built-in defaults (pass the run's config with --config)")
        if overrides:
            cfg = apply_overrides(cfg, list(overrides))
        # A custom env's module sits where the run was trained: the cwd, or the folder above
        # ./<exp>/<run>/ (or above ./<exp>/, for a file copied up from its run folder).
        spaces.make_importable(os.getcwd(), *(str(p) for p in Path(path).resolve().parents[1:3]))
        spec = spaces.probe(cfg)
    except (ConfigError, spaces.SpaceError) as e:
        raise EvalError(str(e)) from None
    if saved.spaces is not None and spec != spaces.SpaceSpec.from_dict(dict(saved.spaces, env_id=spec.env_id)):
        raise EvalError(f"{where}: the policy was trained on spaces {saved.spaces} but env {cfg.env.env_id!r} has "
                        f"{spec.to_dict()}")
    return cfg, spec


def _eval_policy(where: str, cfg: Any, spec: Any, saved: Saved) -> Any:
    """The config's policy in eval mode on the CPU, holding ``saved``'s weights (EvalError if they do not fit)."""
    from common import spaces
    from common.policy import create_policy

    try:
        spaces.check_model(cfg, spec)
        policy = create_policy(cfg, spec, modes=("eval",), device="cpu")
        policy.set_weights({k: v.detach().to("cpu").float().numpy() for k, v in saved.weights.items()})
    except (ValueError, KeyError) as e:
        raise EvalError(f"{where}: {e}") from None
    return policy


def _play(env: Any, policy: Any, cfg: Any, spec: Any, episodes: int, seed: int, writer: Optional[_VideoWriter],
          video_episodes: int, notes: list[str]) -> tuple[list[float], list[int]]:
    """Returns and lengths of ``episodes`` episodes; the first ``video_episodes`` are filmed into ``writer``."""
    import numpy as np

    from common.seeding import episode_seed

    max_s = float(cfg.policy.eval.evaluator.max_episode_seconds or 0)
    returns: list[float] = []
    lengths: list[int] = []
    # The policy's eval randomness (a DQN's eval epsilon, PPO's sampling): one stream from the seed.
    rng = np.random.default_rng(seed)
    for i in range(episodes):
        film = writer if writer is not None and i < video_episodes else None
        ret, length, cut = _play_episode(env, policy, spec, cfg.env.env_id, episode_seed(seed, i), rng, film, max_s)
        if cut:
            notes.append(f"episode {i} cut after {max_s:g} s (policy.eval.evaluator.max_episode_seconds)")
        if not np.isfinite(ret):
            raise EvalError(f"env {cfg.env.env_id!r} returned a non-finite reward in episode {i}")
        returns.append(ret)
        lengths.append(length)
    return returns, lengths


def _play_episode(env: Any, policy: Any, spec: Any, env_id: str, env_seed: int, rng: Any,
                  film: Optional[_VideoWriter], max_s: float) -> tuple[float, int, bool]:
    """(return, length, cut) of one episode from ``env.reset(seed=env_seed)``; ``cut``: it ran past
    ``max_s`` seconds (0: no limit) and was stopped."""
    import numpy as np

    obs, _ = env.reset(seed=env_seed)
    if film is not None:
        film.add(_render(env, env_id))
    ret, length, start = 0.0, 0, time.monotonic()
    while True:
        action = policy.act_eval(spec.obs_batch(np.asarray(obs)[None]), rng)[0]
        obs, reward, terminated, truncated, _ = env.step(action)
        ret += float(reward)
        length += 1
        if film is not None:
            film.add(_render(env, env_id))
        if terminated or truncated:
            return ret, length, False
        if max_s and time.monotonic() - start > max_s:
            return ret, length, True


def _render(env: Any, env_id: str) -> Any:
    try:
        frame = env.render()
    except Exception as e:  # e.g. gymnasium.error.DependencyNotInstalled (pygame for classic control)
        raise EvalError(f"cannot render env {env_id!r} for --video: {_first_line(e)}") from None
    if frame is None:
        raise EvalError(f"env {env_id!r} rendered nothing in render_mode='rgb_array'; --video needs an env that can render frames")
    return frame


# ---------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``rqrl eval`` arguments (shared by ``rqrl eval`` and ``python -m coordinator.evaluate``)."""
    p.add_argument("checkpoint", help="a run's final.pt (or a bare state_dict, with --config)")
    p.add_argument("--config", default=None,
                   help="config file: its env section replaces the final.pt's (a bare state_dict needs the run's "
                        "config); default: what the final.pt holds")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set env.env_kwargs.max_episode_steps=1000")
    p.add_argument("--episodes", type=int, default=None,
                   help="episodes to play (default: env.n_evaluator_episode of the config)")
    p.add_argument("--seed", type=int, default=None,
                   help="episode i resets with seed SEED+i (mod 2**32); the policy's eval randomness is seeded by SEED "
                        "(default: the config's seed)")
    p.add_argument("--video", default=None, metavar="OUT.gif|OUT.mp4",
                   help="film the first episode(s): .gif with Pillow; .mp4 needs imageio[ffmpeg] or moviepy")
    p.add_argument("--video-episodes", type=int, default=1, help="how many episodes to film (default 1)")
    p.add_argument("--opponent", default=None, metavar="random|heuristic|human|OTHER.pt",
                   help="two-player games: who plays the other seat (default: the env's own, Connect Four's heuristic); "
                        "human: you, in the terminal")


def run(args: argparse.Namespace) -> int:
    """Run ``rqrl eval`` from parsed arguments; prints the result; returns the exit code (0, or 1 on errors)."""
    from common.config import ConfigError, load_config

    try:
        _check_file(args.checkpoint)  # before torch (seconds to import): a wrong path answers at once
        cfg = load_config(args.config) if args.config else None
        if args.video:
            # Classic-control envs render through pygame/SDL: no window, no audio device needed.
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
            os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        import torch

        torch.set_num_threads(1)  # one observation at a time: threads only add overhead
        result = evaluate_checkpoint(args.checkpoint, cfg, args.episodes, args.seed, args.video, args.video_episodes,
                                     tuple(args.overrides), args.opponent)
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
    p = argparse.ArgumentParser(prog="rqrl eval", description="Play episodes with a saved rqrl policy, acting as the run's evals.")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
