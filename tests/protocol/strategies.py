"""Hypothesis strategies shared by the protocol tests: arrays of every V2 datatype."""

from __future__ import annotations

import contextlib
import tracemalloc
from collections.abc import Callable
from typing import Literal

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from headroom.core.errors import InvalidRequest
from headroom.core.types import V2_TO_NUMPY
from headroom.models.config import ModelConfig, TensorSpec

NUMERIC = tuple(d for d in V2_TO_NUMPY if d != "BYTES")
ALL_DATATYPES = tuple(V2_TO_NUMPY)


def shapes(min_side: int = 1) -> st.SearchStrategy[tuple[int, ...]]:
    return hnp.array_shapes(min_dims=1, max_dims=3, min_side=min_side, max_side=4)


def _elements(datatype: str, json_safe: bool) -> st.SearchStrategy[object] | None:
    dtype = V2_TO_NUMPY[datatype]
    if dtype.kind == "f":
        width: Literal[16, 32, 64] = 16 if dtype.itemsize == 2 else 32 if dtype.itemsize == 4 else 64
        return st.floats(width=width, allow_nan=not json_safe, allow_infinity=not json_safe)
    return None


def _bytes_array(shape: tuple[int, ...], items: list[bytes]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(shape)


@st.composite
def tensors(draw: st.DrawFn, datatype: str, json_safe: bool = False, min_side: int = 1) -> np.ndarray:
    """An array of `datatype`; `json_safe` keeps floats finite and BYTES valid UTF-8."""
    shape = draw(shapes(min_side))
    if datatype == "BYTES":
        count = int(np.prod(shape))
        element = st.text(max_size=8).map(lambda s: s.encode("utf-8")) if json_safe else st.binary(max_size=8)
        return _bytes_array(shape, draw(st.lists(element, min_size=count, max_size=count)))
    dtype = V2_TO_NUMPY[datatype]
    return draw(hnp.arrays(dtype, shape, elements=_elements(datatype, json_safe)))


@st.composite
def typed_tensors(draw: st.DrawFn, json_safe: bool = False, min_side: int = 1) -> tuple[str, np.ndarray]:
    datatype = draw(st.sampled_from(ALL_DATATYPES))
    return datatype, draw(tensors(datatype, json_safe, min_side))


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Exact equality including shape, dtype and NaN positions (BYTES: str elements count as UTF-8)."""
    if a.shape != b.shape:
        return False
    if a.dtype == object or b.dtype == object:
        return _as_bytes(a) == _as_bytes(b)
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _as_bytes(array: np.ndarray) -> list[bytes]:
    return [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in array.reshape(-1)]


#: A batching model with a variable dimension: the config alone does not bound an input's size.
VARIABLE = ModelConfig(name="m", backend="python", inputs=(TensorSpec("x", "BYTES", (-1,)),),
                       outputs=(TensorSpec("y", "FP32", (1,)),), max_batch_size=8)
MIB = 1 << 20

#: Dimensions a hostile client may declare: any int64 (gRPC) or JSON integer (HTTP), biased to the edges.
EDGE_DIMS = (0, 1, 2, 3, 2**31 - 1, 2**31, 2**32, 2**40, 2**53, 2**62, 2**63 - 1)


def hostile_dims(low: int = -(2**63), high: int = 2**64 - 1) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(EDGE_DIMS), st.integers(low, high), st.integers(0, 2**16))


def hostile_shapes(low: int = -(2**63), high: int = 2**64 - 1) -> st.SearchStrategy[list[int]]:
    """Shapes of rank 0..40 whose dimensions range over the whole int64 (or JSON) range."""
    return st.lists(hostile_dims(low, high), min_size=0, max_size=40)


def traced_peak_bytes(call: Callable[[], object]) -> int:
    """Peak bytes Python and numpy allocated while `call` ran (tracemalloc sees numpy's buffers)."""
    tracemalloc.start()
    try:
        with contextlib.suppress(InvalidRequest):
            call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
