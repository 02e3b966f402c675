"""msgpack serialisation with numpy arrays as an extension type — never pickle.

An array travels as ext type 1 whose payload is ``msgpack([dtype.str, shape]) + raw bytes``
(C order), so dtype (including byte order), shape, 0-d arrays and empty arrays round-trip
exactly. numpy scalars are sent as plain Python numbers. Object arrays are refused.

Copies: a dict of str -> array (a chunk, policy weights) is written with one copy of each
array's bytes, straight into the output (the same bytes ``msgpack.packb`` gives, whose growing
buffer would copy them several times); :func:`loads` with ``copy=False`` reads such a dict
with no copy, into read-only arrays that alias ``data`` (for a reader that copies the rows
into its own storage anyway). Anything else goes through ``msgpack`` as a whole.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import struct

import msgpack
import numpy as np

_NDARRAY = 1
_headers: dict[tuple[str, tuple[int, ...]], bytes] = {}  # packed (dtype, shape) headers: chunks repeat them


class DecodeError(ValueError):
    """Raised when bytes are not a valid rqrl msgpack payload (``what`` names the source)."""


def _array_parts(obj: np.ndarray) -> tuple[bytes, np.ndarray]:
    """(packed ``[dtype.str, shape]`` header, the C-order bytes as a flat uint8 view) of an array."""
    if obj.dtype.hasobject:
        raise TypeError(f"cannot serialise an object array (shape {obj.shape}); use numeric dtypes")
    # Not np.ascontiguousarray: it turns 0-d arrays into shape (1,).
    arr = obj if obj.flags.c_contiguous else obj.copy(order="C")
    header = _headers.get((arr.dtype.str, arr.shape))
    if header is None:
        if len(_headers) >= 1024:
            _headers.clear()
        header = _headers[(arr.dtype.str, arr.shape)] = msgpack.packb([arr.dtype.str, list(arr.shape)])
    return header, arr.reshape(-1).view(np.uint8)


def _ext_head(n: int) -> bytes:
    """msgpack's header of an ext-1 value with an ``n``-byte payload (the forms msgpack.packb picks)."""
    fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}.get(n)
    if fixed is not None:
        return bytes((fixed, _NDARRAY))
    if n <= 0xFF:
        return struct.pack(">BBb", 0xC7, n, _NDARRAY)
    if n <= 0xFFFF:
        return struct.pack(">BHb", 0xC8, n, _NDARRAY)
    return struct.pack(">BIb", 0xC9, n, _NDARRAY)


def _dumps_arrays(obj: dict[str, np.ndarray]) -> bytes:
    """msgpack bytes of a dict of str -> array, each array's bytes copied once (by the join)."""
    n = len(obj)
    parts: list[Any] = [bytes((0x80 | n,)) if n <= 15 else struct.pack(">BH", 0xDE, n) if n <= 0xFFFF
                        else struct.pack(">BI", 0xDF, n)]
    for key, arr in obj.items():
        header, body = _array_parts(arr)
        parts += [msgpack.packb(key), _ext_head(len(header) + body.nbytes), header, body]
    return b"".join(parts)


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        header, body = _array_parts(obj)
        return msgpack.ExtType(_NDARRAY, b"".join((header, body)))
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot serialise {type(obj).__name__}: only dicts, lists, str, bytes, numbers and numpy arrays")


_UINTS = {0xCC: (">B", 1), 0xCD: (">H", 2), 0xCE: (">I", 4), 0xCF: (">Q", 8)}


def _header_at(buf: Any, pos: int, end: int) -> tuple[str, list[int], int] | None:
    """``(dtype_str, shape, end of header)`` of the common header form (fixarray of a fixstr and a
    fixarray of unsigned ints), read in place; None for any other form."""
    b = memoryview(buf).cast("B") if not isinstance(buf, (bytes, bytearray)) else buf
    if end - pos < 3 or b[pos] != 0x92 or not 0xA0 <= b[pos + 1] <= 0xBF:
        return None
    n = b[pos + 1] & 0x1F
    dtype_str = bytes(b[pos + 2:pos + 2 + n]).decode("ascii")
    pos += 2 + n
    if pos >= end or not 0x90 <= b[pos] <= 0x9F:
        return None
    dims, pos = b[pos] & 0x0F, pos + 1
    shape = []
    for _ in range(dims):
        if pos >= end:
            return None
        tag = b[pos]
        if tag <= 0x7F:
            shape.append(tag)
            pos += 1
        elif tag in _UINTS and pos + _UINTS[tag][1] < end:
            shape.append(struct.unpack_from(_UINTS[tag][0], b, pos + 1)[0])
            pos += 1 + _UINTS[tag][1]
        else:
            return None
    return dtype_str, shape, pos


def _array_at(buf: Any, start: int, end: int) -> np.ndarray:
    """The read-only array whose ext-1 payload is ``buf[start:end]`` (no copy of its bytes)."""
    head = _header_at(buf, start, end)
    if head is None:  # any other header form msgpack may write: parse it with msgpack
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(buf[start:end])
        dtype_str, shape = next(unpacker)
        head = dtype_str, shape, start + unpacker.tell()
    dtype_str, shape, offset = head
    dtype = np.dtype(dtype_str)
    if dtype.hasobject:
        raise DecodeError("object arrays are refused")
    count = (end - offset) // dtype.itemsize if dtype.itemsize else 0
    if count * dtype.itemsize != end - offset:
        raise DecodeError(f"array body of {end - offset} bytes is not a whole number of {dtype_str} items")
    arr = np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape)
    arr.flags.writeable = False  # also over a bytearray
    return arr


def _ext_hook(code: int, payload: bytes, copy: bool = True) -> Any:
    if code != _NDARRAY:
        raise DecodeError(f"unknown msgpack extension type {code}")
    arr = _array_at(payload, 0, len(payload))
    # frombuffer is read-only and aliases the payload: a copy gives callers writable memory.
    return arr.copy() if copy else arr


_EXT_FORMS = {0xC7: (">B", 1), 0xC8: (">H", 2), 0xC9: (">I", 4)}
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}


def _loads_arrays(data: Any) -> dict[str, np.ndarray] | None:
    """A dict of str -> array read in place from ``data`` (arrays alias it), or None when ``data``
    is not exactly such a map (the caller then decodes it with msgpack)."""
    buf = memoryview(data).cast("B")
    end = len(buf)
    if not end:
        return None
    first = buf[0]
    if 0x80 <= first <= 0x8F:
        n, pos = first & 0x0F, 1
    elif first == 0xDE and end >= 3:
        n, pos = struct.unpack_from(">H", buf, 1)[0], 3
    else:
        return None
    out: dict[str, np.ndarray] = {}
    for _ in range(n):
        if pos >= end:
            return None
        tag = buf[pos]
        if 0xA0 <= tag <= 0xBF:
            klen, pos = tag & 0x1F, pos + 1
        elif tag == 0xD9 and pos + 1 < end:
            klen, pos = buf[pos + 1], pos + 2
        else:
            return None
        key = bytes(buf[pos:pos + klen]).decode("utf-8", errors="strict")
        pos += klen
        if pos + 2 > end:
            return None
        tag = buf[pos]
        if tag in _FIXEXT:
            size, pos = _FIXEXT[tag], pos + 1
        elif tag in _EXT_FORMS and pos + 1 + _EXT_FORMS[tag][1] < end:
            fmt, width = _EXT_FORMS[tag]
            size, pos = struct.unpack_from(fmt, buf, pos + 1)[0], pos + 1 + width
        else:
            return None
        code = struct.unpack_from(">b", buf, pos)[0]
        pos += 1
        if code != _NDARRAY or pos + size > end:
            return None
        out[key] = _array_at(data, pos, pos + size)
        pos += size
    return out if pos == end and len(out) == n else None


def dumps(obj: Any) -> bytes:
    """Serialise dicts/lists/scalars/bytes/numpy arrays to msgpack bytes.

    Raises:
        TypeError: an unsupported type (names it) or an object-dtype array.
    """
    if type(obj) is dict and all(type(k) is str and type(v) is np.ndarray for k, v in obj.items()):
        return _dumps_arrays(obj)
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
        fast = None if copy else _loads_arrays(data)
        if fast is not None:
            return fast
        return msgpack.unpackb(data, ext_hook=_ext_hook if copy else partial(_ext_hook, copy=False), raw=False,
                               strict_map_key=False)
    except DecodeError as e:
        raise DecodeError(f"{what}: {e}") from None
    except Exception as e:  # msgpack raises several unrelated exception types on bad input
        raise DecodeError(f"{what}: not a valid msgpack payload ({type(e).__name__}: {e})") from None
