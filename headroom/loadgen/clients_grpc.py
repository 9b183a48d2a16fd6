"""KServe V2 over gRPC through `tritonclient.grpc.aio` (imported only when the v2-grpc protocol is used)."""

from __future__ import annotations

import numpy as np

from headroom.core.clock import Clock
from headroom.loadgen.clients import ClientConfig
from headroom.loadgen.records import ClientReply
from headroom.loadgen.workloads import Sample


def _grpc_target(url: str) -> str:
    """tritonclient wants host:port; accept grpc://host:port and http://host:port too."""
    for prefix in ("grpc://", "http://", "https://"):
        if url.startswith(prefix):
            url = url[len(prefix) :]
    return url.rstrip("/")


class GrpcV2Client:
    """`ModelInfer` calls on one shared channel; the status is the gRPC code name (OK, UNAVAILABLE, ...)."""

    def __init__(self, config: ClientConfig, clock: Clock) -> None:
        try:
            from tritonclient.grpc import aio as triton_aio
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ValueError("v2-grpc needs tritonclient[grpc]: pip install 'tritonclient[grpc]'") from exc
        self._aio = triton_aio
        self._config = config
        self._clock = clock
        self._client = triton_aio.InferenceServerClient(url=_grpc_target(config.url))

    async def aclose(self) -> None:
        await self._client.close()

    def _inputs(self, sample: Sample) -> list[object]:
        if sample.pixels is not None:
            tensor = self._aio.InferInput(self._config.input_name or "input", list(sample.pixels.shape), "FP32")
            tensor.set_data_from_numpy(np.ascontiguousarray(sample.pixels, dtype=np.float32))
        else:
            shape = list(self._config.text_shape)
            tensor = self._aio.InferInput(self._config.input_name or "text", shape, "BYTES")
            tensor.set_data_from_numpy(np.array([sample.text.encode()], dtype=np.object_).reshape(shape))
        return [tensor]

    async def send(self, sample: Sample) -> ClientReply:
        sent_s = self._clock.now_s()
        try:
            await self._client.infer(self._config.model, self._inputs(sample), client_timeout=self._config.timeout_s)
        except Exception as exc:  # tritonclient raises InferenceServerException for every RPC failure
            status_fn = getattr(exc, "status", None)
            raw = str(status_fn()) if callable(status_fn) else "error"
            status = raw.removeprefix("StatusCode.") if raw and raw != "None" else "error"
            if status == "DEADLINE_EXCEEDED":
                status = "timeout"
            return ClientReply(ok=False, status=status, sent_s=sent_s, end_s=self._clock.now_s(), error=str(exc)[:200])
        return ClientReply(ok=True, status="OK", sent_s=sent_s, end_s=self._clock.now_s())
