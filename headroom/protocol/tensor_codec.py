"""Tensor payloads <-> numpy, shared by the HTTP/JSON codec, the binary extension and gRPC.

Wire conventions (KServe V2 / Triton):
- raw tensors are row-major and little-endian; BOOL is one byte per element;
- a raw BYTES tensor is each element as a 4-byte little-endian unsigned length followed by its bytes;
- JSON `data` is flat or nested (row-major), numbers for numeric types, `true`/`false` for BOOL and UTF-8
  strings for BYTES.
Every malformed payload raises `InvalidRequest` naming the tensor (`where`) and what is wrong.

Decoding costs at most O(body): a declared shape is checked against the bytes (or values) actually present
before anything of its size is allocated, so a tiny request cannot make the server allocate from its shape.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from headroom.core.errors import InvalidRequest
from headroom.core.types import numpy_dtype

#: Deepest JSON nesting accepted for `data` (numpy itself stops at 64 dimensions).
MAX_JSON_DEPTH = 32
#: Most elements a shape may describe, counting zero dimensions as 1: numpy refuses (ValueError) shapes
#: whose product times the item size overflows 2^63, even empty ones; no body can carry more anyway.
MAX_ELEMENTS = 2**40
#: Most dimensions a shape may have (numpy's own limit is 32 or 64, depending on its version).
MAX_RANK = 32
#: Fewest bytes a raw BYTES element takes: its 4-byte length prefix.
BYTES_PREFIX_BYTES = 4
_LENGTH = struct.Struct("<I")


def element_count(shape: Sequence[int], where: str) -> int:
    """Product of a shape; raises InvalidRequest for negative or non-integer dimensions and for shapes of
    more than MAX_ELEMENTS elements (zero dimensions counted as 1, as numpy's size check does)."""
    if len(shape) > MAX_RANK:
        raise InvalidRequest(f"{where}: shape has {len(shape)} dimensions; at most {MAX_RANK} are supported")
    count = 1
    extent = 1
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise InvalidRequest(f"{where}: shape must be a list of non-negative integers, got {list(shape)!r:.200}")
        count *= dim
        extent *= dim or 1
        if extent > MAX_ELEMENTS:
            raise InvalidRequest(f"{where}: shape {list(shape)!r:.200} describes more than 2^40 elements")
    return count


def serialize_bytes_elements(array: np.ndarray) -> bytes:
    """BYTES tensor -> length-prefixed elements in row-major order (str elements are UTF-8 encoded)."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        raw = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(_LENGTH.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def deserialize_bytes_elements(buffer: bytes | memoryview, count: int, where: str) -> np.ndarray:
    """Length-prefixed BYTES elements -> flat object array of `bytes`; the buffer holds exactly `count`."""
    view = memoryview(buffer)
    if count * BYTES_PREFIX_BYTES > len(view):  # before allocating `count` slots
        raise InvalidRequest(
            f"{where}: {count} BYTES elements need at least {count * BYTES_PREFIX_BYTES} bytes (a 4-byte length "
            f"prefix each), but the data has {len(view)}; the shape and the data disagree"
        )
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > len(view):
            raise InvalidRequest(
                f"{where}: BYTES data ends after {i} of {count} elements; each element needs a 4-byte "
                "little-endian length prefix"
            )
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise InvalidRequest(
                f"{where}: BYTES element {i} claims {length} bytes but only {len(view) - offset} remain"
            )
        out[i] = bytes(view[offset : offset + length])
        offset += length
    if offset != len(view):
        raise InvalidRequest(
            f"{where}: {len(view) - offset} bytes left over after {count} BYTES elements; the shape and the "
            "data disagree"
        )
    return out


def array_to_raw(array: np.ndarray, datatype: str) -> bytes:
    """Tensor data -> raw little-endian bytes (length-prefixed elements for BYTES)."""
    if datatype == "BYTES":
        return serialize_bytes_elements(array)
    dtype = numpy_dtype(datatype).newbyteorder("<")
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def raw_to_array(buffer: bytes | memoryview, datatype: str, shape: Sequence[int], where: str) -> np.ndarray:
    """Raw bytes -> array of `shape`; the byte count must match the shape exactly."""
    count = element_count(shape, where)
    if datatype == "BYTES":
        return deserialize_bytes_elements(buffer, count, where).reshape(tuple(shape))
    dtype = numpy_dtype(datatype)
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidRequest(
            f"{where}: {len(buffer)} bytes of {datatype} data, but shape {list(shape)} needs "
            f"{count} x {dtype.itemsize} = {expected} bytes"
        )
    array = np.frombuffer(buffer, dtype=dtype.newbyteorder("<")).astype(dtype, copy=True)
    if datatype == "BOOL" and array.size and np.frombuffer(buffer, dtype=np.uint8).max() > 1:
        raise InvalidRequest(f"{where}: BOOL data must be bytes 0 or 1")
    return array.reshape(tuple(shape))


def _flatten_strings(data: object, where: str, depth: int, out: list[bytes]) -> None:
    if depth > MAX_JSON_DEPTH:
        raise InvalidRequest(f"{where}: data is nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(data, list):
        for item in data:
            _flatten_strings(item, where, depth + 1, out)
    elif isinstance(data, str):
        out.append(data.encode("utf-8"))
    else:
        raise InvalidRequest(
            f"{where}: BYTES data must be JSON strings, got {type(data).__name__} {data!r:.40}; send "
            "arbitrary bytes with the binary extension (parameters.binary_data_size)"
        )


def _nesting_depth(data: object) -> int:
    depth = 0
    while isinstance(data, list) and depth <= MAX_JSON_DEPTH:
        depth += 1
        data = data[0] if data else None
    return depth


def json_to_array(data: object, datatype: str, shape: Sequence[int], where: str) -> np.ndarray:
    """JSON `data` (flat or nested, row-major) -> array of `shape`, checking types and the element count."""
    count = element_count(shape, where)
    dtype = numpy_dtype(datatype)
    if not isinstance(data, list):
        data = [data]  # a scalar is a one-element tensor
    if datatype == "BYTES":
        flat: list[bytes] = []
        _flatten_strings(data, where, 1, flat)
        if len(flat) != count:
            raise InvalidRequest(f"{where}: {len(flat)} values for shape {list(shape)} ({count} elements)")
        out = np.empty(count, dtype=object)
        out[:] = flat
        return out.reshape(tuple(shape))
    if _nesting_depth(data) > MAX_JSON_DEPTH:
        raise InvalidRequest(f"{where}: data is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        parsed = np.array(data)
    except (ValueError, OverflowError) as exc:
        raise InvalidRequest(f"{where}: data is ragged or malformed ({exc}); use a flat row-major list") from None
    if parsed.size != count:
        raise InvalidRequest(f"{where}: {parsed.size} values for shape {list(shape)} ({count} elements)")
    if count == 0:
        return np.empty(tuple(shape), dtype=dtype)
    kind = parsed.dtype.kind
    if kind in "fO" and datatype != "BOOL":
        # numpy widened mixed int64/uint64 values to float, or gave up (object): check each value exactly.
        return _exact_numbers(data, datatype, where).reshape(tuple(shape))
    if datatype == "BOOL":
        if kind != "b":
            raise InvalidRequest(f"{where}: BOOL data must be JSON true/false values")
    elif dtype.kind in "iu":
        if kind not in "iu":
            raise InvalidRequest(f"{where}: {datatype} data must be JSON integers (found {_describe(parsed)})")
        _check_range(int(parsed.min()), int(parsed.max()), datatype, where)
    elif kind not in "iu":
        raise InvalidRequest(f"{where}: {datatype} data must be JSON numbers (found {_describe(parsed)})")
    return parsed.astype(dtype).reshape(tuple(shape))


def _check_range(low: int, high: int, datatype: str, where: str) -> None:
    info = np.iinfo(numpy_dtype(datatype))
    if low < info.min or high > info.max:
        raise InvalidRequest(f"{where}: value out of range for {datatype} [{info.min}, {info.max}]")


def _exact_numbers(data: object, datatype: str, where: str) -> np.ndarray:
    dtype = numpy_dtype(datatype)
    flat = np.array(data, dtype=object).reshape(-1)
    values = flat.tolist()
    if dtype.kind in "iu":
        if not all(type(v) is int for v in values):
            raise InvalidRequest(f"{where}: {datatype} data must be JSON integers (found {_describe(flat)})")
        _check_range(min(values), max(values), datatype, where)
        return np.array(values, dtype=dtype)
    if not all(type(v) in (int, float) for v in values):
        raise InvalidRequest(f"{where}: {datatype} data must be JSON numbers (found {_describe(flat)})")
    return np.array([float(v) for v in values], dtype=dtype)


def _describe(parsed: np.ndarray) -> str:
    kinds = {parsed.dtype.kind} if parsed.dtype.kind != "O" else {_kind_of(v) for v in parsed.reshape(-1).tolist()}
    if "U" in kinds:
        return "strings"
    if "O" in kinds:
        return "null, lists or objects"
    if "f" in kinds:
        return "non-integer numbers"
    return "booleans"


def _kind_of(value: object) -> str:
    if isinstance(value, str):
        return "U"
    if isinstance(value, bool):
        return "b"
    if isinstance(value, float):
        return "f"
    return "i" if isinstance(value, int) else "O"


def json_representable(array: np.ndarray, datatype: str) -> bool:
    """Whether `array_to_json` is lossless: finite floats only, BYTES must be valid UTF-8."""
    if datatype == "BYTES":
        for item in array.reshape(-1):
            if isinstance(item, str):
                continue
            try:
                bytes(item).decode("utf-8")
            except UnicodeDecodeError:
                return False
        return True
    if numpy_dtype(datatype).kind == "f":
        return bool(np.isfinite(array).all())
    return True


def array_to_json(array: np.ndarray, datatype: str) -> object:
    """Tensor data -> flat row-major JSON value: a list of UTF-8 strings for BYTES, else a contiguous 1-D
    numpy array that `orjson` (OPT_SERIALIZE_NUMPY) writes with the shortest round-tripping decimals."""
    if datatype == "BYTES":
        return [x if isinstance(x, str) else bytes(x).decode("utf-8") for x in array.reshape(-1)]
    return np.ascontiguousarray(array.reshape(-1), dtype=numpy_dtype(datatype))
