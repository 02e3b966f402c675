"""Compression of step-data chunks in Redis (``policy.collect.collector.compression``).

A compressed chunk is ``0xC1, codec byte, compressed msgpack``. 0xC1 is the one byte msgpack
never uses, so a reader tells compressed chunks from plain msgpack ones without a flag, and
chunks of both kinds can share a buffer stream (a setting changed between runs, a resumed run).

    none   plain msgpack
    lz4    LZ4 block, size stored (python-lz4)
    zstd   Zstandard level 1 (python-zstandard)
    auto   zstd for chunks with image fields, none otherwise. Measured on packed Pong chunks
           (128 rows, 4x84x84 frames; tests/bench/bench_images.py): lz4 65x smaller, zstd-1
           145x, each ~0.3-0.6 ms to encode and ~0.4 ms to decode a 1.2 MB chunk: the same
           CPU to within a fraction of a millisecond, so the smaller one. Flat observations
           (floats) shrink little and are not compressed by default.
"""

from __future__ import annotations

from typing import Any

CODECS = ("auto", "none", "lz4", "zstd")
_MAGIC = 0xC1
_IDS = {"lz4": 1, "zstd": 2}
_NAMES = {v: k for k, v in _IDS.items()}
_zstd: dict[str, Any] = {}  # one compressor / decompressor per process (each thread uses its own call)


class CodecError(ValueError):
    """An unknown codec name, a missing codec package or a corrupt compressed chunk (names ``what``)."""


def resolve(name: str, has_images: bool) -> str:
    """The codec a collector uses: ``auto`` -> ``zstd`` for image chunks, else ``none``.

    Raises:
        CodecError: an unknown name (names the config key).
    """
    if name not in CODECS:
        raise CodecError(f"config key 'policy.collect.collector.compression' must be one of {CODECS}, got {name!r}")
    if name == "auto":
        return "zstd" if has_images else "none"
    return name


def encode(payload: bytes, codec: str) -> bytes:
    """``payload`` compressed with ``codec`` (``none``: unchanged)."""
    if codec == "none":
        return payload
    if codec == "lz4":
        import lz4.block

        body = lz4.block.compress(payload, store_size=True)
    elif codec == "zstd":
        import zstandard

        body = _zstd.setdefault("c", zstandard.ZstdCompressor(level=1)).compress(payload)
    else:
        raise CodecError(f"unknown chunk codec {codec!r}; known: {CODECS}")
    return bytes((_MAGIC, _IDS[codec])) + body


def decode(blob: bytes, what: str = "chunk") -> bytes:
    """The msgpack bytes of a stored chunk, compressed or not.

    Raises:
        CodecError: an unknown codec byte or bytes that do not decompress, naming ``what``.
    """
    if not blob or blob[0] != _MAGIC:
        return blob
    codec = _NAMES.get(blob[1] if len(blob) > 1 else -1)
    try:
        if codec == "lz4":
            import lz4.block

            return lz4.block.decompress(blob[2:])
        if codec == "zstd":
            import zstandard

            return zstandard.ZstdDecompressor().decompress(blob[2:])
    except Exception as e:  # each library raises its own error types on corrupt input
        raise CodecError(f"{what}: corrupt {codec} chunk ({type(e).__name__}: {e})") from None
    raise CodecError(f"{what}: unknown chunk codec byte {blob[1:2]!r}")
