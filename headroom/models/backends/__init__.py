"""Backend registry: `backend:` in config.yaml -> the Model class that runs it.

`parameters.model_class: "package.module:Class"` swaps in a subclass of the backend's class (the built-in
models use it to add tokenization, pooling or image decoding); anything else is rejected.
`backend: llm` is not here: generative models go to headroom.llm (see ModelRepository.llm_models).
A backend's module is imported when a model first uses it: an ONNX-only server never imports torch, an
LLM-only one never imports onnxruntime (each costs a large share of a cold start).
"""

from __future__ import annotations

from headroom.models.artifacts import ModelLoadError, import_object
from headroom.models.base import Model
from headroom.models.config import ModelConfig

BACKEND_CLASSES: dict[str, str] = {
    "onnxruntime": "headroom.models.backends.onnx:OnnxModel",
    "torch": "headroom.models.backends.torch_backend:TorchModel",
    "python": "headroom.models.backends.python_backend:PythonModel",
}


def backend_class(backend: str) -> type[Model] | None:
    """The Model class that runs `backend` (imports its module), or None for an unknown backend."""
    ref = BACKEND_CLASSES.get(backend)
    if ref is None:
        return None
    found: type[Model] = import_object(ref, f"backend {backend!r}")
    return found


def create_model(config: ModelConfig, where: str) -> Model:
    """Instantiate (not load) the Model for a config; raises ModelLoadError naming what to fix."""
    base = backend_class(config.backend)
    if base is None:
        raise ModelLoadError(
            f"{where}: backend {config.backend!r} is not served by the tensor server "
            f"(available: {', '.join(BACKEND_CLASSES)})"
        )
    cls: type[Model] = base
    ref = config.parameters.get("model_class")
    if ref is not None:
        found = import_object(str(ref), f"{where}.parameters.model_class")
        if not (isinstance(found, type) and issubclass(found, base)):
            raise ModelLoadError(
                f"{where}.parameters.model_class: {ref!r} must be a subclass of {base.__name__} "
                f"(the {config.backend} backend's class)"
            )
        cls = found
    if config.backend == "torch" and config.runtime.mode == "compile" and not honours_runtime(cls, base):
        raise ModelLoadError(
            f"{where}.runtime.mode: {ref!r} overrides load() without applying `runtime:`, so `mode: compile` "
            f"would be ignored; use a class that calls apply_runtime/compile_now (for minilm: "
            f"headroom.models.builtin.runtime_variants:MiniLMTorchModel) or `mode: eager`"
        )
    return cls(config)


def honours_runtime(cls: type[Model], torch_model: type[Model]) -> bool:
    """Whether a subclass of `torch_model` (TorchModel) applies `runtime.mode` (inherits its load or says so)."""
    for klass in cls.__mro__:
        if klass is torch_model:
            return True
        if "runtime_aware" in vars(klass):
            return bool(vars(klass)["runtime_aware"])
        if "load" in vars(klass):
            return False
    return True


__all__ = ["BACKEND_CLASSES", "backend_class", "create_model"]
