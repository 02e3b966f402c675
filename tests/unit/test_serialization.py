"""Unit tests for common/serialization.py (msgpack + numpy ext type, never pickle)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from common import serialization
from common.serialization import DecodeError, dumps, loads


def roundtrip(obj):
    return loads(dumps(obj))


DTYPES = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "bool", ">i4", ">f8", "<i2", "complex64"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_array_roundtrip_preserves_dtype_shape_values(dtype):
    rng = np.random.default_rng(0)
    arr = (rng.integers(0, 100, size=(3, 5)) % (2 if dtype == "bool" else 100)).astype(dtype)
    out = roundtrip(arr)
    assert isinstance(out, np.ndarray)
    assert out.dtype == arr.dtype
    assert out.dtype.str == arr.dtype.str  # byte order included
    assert out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


def test_big_endian_bytes_are_not_reinterpreted():
    arr = np.array([1, 256, -70000], dtype=">i4")
    out = roundtrip(arr)
    assert out.dtype.byteorder == ">"
    assert out.tolist() == [1, 256, -70000]


def test_float_values_are_bit_exact():
    arr = np.array([np.pi, -0.0, np.inf, -np.inf, 1e-300, np.finfo(np.float64).max])
    out = roundtrip(arr)
    assert out.tobytes() == arr.tobytes()
    nan = roundtrip(np.array([np.nan], dtype=np.float32))
    assert np.isnan(nan[0]) and nan.dtype == np.float32


@pytest.mark.parametrize("shape", [(0, 4), (0,), (4, 0), (2, 3, 4), (1,), (1, 1, 1, 1), (7,)])
def test_shapes_roundtrip(shape):
    arr = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    out = roundtrip(arr)
    assert out.shape == shape
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_zero_dim_array_keeps_shape(dtype):
    # Regression: np.ascontiguousarray() turned 0-d arrays into shape (1,).
    arr = np.array(3, dtype=dtype)
    out = roundtrip(arr)
    assert out.shape == ()
    assert out.dtype == arr.dtype
    assert out == arr


def test_zero_dim_array_value_survives():
    # Whatever the shape, the value and dtype of a 0-d array must come back.
    out = roundtrip(np.array(3.5, dtype=np.float32))
    assert out.dtype == np.float32
    assert out.size == 1 and float(out.reshape(-1)[0]) == 3.5


def test_non_contiguous_sliced_array():
    base = np.arange(40, dtype=np.int64).reshape(5, 8)
    view = base[::2, 1::3]
    assert not view.flags.c_contiguous
    out = roundtrip(view)
    assert out.shape == view.shape
    np.testing.assert_array_equal(out, view)


def test_transposed_array_keeps_logical_order():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = base.T
    assert not t.flags.c_contiguous
    out = roundtrip(t)
    assert out.shape == (4, 3)
    np.testing.assert_array_equal(out, t)
    assert out[0].tolist() == [0.0, 4.0, 8.0]


def test_fortran_order_array():
    arr = np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3))
    out = roundtrip(arr)
    np.testing.assert_array_equal(out, arr)


def test_decoded_arrays_are_writable_and_own_memory():
    payload = dumps({"a": np.arange(4, dtype=np.float32)})
    out = loads(payload)["a"]
    assert out.flags.writeable
    out[0] = 99.0  # must not raise
    assert out[0] == 99.0
    # The payload itself is untouched: decode again gives the original values.
    assert loads(payload)["a"][0] == 0.0


@pytest.mark.parametrize("shape", [(), (0, 4), (3, 4), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.bool_, ">f8", np.complex64])
def test_no_copy_decode_is_read_only_and_equal(dtype, shape):
    a = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    got = loads(dumps({"a": a}), copy=False)["a"]
    assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
    assert not got.flags.writeable and not got.flags.owndata  # a view of msgpack's ext payload
    with pytest.raises(ValueError):
        got[...] = 0


@pytest.mark.parametrize("n_fields", [1, 6, 17])
@pytest.mark.parametrize("rows", [0, 1, 2, 4, 64, 20000])  # ext payload forms: fixext, ext8, ext16, ext32
def test_dict_of_arrays_written_as_msgpack_writes_it(n_fields, rows):
    obj = {f"f{i}": np.full((rows, 3), i, np.float32 if i % 2 else np.uint8) for i in range(n_fields)}
    obj["flag"] = np.ones(rows, bool)
    assert dumps(obj) == msgpack.packb(obj, default=serialization._default, use_bin_type=True)


def test_no_copy_decode_of_a_chunk_aliases_the_bytes():
    chunk = {"obs": np.arange(12, dtype=np.float32).reshape(3, 4), "done": np.array([True, False, True])}
    data = bytearray(dumps(chunk))
    got = loads(data, copy=False)
    assert np.array_equal(got["obs"], chunk["obs"]) and np.array_equal(got["done"], chunk["done"])
    assert not got["obs"].flags.writeable
    first = data.index(np.float32(0).tobytes() + np.float32(1).tobytes())
    data[first:first + 4] = np.float32(7).tobytes()
    assert got["obs"][0, 0] == 7  # the array reads the bytes it was given: nothing was copied


def test_no_copy_decode_refuses_every_truncation():
    data = dumps({"obs": np.ones((8, 4), np.float32), "done": np.zeros(8, bool)})
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            loads(data[:cut], copy=False)


def test_nested_containers_roundtrip():
    obj = {
        "obs": np.ones((2, 4), dtype=np.float32),
        "meta": {"name": "x", "n": 3, "f": 0.25, "flag": True, "none": None,
                 "list": [1, "two", [np.arange(3, dtype=np.uint8), {"deep": np.zeros((0, 2), np.int8)}]]},
        "raw": b"\x00\xffbytes",
        7: "int key",
    }
    out = roundtrip(obj)
    assert set(out) == {"obs", "meta", "raw", 7}
    np.testing.assert_array_equal(out["obs"], obj["obs"])
    assert out["meta"]["name"] == "x" and out["meta"]["n"] == 3 and out["meta"]["f"] == 0.25
    assert out["meta"]["flag"] is True and out["meta"]["none"] is None
    inner = out["meta"]["list"]
    assert inner[0] == 1 and inner[1] == "two"
    assert inner[2][0].dtype == np.uint8 and inner[2][0].tolist() == [0, 1, 2]
    assert inner[2][1]["deep"].shape == (0, 2) and inner[2][1]["deep"].dtype == np.int8
    assert out["raw"] == b"\x00\xffbytes" and isinstance(out["raw"], bytes)


def test_tuples_come_back_as_lists():
    assert roundtrip((1, 2, (3,))) == [1, 2, [3]]


@pytest.mark.parametrize("scalar, expected_type", [
    (np.float32(1.5), float), (np.float64(2.25), float), (np.int64(7), int), (np.int8(-3), int),
    (np.uint8(200), int), (np.bool_(True), bool),
])
def test_numpy_scalars_become_python_numbers(scalar, expected_type):
    out = roundtrip({"v": scalar})["v"]
    assert type(out) is expected_type
    assert out == scalar.item()


def test_object_array_refused():
    with pytest.raises(TypeError, match="object"):
        dumps(np.array([1, "a", None], dtype=object))
    with pytest.raises(TypeError):
        dumps({"nested": [np.array([{}], dtype=object)]})


def test_unsupported_type_refused_naming_it():
    class Foo:
        pass

    with pytest.raises(TypeError, match="Foo"):
        dumps({"x": Foo()})


def test_garbage_bytes_raise_decode_error_naming_what():
    with pytest.raises(DecodeError, match="rqrl:exp:data:abc"):
        loads(b"\xc1\xc1\xc1 not msgpack", what="rqrl:exp:data:abc")


def test_truncated_payload_raises_decode_error():
    payload = dumps({"obs": np.arange(100, dtype=np.float32), "name": "hello"})
    for cut in (1, 10, len(payload) // 2, len(payload) - 1):
        with pytest.raises(DecodeError, match="my-key"):
            loads(payload[:cut], what="my-key")


def test_truncated_array_body_inside_valid_ext_raises_decode_error():
    # A well-formed msgpack ext whose array body is shorter than the header claims.
    header = msgpack.packb(["<f4", [10]])
    bad = msgpack.packb(msgpack.ExtType(1, header + b"\x00" * 12))
    with pytest.raises(DecodeError, match="blob-x"):
        loads(bad, what="blob-x")


def test_object_dtype_in_header_refused_on_decode():
    header = msgpack.packb(["|O", [1]])
    bad = msgpack.packb(msgpack.ExtType(1, header + b"\x00" * 8))
    with pytest.raises(DecodeError, match="blob-o"):
        loads(bad, what="blob-o")


def test_unknown_ext_code_raises_decode_error():
    bad = msgpack.packb({"a": msgpack.ExtType(42, b"xyz")}, use_bin_type=True)
    with pytest.raises(DecodeError) as ei:
        loads(bad, what="somewhere")
    assert "somewhere" in str(ei.value)
    assert "42" in str(ei.value)


@pytest.mark.parametrize("bad", ["a string", 123, None, ["list"], {"d": 1}])
def test_non_bytes_input_raises_decode_error(bad):
    with pytest.raises(DecodeError, match="the-source"):
        loads(bad, what="the-source")


def test_bytearray_and_memoryview_accepted():
    payload = dumps({"a": np.arange(3, dtype=np.int32)})
    assert loads(bytearray(payload))["a"].tolist() == [0, 1, 2]
    assert loads(memoryview(payload))["a"].tolist() == [0, 1, 2]


def test_decode_error_is_value_error():
    assert issubclass(DecodeError, ValueError)


def test_array_ext_code_is_one():
    # The wire format is documented as ext type 1: other processes depend on it.
    packed = dumps(np.arange(2, dtype=np.uint8))
    ext = msgpack.unpackb(packed, ext_hook=lambda code, data: (code, data))
    assert ext[0] == serialization._NDARRAY == 1
