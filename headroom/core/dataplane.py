"""The transport-free data plane interface that HTTP and gRPC handlers call.

Handlers translate wire formats to `headroom.core.types` and call exactly one of these methods; errors come
back as `headroom.core.errors.HeadroomError` subclasses, which each transport maps to its own status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from headroom.core.types import InferenceRequest, InferenceResponse


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """One input or output as reported by model metadata."""

    name: str  # tensor name
    datatype: str  # V2 datatype
    shape: tuple[int, ...]  # full shape; -1 for the batch dimension and any variable dimension


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """The V2 model metadata response."""

    name: str  # model name
    versions: tuple[str, ...]  # loaded versions
    platform: str  # backend/platform string, e.g. "onnxruntime_onnx"
    inputs: tuple[TensorMetadata, ...]  # declared inputs
    outputs: tuple[TensorMetadata, ...]  # declared outputs


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """The V2 server metadata response."""

    name: str  # "headroom"
    version: str  # package version
    extensions: tuple[str, ...]  # supported protocol extensions


#: Awaitable that resolves when the client has gone away (HTTP disconnect, gRPC cancellation).
DisconnectWatcher = Callable[[], Awaitable[None]]


class InferenceDataPlane(Protocol):
    """What every transport needs from the server."""

    def live(self) -> bool:
        """The process is up and serving requests."""
        ...

    def ready(self) -> bool:
        """Every model is loaded and warmed up, and the server is not draining."""
        ...

    def server_metadata(self) -> ServerMetadata: ...

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        """Raises ModelNotFound for an unknown model or version."""
        ...

    def model_ready(self, name: str, version: str = "") -> bool:
        """Raises ModelNotFound for an unknown model or version."""
        ...

    async def infer(
        self, request: InferenceRequest, disconnected: DisconnectWatcher | None = None
    ) -> InferenceResponse:
        """Run one request through admission, batching and the model; exactly one result or error.

        `disconnected`, when given, is awaited concurrently: if it resolves first the request is dropped
        from the queue (or its result discarded) and `Cancelled` is raised.
        """
        ...
