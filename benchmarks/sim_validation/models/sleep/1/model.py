"""A batch costs fixed_ms + per_item_ms * B of sleeping (the GIL is released, no CPU is used)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np


class SleepModel:
    """Returns its input after sleeping as long as a batch of that size 'computes'."""

    def __init__(self) -> None:
        self.fixed_s = 0.02  # per-batch cost (s)
        self.per_item_s = 0.004  # per-item cost (s)

    def load(self, context: Any) -> None:
        params = context.config.parameters
        self.fixed_s = float(params.get("fixed_ms", 20.0)) / 1e3
        self.per_item_s = float(params.get("per_item_ms", 4.0)) / 1e3

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["input"]
        time.sleep(self.fixed_s + self.per_item_s * x.shape[0])
        return {"output": x}
