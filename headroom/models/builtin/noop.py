"""noop: returns its input unchanged, so everything measured around it is the server's own overhead.

It runs on the python backend exactly as a user's `model.py` class would, but its class ships with headroom
(`model_class: headroom.models.builtin.noop:NoopModel`): nothing is imported from the model repository, so
the default `--trusted-backends` (no `python`) serves it. docs/models.md shows how to write your own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from headroom.models.backends.python_backend import PythonModel
from headroom.models.base import LoadContext


class Identity:
    """The user-style class: `predict` returns its input as its output."""

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"output": inputs["input"]}


class NoopModel(PythonModel):
    """The python backend around `Identity`, without a model.py to import."""

    def load(self, ctx: LoadContext) -> None:
        self._path = Path(__file__)
        self._user = Identity()
