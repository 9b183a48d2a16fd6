from __future__ import annotations

import numpy as np
import pytest

from headroom.core.errors import InvalidRequest
from headroom.core.types import InferenceRequest, RequestedOutput, Tensor
from headroom.models.config import ModelConfig, TensorSpec
from headroom.protocol.validation import batch_size_of, validate_against

BATCHED = ModelConfig(
    name="digits",
    backend="onnxruntime",
    inputs=(TensorSpec("image", "FP32", (1, 8, 8)), TensorSpec("mask", "BOOL", (-1,))),
    outputs=(TensorSpec("probs", "FP32", (10,)),),
    max_batch_size=4,
)
UNBATCHED = ModelConfig(
    name="raw", backend="python", inputs=(TensorSpec("x", "INT64", (2, -1)),), outputs=(TensorSpec("y", "INT64", (2,)),)
)


def _t(name: str, datatype: str, *shape: int) -> Tensor:
    dtype = object if datatype == "BYTES" else {"FP32": np.float32, "BOOL": np.bool_, "INT64": np.int64}[datatype]
    return Tensor(name, datatype, shape, np.zeros(shape, dtype=dtype))


def _request(*inputs: Tensor, outputs: tuple[RequestedOutput, ...] = ()) -> InferenceRequest:
    return InferenceRequest("r", "m", "", inputs, outputs)


def test_valid_batched_and_unbatched() -> None:
    request = _request(_t("image", "FP32", 3, 1, 8, 8), _t("mask", "BOOL", 3, 7))
    validate_against(request, BATCHED)
    assert batch_size_of(request, BATCHED) == 3
    validate_against(_request(_t("x", "INT64", 2, 5)), UNBATCHED)
    assert batch_size_of(_request(_t("x", "INT64", 2, 5)), UNBATCHED) == 1


@pytest.mark.parametrize(
    ("request_", "config", "message"),
    [
        (_request(_t("image", "FP32", 1, 1, 8, 8)), BATCHED, "missing input 'mask'; it expects image"),
        (
            _request(_t("image", "FP32", 1, 1, 8, 8), _t("mask", "BOOL", 1, 2), _t("extra", "FP32", 1)),
            BATCHED,
            "unknown input 'extra'",
        ),
        (
            _request(_t("image", "FP32", 1, 1, 8, 8), _t("mask", "FP32", 1, 2)),
            BATCHED,
            "input 'mask': datatype FP32 but the model expects BOOL",
        ),
        (
            _request(_t("image", "FP32", 1, 8, 8), _t("mask", "BOOL", 1, 2)),
            BATCHED,
            r"shape \[1, 8, 8\] but the model expects \[batch, 1, 8, 8\]",
        ),
        (
            _request(_t("image", "FP32", 5, 1, 8, 8), _t("mask", "BOOL", 5, 2)),
            BATCHED,
            "batch dimension 5 must be between 1 and max_batch_size 4",
        ),
        (_request(_t("image", "FP32", 0, 1, 8, 8), _t("mask", "BOOL", 0, 2)), BATCHED, "batch dimension 0"),
        (
            _request(_t("image", "FP32", 2, 1, 8, 8), _t("mask", "BOOL", 3, 2)),
            BATCHED,
            "batch dimension 3 differs from other inputs' 2",
        ),
        (
            _request(_t("image", "FP32", 2, 1, 8, 9), _t("mask", "BOOL", 2, 2)),
            BATCHED,
            r"shape \[2, 1, 8, 9\] but the model expects \[batch, 1, 8, 8\]",
        ),
        (_request(_t("x", "INT64", 3, 5)), UNBATCHED, r"shape \[3, 5\] but the model expects \[2, -1\]"),
        (_request(_t("x", "INT64", 2, 5), outputs=(RequestedOutput("z"),)), UNBATCHED, "unknown output 'z'; it has y"),
    ],
)
def test_mismatches(request_: InferenceRequest, config: ModelConfig, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        validate_against(request_, config)
