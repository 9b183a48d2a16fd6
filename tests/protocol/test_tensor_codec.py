from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings

from headroom.core.errors import InvalidRequest
from headroom.protocol.tensor_codec import (
    MAX_JSON_DEPTH,
    array_to_raw,
    deserialize_bytes_elements,
    json_representable,
    json_to_array,
    raw_to_array,
    serialize_bytes_elements,
)

from .strategies import same, typed_tensors


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(typed_tensors(min_side=0))
def test_raw_round_trip_every_datatype(item: tuple[str, np.ndarray]) -> None:
    datatype, array = item
    decoded = raw_to_array(array_to_raw(array, datatype), datatype, array.shape, "t")
    assert same(decoded, array)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(typed_tensors(json_safe=True))
def test_json_round_trip_every_datatype(item: tuple[str, np.ndarray]) -> None:
    datatype, array = item
    if datatype == "BYTES":
        data: object = [x.decode("utf-8") for x in array.reshape(-1)]
    else:
        data = array.tolist()  # nested, row-major
    assert json_representable(array, datatype)
    assert same(json_to_array(data, datatype, array.shape, "t"), array)


def test_bytes_wire_format_is_little_endian_length_prefixed() -> None:
    array = np.array([b"ab", b"", b"\x00\xff"], dtype=object)
    raw = serialize_bytes_elements(array)
    assert raw == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x02\x00\x00\x00\x00\xff"
    assert list(deserialize_bytes_elements(raw, 3, "t")) == [b"ab", b"", b"\x00\xff"]


def test_raw_is_little_endian() -> None:
    assert array_to_raw(np.array([1], dtype=np.int32), "INT32") == b"\x01\x00\x00\x00"
    assert raw_to_array(b"\x00\x01", "UINT16", (1,), "t")[0] == 256


def test_non_finite_and_non_utf8_are_not_json_representable() -> None:
    assert not json_representable(np.array([1.0, np.nan], dtype=np.float32), "FP32")
    assert not json_representable(np.array([b"\xff"], dtype=object), "BYTES")
    assert json_representable(np.array([b"ok"], dtype=object), "BYTES")


@pytest.mark.parametrize(
    ("raw", "datatype", "shape", "message"),
    [
        (b"\x00" * 7, "FP32", (2,), "7 bytes of FP32 data, but shape [2] needs 2 x 4 = 8 bytes"),
        (b"\x05\x00\x00\x00ab", "BYTES", (1,), "claims 5 bytes but only 2 remain"),
        (b"\x01\x00", "BYTES", (1,), "1 BYTES elements need at least 4 bytes"),
        (b"\x01\x00\x00\x00a\x01\x00\x00", "BYTES", (2,), "ends after 1 of 2 elements"),
        (b"\x01\x00\x00\x00ab", "BYTES", (1,), "1 bytes left over"),
        (b"\x02", "BOOL", (1,), "BOOL data must be bytes 0 or 1"),
        (b"", "FP32", (-1,), "non-negative integers"),
        (b"", "BF16", (1,), "unsupported datatype 'BF16'"),
    ],
)
def test_malformed_raw(raw: bytes, datatype: str, shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        raw_to_array(raw, datatype, shape, "t")


def _nested(depth: int) -> object:
    data: object = 1.0
    for _ in range(depth):
        data = [data]
    return data


@pytest.mark.parametrize(
    ("data", "datatype", "shape", "message"),
    [
        ([1.0, 2.0, 3.0], "FP32", (2,), r"3 values for shape \[2\] \(2 elements\)"),
        ([[1.0, 2.0], [3.0]], "FP32", (3,), "ragged or malformed"),
        (["a", "b"], "FP32", (2,), r"must be JSON numbers \(found strings\)"),
        ([1, None], "FP32", (2,), "null, lists or objects"),
        ([1.5, 2**63], "UINT64", (2,), r"must be JSON integers \(found non-integer numbers\)"),
        ([-1, 2**63], "UINT64", (2,), r"out of range for UINT64"),
        ([2**64], "UINT64", (1,), r"out of range for UINT64"),
        ([1.5, 2.0], "INT32", (2,), r"must be JSON integers \(found non-integer numbers\)"),
        ([300], "INT8", (1,), r"out of range for INT8 \[-128, 127\]"),
        ([-1], "UINT32", (1,), "out of range for UINT32"),
        ([1, 0], "BOOL", (2,), "true/false"),
        ([1, 2], "BYTES", (2,), "BYTES data must be JSON strings"),
        (_nested(MAX_JSON_DEPTH + 1), "FP32", (1,), "nested deeper than 32 levels"),
        (_nested(MAX_JSON_DEPTH + 1), "BYTES", (1,), "nested deeper than 32 levels"),
    ],
)
def test_malformed_json_data(data: object, datatype: str, shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        json_to_array(data, datatype, shape, "t")


def test_json_mixed_sign_64_bit_integers_are_exact() -> None:
    assert json_to_array([0, 2**63 + 1], "UINT64", (2,), "t").tolist() == [0, 2**63 + 1]
    assert json_to_array([2**70, 1.5], "FP64", (2,), "t").tolist() == [float(2**70), 1.5]


def test_json_accepts_flat_or_nested_and_scalar() -> None:
    flat = json_to_array([1, 2, 3, 4], "INT64", (2, 2), "t")
    nested = json_to_array([[1, 2], [3, 4]], "INT64", (2, 2), "t")
    assert same(flat, nested)
    assert json_to_array(7, "INT32", (1,), "t").tolist() == [7]
    assert json_to_array([], "FP32", (0, 3), "t").shape == (0, 3)
