from __future__ import annotations

import numpy as np
import pytest

from headroom.core.errors import InvalidRequest
from headroom.core.types import Tensor
from headroom.protocol.classification import classify


def _tensor(data: np.ndarray) -> Tensor:
    return Tensor("probs", "FP32", data.shape, data)


def test_batched_top_k_per_item() -> None:
    out = classify(_tensor(np.array([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05]], np.float32)), 2)
    assert out.shape == (2, 2) and out.datatype == "BYTES"
    assert out.data.tolist() == [[b"0.500000:1", b"0.300000:2"], [b"0.900000:0", b"0.050000:1"]]


def test_unbatched_k_capped_and_labels_partial() -> None:
    out = classify(_tensor(np.array([1.0, 3.0], np.float32)), 5, labels=["zero"])
    assert out.shape == (2,)
    assert out.data.tolist() == [b"3.000000:1", b"1.000000:0:zero"]  # index 1 has no label


def test_ties_keep_the_lower_index() -> None:
    out = classify(_tensor(np.array([0.5, 0.5, 0.5], np.float32)), 3)
    assert [x.split(b":")[1] for x in out.data.tolist()] == [b"0", b"1", b"2"]


def test_bad_count() -> None:
    with pytest.raises(InvalidRequest, match="must be > 0"):
        classify(_tensor(np.ones(2, np.float32)), 0)
