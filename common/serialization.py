"""msgpack serialisation with numpy arrays as an extension type — never pickle.

An array travels as ext type 1 whose payload is ``msgpack([dtype.str, shape]) + raw bytes``
(C order), so dtype (including byte order), shape, 0-d arrays and empty arrays round-trip
exactly. numpy scalars are sent as plain Python numbers. Object arrays are refused.

Copies: :func:`dumps` copies an array's bytes once into the ext payload (then msgpack once
into its output); :func:`loads` with ``copy=False`` returns read-only arrays that alias the
ext payloads msgpack hands over (for a reader that copies the rows into its own storage anyway).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import msgpack
import numpy as np

_NDARRAY = 1
_headers: dict[tuple[str, tuple[int, ...]], bytes] = {}  # packed (dtype, shape) headers: chunks repeat them


class DecodeError(ValueError):
    """Raised when bytes are not a valid rqrl msgpack payload (``what`` names the source)."""


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError(f"cannot serialise an object array (shape {obj.shape}); use numeric dtypes")
        # Not np.ascontiguousarray: it turns 0-d arrays into shape (1,).
        arr = obj if obj.flags.c_contiguous else obj.copy(order="C")
        header = _headers.get((arr.dtype.str, arr.shape))
        if header is None:
            if len(_headers) >= 1024:
                _headers.clear()
            header = _headers[(arr.dtype.str, arr.shape)] = msgpack.packb([arr.dtype.str, list(arr.shape)])
        # One copy (the join reads the array's buffer), where tobytes() + concatenation made two.
        return msgpack.ExtType(_NDARRAY, b"".join((header, arr.reshape(-1).view(np.uint8))))
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot serialise {type(obj).__name__}: only dicts, lists, str, bytes, numbers and numpy arrays")


def _ext_hook(code: int, payload: bytes, copy: bool = True) -> Any:
    if code != _NDARRAY:
        raise DecodeError(f"unknown msgpack extension type {code}")
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(payload)
    dtype_str, shape = next(unpacker)
    offset = unpacker.tell()
    dtype = np.dtype(dtype_str)
    if dtype.hasobject:
        raise DecodeError("object arrays are refused")
    arr = np.frombuffer(payload, dtype=dtype, offset=offset).reshape(shape)
    # frombuffer is read-only and aliases the payload: a copy gives callers writable memory.
    return arr.copy() if copy else arr


def dumps(obj: Any) -> bytes:
    """Serialise dicts/lists/scalars/bytes/numpy arrays to msgpack bytes.

    Raises:
        TypeError: an unsupported type (names it) or an object-dtype array.
    """
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def loads(data: bytes, what: str = "payload", copy: bool = True) -> Any:
    """Inverse of :func:`dumps`.

    Args:
        data: the bytes.
        what: name of the source (e.g. the Redis key) used in the error message.
        copy: False returns read-only arrays without copying their bytes (see module docstring).

    Raises:
        DecodeError: truncated, garbage or otherwise invalid bytes, naming ``what``.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"{what}: expected bytes, got {type(data).__name__}")
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook if copy else partial(_ext_hook, copy=False), raw=False,
                               strict_map_key=False)
    except DecodeError as e:
        raise DecodeError(f"{what}: {e}") from None
    except Exception as e:  # msgpack raises several unrelated exception types on bad input
        raise DecodeError(f"{what}: not a valid msgpack payload ({type(e).__name__}: {e})") from None
