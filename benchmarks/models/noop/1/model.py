"""A Python-backend model: headroom imports this file and calls the one class with a predict() method."""

from __future__ import annotations

import numpy as np


class NoopModel:
    """Returns its input as its output (so everything measured around it is server overhead)."""

    def load(self) -> None:
        """Nothing to load; a real model would read its weights from its version directory here."""

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"output": inputs["input"]}
