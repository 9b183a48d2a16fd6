"""The built-in models under every runtime that makes sense for them, and how to switch between runtimes.

    digits   onnx: DigitsModel (model.onnx)          eager/compile: DigitsTorchModel (model.safetensors)
    minilm   onnx: MiniLMOnnxModel (model.onnx)      eager/compile: MiniLMTorchModel (the package's weights)

`RUNTIME_PARAMETERS` maps a model class to the backend + parameter changes that give the same model under
the other engine; `headroom profile --runtimes` uses it (headroom.profiling.runtimes). A user model that
ships both a torch module and an ONNX file can do the same by naming both classes in its config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from headroom.models.backends.torch_backend import TorchModel
from headroom.models.base import Arrays, LoadContext
from headroom.models.builtin.digits_transform import to_model_input
from headroom.models.builtin.minilm import weights_directory
from headroom.models.builtin.minilm_torch import MiniLMModel

DIGITS_ONNX = "headroom.models.builtin.digits:DigitsModel"
DIGITS_TORCH = "headroom.models.builtin.runtime_variants:DigitsTorchModel"
MINILM_ONNX = "headroom.models.builtin.minilm:MiniLMOnnxModel"
MINILM_TORCH_EAGER = "headroom.models.builtin.minilm:MiniLMModel"  # the name configs use (forwarded)
MINILM_TORCH = "headroom.models.builtin.runtime_variants:MiniLMTorchModel"

_DIGITS_TORCH_PARAMS = {"model_class": DIGITS_TORCH, "module": "headroom.models.builtin.digits_net:DigitsNet",
                        "weights": "model.safetensors"}
_DIGITS_ONNX_PARAMS = {"model_class": DIGITS_ONNX, "model_file": "model.onnx"}
_MINILM_TORCH_PARAMS = {"model_class": MINILM_TORCH}
_MINILM_ONNX_PARAMS = {"model_class": MINILM_ONNX, "model_file": "model.onnx"}

#: model_class -> {backend: parameter overrides} giving the same model on that backend
RUNTIME_PARAMETERS: Mapping[str, Mapping[str, Mapping[str, str]]] = {
    DIGITS_ONNX: {"torch": _DIGITS_TORCH_PARAMS},
    DIGITS_TORCH: {"onnxruntime": _DIGITS_ONNX_PARAMS},
    MINILM_ONNX: {"torch": _MINILM_TORCH_PARAMS},
    MINILM_TORCH_EAGER: {"torch": _MINILM_TORCH_PARAMS, "onnxruntime": _MINILM_ONNX_PARAMS},
    MINILM_TORCH: {"onnxruntime": _MINILM_ONNX_PARAMS},
}


class DigitsTorchModel(TorchModel):
    """digits on the torch backend (DigitsNet + model.safetensors) with the same transform as the ONNX one."""

    def preprocess(self, inputs: Arrays, parameters: Mapping[str, object]) -> Arrays:
        return {"input": to_model_input(inputs["input"])}


class MiniLMTorchModel(MiniLMModel):
    """minilm on the torch backend honouring `runtime:` (eager or torch.compile with cached artifacts)."""

    runtime_aware: ClassVar[bool] = True

    def load(self, ctx: LoadContext) -> None:
        super().load(ctx)
        if self.bert is None:
            raise RuntimeError("minilm: the encoder was not built")
        weights = weights_directory(self.config.parameters, ctx.version_dir, f"model {self.config.name!r}")
        self.bert = self.apply_runtime(self.bert, ctx, weights)  # type: ignore[assignment]
        self.module = self.bert
        self.compile_now(ctx)
