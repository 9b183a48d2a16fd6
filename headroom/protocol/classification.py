"""The V2 classification extension: replace an output by its top-k entries as "score:index[:label]" strings.

Follows Triton: for an output with two or more dimensions the first dimension is the batch and top-k is taken
over the remaining (flattened) elements of each item, giving BYTES of shape [batch, k]; a 0-d or 1-d output
gives shape [k]. Scores are printed with six decimals (C++ `std::to_string`); ties keep the lower index.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from headroom.core.errors import InvalidRequest
from headroom.core.types import Tensor


def _entries(scores: np.ndarray, class_count: int, labels: Sequence[str] | None) -> list[bytes]:
    k = min(class_count, scores.size)
    order = np.argsort(-scores.astype(np.float64), kind="stable")[:k]
    out = []
    for index in order.tolist():
        text = f"{float(scores[index]):f}:{index}"
        if labels is not None and index < len(labels):
            text += f":{labels[index]}"
        out.append(text.encode("utf-8"))
    return out


def classify(tensor: Tensor, class_count: int, labels: Sequence[str] | None = None) -> Tensor:
    """Top-`class_count` classification of a numeric output tensor (same name, datatype BYTES)."""
    if class_count <= 0:
        raise InvalidRequest(f"output {tensor.name!r}: classification count must be > 0, got {class_count}")
    if tensor.datatype in ("BYTES", "BOOL"):
        raise InvalidRequest(f"output {tensor.name!r}: classification needs a numeric output, not {tensor.datatype}")
    data = np.asarray(tensor.data)
    out: np.ndarray
    if data.ndim >= 2:
        rows = data.reshape(data.shape[0], -1)
        entries = [_entries(row, class_count, labels) for row in rows]
        k = len(entries[0]) if entries else min(class_count, rows.shape[1])
        out = np.empty((rows.shape[0], k), dtype=object)
        for i, row_entries in enumerate(entries):
            out[i, :] = row_entries
    else:
        flat = _entries(data.reshape(-1), class_count, labels)
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
    return Tensor(name=tensor.name, datatype="BYTES", shape=tuple(out.shape), data=out)
