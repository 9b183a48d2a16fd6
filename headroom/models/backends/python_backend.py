"""The `python` backend: a user class in `<version>/model.py`, imported by file path.

The user writes (only `predict` is required)::

    class Model:
        def load(self, context):            # optional; context.version_dir, context.config.parameters
            ...
        def predict(self, inputs):          # dict name -> numpy array (batched); returns the same kind
            return {"output": inputs["input"]}
        def preprocess(self, inputs, parameters): ...   # optional, per request
        def postprocess(self, outputs, parameters): ... # optional, per request

Parameters: `model_file` (default model.py) and `class_name` (default: the one class in the file that has a
`predict` method).
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from headroom.models.artifacts import ModelLoadError, resolve_artifact
from headroom.models.base import Arrays, LoadContext, Model


def _import_file(path: Path, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"{path}: not importable as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling in user code look themselves up here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ModelLoadError(f"{path}: importing it failed: {type(exc).__name__}: {exc}") from exc
    return module


def _find_class(module: ModuleType, class_name: object, path: Path) -> type:
    if class_name is not None:
        cls = getattr(module, str(class_name), None)
        if not isinstance(cls, type):
            raise ModelLoadError(f"{path}: no class named {class_name!r} (parameters.class_name)")
        return cls
    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and obj.__module__ == module.__name__ and callable(getattr(obj, "predict", None))
    ]
    if len(found) != 1:
        names = [c.__name__ for c in found]
        raise ModelLoadError(
            f"{path}: expected exactly one class with a predict() method, found {names or 'none'}; "
            f"define one, or name it with `parameters: {{class_name: ...}}` in config.yaml"
        )
    return found[0]


def _as_arrays(value: object, what: str, path: Path) -> dict[str, np.ndarray]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{path}: {what} must return a dict of name -> numpy array, got {type(value).__name__}")
    return {str(k): v if isinstance(v, np.ndarray) else np.asarray(v) for k, v in value.items()}


class PythonModel(Model):
    """Adapts a user's plain Python class to the Model contract."""

    _user: Any = None
    _path: Path
    _module_name: str = ""

    def load(self, ctx: LoadContext) -> None:
        params = self.config.parameters
        where = f"model {self.config.name!r} ({ctx.version_dir})"
        self._path = resolve_artifact(str(params.get("model_file", "model.py")), ctx.version_dir, where)
        # flat (no parent package, so pickle can import it) and unique per load (a reload of the same
        # version must not share, or later pop, the old copy's sys.modules entry)
        safe = re.sub(r"\W", "_", f"{self.config.name}_v{ctx.version_dir.name}")
        self._module_name = f"headroom_model_{safe}_{id(self):x}"
        with ctx.stage("read_weights"):
            module = _import_file(self._path, self._module_name)
            cls = _find_class(module, params.get("class_name"), self._path)
        with ctx.stage("build_session"):
            try:
                user = cls()
                loader = getattr(user, "load", None)
                if callable(loader):
                    if inspect.signature(loader).parameters:
                        loader(ctx)
                    else:
                        loader()
            except ModelLoadError:
                raise
            except Exception as exc:
                raise ModelLoadError(
                    f"{self._path}: {cls.__name__}.load() failed: {type(exc).__name__}: {exc}"
                ) from exc
        self._user = user

    def _hook(self, name: str) -> Any:
        if self._user is None:
            raise RuntimeError(f"model {self.config.name!r} used before load()")
        return getattr(self._user, name, None)

    def warmup_inputs(self, batch_size: int) -> Arrays:
        hook = self._hook("warmup_inputs")
        if callable(hook):
            return _as_arrays(hook(batch_size), "warmup_inputs()", self._path)
        return super().warmup_inputs(batch_size)

    def preprocess(self, inputs: Arrays, parameters: Mapping[str, object]) -> Arrays:
        hook = self._hook("preprocess")
        return _as_arrays(hook(dict(inputs), parameters), "preprocess()", self._path) if callable(hook) else inputs

    def collate(self, items: Sequence[Arrays]) -> Arrays:
        hook = self._hook("collate")
        return _as_arrays(hook(list(items)), "collate()", self._path) if callable(hook) else super().collate(items)

    def predict(self, batch: Arrays) -> Arrays:
        return _as_arrays(self._hook("predict")(dict(batch)), "predict()", self._path)

    def postprocess(self, outputs: Arrays, parameters: Mapping[str, object]) -> Arrays:
        hook = self._hook("postprocess")
        return _as_arrays(hook(dict(outputs), parameters), "postprocess()", self._path) if callable(hook) else outputs

    def unload(self) -> None:
        hook = getattr(self._user, "unload", None)
        if callable(hook):
            hook()
        self._user = None
        sys.modules.pop(self._module_name, None)
