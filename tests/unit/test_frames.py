"""Each frame once: packed chunks, the replay buffer's frame store, chunk compression, the memory budget."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from common import chunk_codec, frames, memory_budget, serialization, spaces
from common.config import compile_config
from workers.replay_buffer import FrameStore, PrioritizedReplayBuffer, ReplayBuffer, check_chunk

H = W = 12
C = 4
SCHEMA = {"obs": ((C, H, W), np.dtype(np.uint8)), "action": ((), np.dtype(np.int64)),
          "next_obs": ((C, H, W), np.dtype(np.uint8))}


def frame(k: int) -> np.ndarray:
    """A frame that names its own number in its first 4 pixels."""
    f = np.full((H, W), k % 7, np.uint8)
    f.flat[:4] = np.frombuffer(np.uint32(k).tobytes(), np.uint8)
    return f


def number(f: np.ndarray) -> int:
    return int(np.frombuffer(f.flat[:4].tobytes(), np.uint32)[0])


def stream_chunks(n_chunks: int, rows: int, nstep: int = 1, envs: int = 2, fresh: int = 1):
    """DQN-like chunks of ``envs`` interleaved frame streams. ``fresh=1`` (a frame stack): obs_t is
    frames t-3..t and next_obs is obs_{t+nstep}; ``fresh=C``: every observation is C new frames.
    ``action`` carries the number of obs's last frame."""

    def stacked(e: int, t: int) -> np.ndarray:
        last = e * 10**6 + (t if fresh == 1 else t * C + C - 1)
        return np.stack([frame(last - C + 1 + i) for i in range(C)])

    t = C
    for _ in range(n_chunks):
        obs, nxt, act = [], [], []
        for _ in range(rows // envs):
            for e in range(envs):
                obs.append(stacked(e, t))
                nxt.append(stacked(e, t + nstep))
                act.append(number(obs[-1][-1]))
            t += 1
        yield {"obs": np.stack(obs), "action": np.asarray(act, np.int64), "next_obs": np.stack(nxt)}


def test_pack_keeps_each_distinct_frame_once_and_unpacks_exactly():
    chunk = next(stream_chunks(1, 32, nstep=3))
    packed = frames.pack(chunk, ["obs", "next_obs"])
    # 2 envs x (16 steps + 3 stacked + 3 n-step frames): not 2 x 32 x 4.
    assert len(packed["frames"]) == 2 * (16 + 3 + 3)
    assert packed["obs"].dtype == np.int32 and packed["obs"].shape == (32, C)
    assert check_chunk(SCHEMA, packed, "chunk") == 32
    back = frames.unpack(serialization.loads(serialization.dumps(packed)), SCHEMA)
    for k in chunk:
        np.testing.assert_array_equal(back[k], chunk[k])


def test_a_packed_chunk_indexing_outside_its_frames_is_refused():
    packed = frames.pack(next(stream_chunks(1, 8)), ["obs", "next_obs"])
    packed["obs"][0, 0] = len(packed["frames"])
    with pytest.raises(ValueError, match="'obs' indexes outside its"):
        check_chunk(SCHEMA, packed, "chunk")
    packed = frames.pack(next(stream_chunks(1, 8)), ["obs", "next_obs"])
    packed["frames"] = packed["frames"].astype(np.float32)
    with pytest.raises(ValueError, match="'frames' must be uint8"):
        check_chunk(SCHEMA, packed, "chunk")


def _truth(batch, nstep: int):
    """Each sampled row is the row whose action (its last frame's number) it carries."""
    for o, a, n in zip(batch["obs"], batch["action"], batch["next_obs"]):
        assert [number(f) for f in o] == [a - 3, a - 2, a - 1, a]
        assert [number(f) for f in n] == [a - 3 + nstep, a - 2 + nstep, a - 1 + nstep, a + nstep]


@pytest.mark.parametrize("packed", [True, False])
def test_replay_buffer_keeps_about_one_frame_per_transition_and_samples_exact_rows(packed):
    buf = ReplayBuffer(2000, SCHEMA, framed=["obs", "next_obs"])
    for chunk in stream_chunks(40, 64, nstep=3):
        buf.extend(frames.pack(chunk, ["obs", "next_obs"]) if packed else chunk)
    assert len(buf) == 2000
    # Consecutive chunks of one stream share frames: matched across chunks, ~1 new frame a row.
    assert buf._frames.total <= 40 * 64 + 2 * 8
    _truth(buf.sample(256, np.random.default_rng(0)), 3)


def test_rows_whose_frames_are_overwritten_are_dropped_not_served():
    # Nothing shared: 8 new frames a row, 1.1 budgeted: the store wraps long before the row ring.
    buf = ReplayBuffer(1000, SCHEMA, framed=["obs", "next_obs"])
    rng = np.random.default_rng(1)
    for chunk in stream_chunks(30, 64, fresh=C, nstep=1):
        buf.extend(chunk)
        b = buf.sample(64, rng)
        assert all(number(o[-1]) == a for o, a in zip(b["obs"], b["action"]))
    assert 0 < len(buf) < 1000


def test_prioritized_buffer_never_samples_a_dropped_row():
    buf = PrioritizedReplayBuffer(1000, SCHEMA, framed=["obs", "next_obs"])
    rng = np.random.default_rng(2)
    for chunk in stream_chunks(30, 64, fresh=C, nstep=1):
        buf.extend(chunk)
        b = buf.sample(64, rng)
        assert all(number(o[-1]) == a for o, a in zip(b["obs"], b["action"]))


def test_memory_per_stored_atari_transition_is_about_one_frame():
    schema = {"obs": ((4, 84, 84), np.uint8), "action": ((), np.int64), "reward": ((), np.float32),
              "next_obs": ((4, 84, 84), np.uint8), "done": ((), np.bool_), "discount": ((), np.float32)}
    per_row = frames.buffer_bytes(100_000, schema, ["obs", "next_obs"]) / 100_000
    assert per_row / (84 * 84) <= 1.2
    assert frames.buffer_bytes(1000, schema, []) == 1000 * (2 * 4 * 84 * 84 + 8 + 4 + 1 + 4)
    buf = ReplayBuffer(1000, schema, framed=["obs", "next_obs"])
    allocated = sum(a.nbytes for a in buf._data.values()) + buf._frames._frames.nbytes
    assert allocated == frames.buffer_bytes(1000, schema, ["obs", "next_obs"])


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_chunk_codecs_round_trip_and_plain_msgpack_passes_through(codec):
    payload = serialization.dumps(frames.pack(next(stream_chunks(1, 32)), ["obs", "next_obs"]))
    blob = chunk_codec.encode(payload, codec)
    assert blob[0] == 0xC1 and len(blob) < len(payload)
    assert chunk_codec.decode(blob) == payload
    assert chunk_codec.decode(payload) == payload
    with pytest.raises(chunk_codec.CodecError, match="rqrl:x:data:1: corrupt"):
        chunk_codec.decode(blob[:-5] + b"xxxxx" if codec == "zstd" else blob[:10], "rqrl:x:data:1")


def test_auto_compresses_image_chunks_only_and_unknown_codecs_are_refused():
    assert chunk_codec.resolve("auto", True) == "zstd" and chunk_codec.resolve("auto", False) == "none"
    with pytest.raises(chunk_codec.CodecError, match="policy.collect.collector.compression"):
        chunk_codec.resolve("gzip", True)


def test_memory_budget_names_replay_buffer_size_when_the_buffer_will_not_fit(monkeypatch):
    spec = spaces.from_spaces("Img-v0", gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(3))
    cfg = compile_config({"policy": {"other": {"replay_buffer": {"replay_buffer_size": 1_000_000}}}})
    schema = {"obs": ((4, 84, 84), np.uint8), "action": ((), np.int64), "next_obs": ((4, 84, 84), np.uint8)}
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: (4 * 2**30, "MemAvailable"))
    with pytest.raises(memory_budget.MemoryBudgetError, match=r"replay_buffer_size' = 1000000 needs ~7\.\d\d GB"):
        memory_budget.check(cfg, spec, schema)
    cfg.policy.other.replay_buffer.replay_buffer_size = 100_000
    need, msg = memory_budget.check(cfg, spec, schema)
    assert need == frames.buffer_bytes(100_000, schema, ["obs", "next_obs"]) and "100000 transitions need" in msg
    # One rank of a two-rank learner group holds half the rows, and says so.
    need, msg = memory_budget.check(cfg, spec, schema, 50_000)
    assert need == frames.buffer_bytes(50_000, schema, ["obs", "next_obs"]) and "50000 transitions need" in msg


def test_available_memory_is_read_on_this_host():
    got = memory_budget.available_bytes()
    assert got is not None and got[0] > 0


def test_a_buffer_without_a_frame_store_unpacks_packed_chunks():
    buf = ReplayBuffer(100, SCHEMA)
    chunk = next(stream_chunks(1, 16, nstep=2))
    buf.extend(frames.pack(chunk, ["obs", "next_obs"]))
    _truth(buf.sample(16, np.random.default_rng(3)), 2)
    assert frames.pack({"obs": np.zeros((0, C, H, W), np.uint8)}, ["obs"])["obs"].shape == (0, C)


# ---------------------------------------------------------------- frames that recur (Atari reset frames do)

def live_rows(buf: ReplayBuffer) -> dict[str, np.ndarray]:
    """Every row the buffer counts as usable (the ring segment ending at its next slot), gathered."""
    return buf._rows((buf._next - buf._size + np.arange(buf._size)) % buf.capacity)


def recurring_chunks(rng: np.random.Generator, n_chunks: int, max_rows: int, distances: list[int]):
    """Chunks of one env's stacked frames (obs = its last C frames, next_obs one step on) whose new
    frames recur: half the steps repeat the frame seen ``d`` steps before (``d`` drawn from
    ``distances``, or anywhere up to the stream's length), a few rows are unrelated stacks, and an
    episode start is the reset frame 0 stacked C times. ``action`` numbers the rows; the second
    value of each item is the pixels sent per row number."""
    seq, fresh, row = [0] * C, 1, 0
    for _ in range(n_chunks):
        obs, nxt, act, sent = [], [], [], {}
        for _ in range(int(rng.integers(1, max_rows + 1))):
            u = rng.random()
            if u < 0.05:  # an episode starts: the stack is the reset frame, C times
                seq += [0] * C
            elif u < 0.1:  # an unrelated stack
                seq += list(range(fresh, fresh + C))
                fresh += C
            if rng.random() < 0.5:
                seq.append(fresh)
                fresh += 1
            else:
                d = int(rng.choice(distances)) if rng.random() < 0.8 else int(rng.integers(1, len(seq) + 1))
                seq.append(seq[-min(d, len(seq))])
            o = np.stack([frame(k) for k in seq[-C - 1:-1]])
            n = np.stack([frame(k) for k in seq[-C:]])
            obs.append(o), nxt.append(n), act.append(row)
            sent[row] = (o, n)
            row += 1
        yield {"obs": np.stack(obs), "action": np.asarray(act, np.int64), "next_obs": np.stack(nxt)}, sent


@pytest.mark.parametrize("window, capacity, max_rows", [
    (4, 2, 1), (4, 2, 8), (8, 3, 3), (8, 10, 40), (16, 5, 12), (5, 40, 60), (frames.WINDOW, 8, 24),
])
@pytest.mark.parametrize("prioritized", [False, True])
def test_every_usable_row_serves_the_pixels_sent_while_frames_recur(monkeypatch, window, capacity, max_rows,
                                                                    prioritized):
    # Small windows make recurrences at, just inside and just past the window edge and the store's
    # size frequent; chunks of up to 2-5x the buffer's rows store more frames than it has spare.
    monkeypatch.setattr(frames, "WINDOW", window)
    monkeypatch.setattr(FrameStore, "WINDOW", window)
    buf = (PrioritizedReplayBuffer if prioritized else ReplayBuffer)(capacity, SCHEMA, framed=["obs", "next_obs"])
    size = buf._frames.size
    edges = [1, 2, 3, C, C + 1] + [e + k for e in (window, size) for k in (-2, -1, 0, 1, 2)]
    rng = np.random.default_rng(window * 1000 + capacity)
    n_chunks = max(300, 4 * size // max(1, max_rows // 2))
    sent: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for i, (chunk, rows) in enumerate(recurring_chunks(rng, n_chunks, max_rows, edges)):
        sent.update(rows)
        buf.extend(chunk if i % 2 else frames.pack(chunk, ["obs", "next_obs"]))
        got = live_rows(buf)
        for o, a, n in zip(got["obs"], got["action"], got["next_obs"]):
            assert np.array_equal(o, sent[a][0]) and np.array_equal(n, sent[a][1]), (
                f"chunk {i}: row {a} served other pixels than were sent (store of {size} frames, {buf._frames.total} stored)")
        kept = {k: v[-capacity:] for k, v in chunk.items()}  # the rows the ring can hold
        if len(frames.pack(kept, ["obs", "next_obs"])["frames"]) <= size:
            assert len(buf) > 0  # the chunk's newest row is kept unless its frames alone overflow the store
    assert buf._frames.total > 2 * size  # the store wrapped around more than once


def test_a_frame_matched_at_the_window_edge_is_not_served_after_its_slot_is_reused():
    # The reset frame A is frame 0 of the store; once WINDOW frames are stored it sits exactly at
    # the window's edge and is still matched. The next chunk references it and stores more new
    # frames than the store keeps beyond the window: the 10th new one lands in A's slot.
    capacity = 8
    buf = ReplayBuffer(capacity, SCHEMA, framed=["obs", "next_obs"])
    spare = buf._frames.size - frames.WINDOW
    first = [frame(k) for k in range(frames.WINDOW)]  # frame(0) is A
    for start in range(0, frames.WINDOW - C, capacity):  # a sliding stack over them, chunks of `capacity` rows
        ks = range(start, min(start + capacity, frames.WINDOW - C))
        buf.extend({"obs": np.stack([np.stack(first[k:k + C]) for k in ks]), "action": np.full(len(ks), -1, np.int64),
                    "next_obs": np.stack([np.stack(first[k + 1:k + 1 + C]) for k in ks])})
    assert buf._frames.total == frames.WINDOW
    m = spare // 2 + 1  # rows bringing 2 new frames each: spare + 1 or more new frames in all
    a = frame(0)
    new = [frame(10**6 + k) for k in range(2 * m)]
    obs = np.stack([np.stack([a, a, a, new[2 * i]]) for i in range(m)])
    nxt = np.stack([np.stack([a, a, a, new[2 * i + 1]]) for i in range(m)])
    buf.extend({"obs": obs, "action": np.arange(m, dtype=np.int64), "next_obs": nxt})
    got = live_rows(buf)
    assert set(range(m)) <= set(got["action"].tolist())  # the new rows are kept ...
    for o, act, n in zip(got["obs"], got["action"], got["next_obs"]):
        if act >= 0:  # ... and serve A where A was sent
            np.testing.assert_array_equal(o, obs[act])
            np.testing.assert_array_equal(n, nxt[act])


@pytest.mark.parametrize("window", [16, 256])
def test_the_dedup_index_stays_bounded_by_the_window(monkeypatch, window):
    # A long stream (20 windows) whose frames recur at every distance, the reset frame included.
    monkeypatch.setattr(frames, "WINDOW", window)
    monkeypatch.setattr(FrameStore, "WINDOW", window)
    buf = ReplayBuffer(64, SCHEMA, framed=["obs", "next_obs"])
    store = buf._frames
    rng = np.random.default_rng(window)
    edges = [1, 2, window - 1, window, window + 1, store.size]
    chunks = recurring_chunks(rng, 10**9, 16, edges)
    while store.total < 20 * window:
        buf.extend(next(chunks)[0])
        assert sum(len(b) for b in store._recent.values()) <= window + 1
        assert len(store._order) - store._order_head <= window + 1
        assert len(store._order) <= 3 * window + 1
