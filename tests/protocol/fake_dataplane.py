"""A small in-memory InferenceDataPlane for protocol tests (real codecs and validation, trivial models).

Models:
- `identity`: INPUT0 (any shape, FP32) -> OUTPUT0, the same values; batches (max_batch_size 8).
- `add`: INPUT0 + INPUT1 (FP32 [4]) -> OUTPUT0 = sum, OUTPUT1 = difference; batches (max_batch_size 8).
- `echo_bytes`: BYTES [-1] -> BYTES, the same strings; does not batch.
- `slow`: FP32 [1] that waits until the client goes away; records how it learnt of the cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from headroom.core.dataplane import DisconnectWatcher, ModelMetadata, ServerMetadata, TensorMetadata
from headroom.core.errors import Cancelled, ModelNotFound
from headroom.core.types import InferenceRequest, InferenceResponse, Tensor
from headroom.models.config import ModelConfig, TensorSpec
from headroom.protocol.validation import validate_against

Model = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def _spec(name: str, datatype: str, *shape: int) -> TensorSpec:
    return TensorSpec(name=name, datatype=datatype, shape=tuple(shape))


CONFIGS: dict[str, ModelConfig] = {
    "identity": ModelConfig(
        name="identity",
        backend="python",
        inputs=(_spec("INPUT0", "FP32", -1),),
        outputs=(_spec("OUTPUT0", "FP32", -1),),
        max_batch_size=8,
    ),
    "add": ModelConfig(
        name="add",
        backend="python",
        inputs=(_spec("INPUT0", "FP32", 4), _spec("INPUT1", "FP32", 4)),
        outputs=(_spec("OUTPUT0", "FP32", 4), _spec("OUTPUT1", "FP32", 4)),
        max_batch_size=8,
    ),
    "echo_bytes": ModelConfig(
        name="echo_bytes",
        backend="python",
        inputs=(_spec("INPUT0", "BYTES", -1),),
        outputs=(_spec("OUTPUT0", "BYTES", -1),),
    ),
    "slow": ModelConfig(
        name="slow", backend="python", inputs=(_spec("INPUT0", "FP32", 1),), outputs=(_spec("OUTPUT0", "FP32", 1),)
    ),
}
MODELS: dict[str, Model] = {
    "identity": lambda x: {"OUTPUT0": x["INPUT0"]},
    "add": lambda x: {"OUTPUT0": x["INPUT0"] + x["INPUT1"], "OUTPUT1": x["INPUT0"] - x["INPUT1"]},
    "echo_bytes": lambda x: {"OUTPUT0": x["INPUT0"]},
}


def _batched_shape(spec: TensorSpec, config: ModelConfig) -> tuple[int, ...]:
    return (-1, *spec.shape) if config.max_batch_size > 0 else spec.shape


class FakeDataPlane:
    """Implements headroom.core.dataplane.InferenceDataPlane over CONFIGS/MODELS."""

    def __init__(self, ignore_disconnect: bool = False) -> None:
        self.ignore_disconnect = ignore_disconnect  # `slow` never looks at its watcher (a misbehaving plane)
        self.cancelled: list[tuple[str, str]] = []  # (request id, "watcher" | "task") for `slow` requests
        self.started = asyncio.Event()  # set when `slow` starts waiting
        self.gone = asyncio.Event()  # set when a `slow` request learnt that its client went away

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(name="headroom", version="test", extensions=("binary_tensor_data", "classification"))

    def _config(self, name: str, version: str) -> ModelConfig:
        config = CONFIGS.get(name)
        if config is None or version not in ("", "1"):
            raise ModelNotFound(f"unknown model {name!r} version {version!r}; known: {', '.join(CONFIGS)}")
        return config

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        config = self._config(name, version)
        return ModelMetadata(
            name=name,
            versions=("1",),
            platform="python",
            inputs=tuple(TensorMetadata(s.name, s.datatype, _batched_shape(s, config)) for s in config.inputs),
            outputs=tuple(TensorMetadata(s.name, s.datatype, _batched_shape(s, config)) for s in config.outputs),
        )

    def model_ready(self, name: str, version: str = "") -> bool:
        self._config(name, version)
        return True

    async def infer(
        self, request: InferenceRequest, disconnected: DisconnectWatcher | None = None
    ) -> InferenceResponse:
        config = self._config(request.model_name, request.model_version)
        validate_against(request, config)
        if request.model_name == "slow":
            self.started.set()
            if disconnected is None:
                raise Cancelled("slow needs a disconnect watcher")
            try:
                if self.ignore_disconnect:
                    await asyncio.Event().wait()  # only cancellation ends this
                await disconnected()
            except asyncio.CancelledError:
                self.cancelled.append((request.request_id, "task"))
                self.gone.set()
                raise
            self.cancelled.append((request.request_id, "watcher"))
            self.gone.set()
            raise Cancelled("client went away")
        results = MODELS[request.model_name]({t.name: t.data for t in request.inputs})
        outputs = tuple(
            Tensor(s.name, s.datatype, tuple(results[s.name].shape), results[s.name]) for s in config.outputs
        )
        return InferenceResponse(
            request_id=request.request_id,
            model_name=request.model_name,
            model_version="1",
            outputs=outputs,
            requested=request.outputs,
            parameters={"echo": request.parameters.get("echo", "")} if "echo" in request.parameters else {},
        )
