"""gRPC `ModelStreamInfer`: a bidirectional stream of ModelInferRequest -> ModelStreamInferResponse.

Each request in the stream is answered by exactly one response message: its `infer_response` (with the
request's `id`), or `error_message` for that request alone; the stream stays open for the next ones, as
Triton's. A request for a decoupled model (`many` returns its responses: the LLM, one per token chunk) is
answered by each of its responses in order, or by them and then an `error_message` if it fails midway.
Requests run concurrently (at most `max_inflight` at once; reading the stream pauses beyond it), so responses
come back in completion order; clients match them by `id`. When the client closes its side, the responses
still pending are sent, then the stream ends; when it cancels, the pending requests are cancelled with it
(every task here is owned by the RPC).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from headroom.core.errors import HeadroomError
from headroom.protocol.generated import headroom_inference_pb2 as pb

log = logging.getLogger(__name__)

InferOne = Callable[[pb.ModelInferRequest, Any], Awaitable[pb.ModelInferResponse]]
#: (request, context) -> the responses of a decoupled model, or None when the request is for another model.
InferMany = Callable[[pb.ModelInferRequest, Any], AsyncIterator[pb.ModelInferResponse] | None]


def _error(request: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    if not isinstance(request, pb.ModelInferRequest):  # bytes that did not parse: nothing to echo
        return pb.ModelStreamInferResponse(error_message=message)
    echo = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version, id=request.id)
    return pb.ModelStreamInferResponse(error_message=message, infer_response=echo)


async def stream_infer(infer: InferOne, requests: AsyncIterator[pb.ModelInferRequest], context: Any,
                       max_inflight: int = 64, many: InferMany | None = None
                       ) -> AsyncIterator[pb.ModelStreamInferResponse]:
    """Answer every request of the stream with `infer(request, context)` (or `many`'s responses); see the
    module docstring."""
    out: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
    gate = asyncio.Semaphore(max(1, max_inflight))
    pending: set[asyncio.Task[None]] = set()

    async def one(request: pb.ModelInferRequest) -> None:
        message: pb.ModelStreamInferResponse | None
        try:
            responses = many(request, context) if many is not None else None
            if responses is None:
                message = pb.ModelStreamInferResponse(infer_response=await infer(request, context))
            else:
                message = None
                async for response in responses:
                    out.put_nowait(pb.ModelStreamInferResponse(infer_response=response))
        except HeadroomError as exc:
            message = _error(request, exc.message)
        except Exception as exc:
            log.exception("gRPC ModelStreamInfer request failed")
            message = _error(request, f"internal error ({type(exc).__name__}); see the server log")
        finally:
            gate.release()
        if message is not None:
            out.put_nowait(message)

    async def read() -> None:
        try:
            async for request in requests:
                await gate.acquire()
                task = asyncio.create_task(one(request), name="stream-infer-request")
                pending.add(task)
                task.add_done_callback(pending.discard)
            while pending:
                await asyncio.wait(set(pending))
        finally:
            out.put_nowait(None)

    reader = asyncio.create_task(read(), name="stream-infer-reader")
    try:
        while (message := await out.get()) is not None:
            yield message
        await reader  # a failed read of the client's stream surfaces here
    finally:
        for task in (reader, *pending):
            task.cancel()


__all__ = ["stream_infer"]
