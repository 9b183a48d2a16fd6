"""A small test server (Starlette + uvicorn on 127.0.0.1, free port, own thread) with known behaviour.

- `/v2/models/{m}/infer`: fixed service time; `concurrency=1` serves strictly one at a time (a virtual-time
  queue, so capacity is exactly 1/service_s); `stall_s` freezes the whole event loop once (like ^Z) on the
  first request at or after `stall_after_s`; `fail_every` answers 503 to every n-th request; Server-Timing.
- `/v1/chat/completions`, `/v1/completions`: SSE streams of `num_tokens` chunks `token_gap_s` apart after
  `first_token_s`, with a final usage chunk.
- `/v1/embeddings`, `/image` (PNG only), `/metrics` (Prometheus text).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class FakeServerConfig:
    """Behaviour knobs (mutable on purpose: a test may change them between runs)."""

    service_s: float = 0.002  # service time per request
    concurrency: int = 0  # 1 = strictly serial; 0 = unlimited
    stall_s: float = 0.0  # freeze the event loop this long, once
    stall_after_s: float = 0.0  # ... on the first request at or after this many seconds since startup
    fail_every: int = 0  # 503 every n-th request (0 = never)
    num_tokens: int = 5  # streamed chunks per completion
    first_token_s: float = 0.01  # delay before the first chunk
    token_gap_s: float = 0.005  # delay between chunks


class FakeServer:
    def __init__(self, config: FakeServerConfig) -> None:
        self.config = config
        self.requests = 0
        self.in_flight = 0
        self._stalled = False
        self.stall_started_s = 0.0  # time.monotonic() when the stall began (0 = not yet)
        self._next_free_s = 0.0
        self._started_s = time.monotonic()
        self.app = Starlette(
            routes=[
                Route("/v2/models/{model}/infer", self.infer, methods=["POST"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.chat, methods=["POST"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/image", self.image, methods=["POST"]),
                Route("/metrics", self.metrics, methods=["GET"]),
            ]
        )

    def _maybe_stall(self) -> None:
        cfg = self.config
        if cfg.stall_s > 0 and not self._stalled and time.monotonic() - self._started_s >= cfg.stall_after_s:
            self._stalled = True
            self.stall_started_s = time.monotonic()
            time.sleep(cfg.stall_s)  # deliberately blocks the loop: the whole server freezes

    async def _serve(self) -> float:
        """Wait out the service time; returns the time spent queued (s)."""
        cfg = self.config
        arrived_s = time.monotonic()
        if cfg.concurrency == 1:
            start_s = max(arrived_s, self._next_free_s)
            self._next_free_s = start_s + cfg.service_s
            await asyncio.sleep(self._next_free_s - arrived_s)
            return start_s - arrived_s
        await asyncio.sleep(cfg.service_s)
        return 0.0

    async def infer(self, request: Request) -> Response:
        self.requests += 1
        number = self.requests
        self._maybe_stall()
        body = await request.json()
        if self.config.fail_every and number % self.config.fail_every == 0:
            return JSONResponse({"error": "overloaded"}, status_code=503)
        self.in_flight += 1
        try:
            queued_s = await self._serve()
        finally:
            self.in_flight -= 1
        timing = f"queue;dur={queued_s * 1000:.3f}, compute;dur={self.config.service_s * 1000:.3f}"
        outputs = [{"name": "out", "shape": [1], "datatype": "FP32", "data": [float(len(body["inputs"]))]}]
        return JSONResponse(
            {"model_name": request.path_params["model"], "outputs": outputs}, headers={"server-timing": timing}
        )

    async def chat(self, request: Request) -> Response:
        self.requests += 1
        body = await request.json()
        cfg = self.config
        chat = request.url.path.endswith("chat/completions")

        def chunk(text: str) -> str:
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            return "data: " + json.dumps({"choices": [choice]}) + "\n\n"

        async def events() -> AsyncIterator[str]:
            await asyncio.sleep(cfg.first_token_s)
            for i in range(cfg.num_tokens):
                if i:
                    await asyncio.sleep(cfg.token_gap_s)
                yield chunk(f"tok{i} ")
            usage = {"prompt_tokens": 7, "completion_tokens": cfg.num_tokens, "total_tokens": 7 + cfg.num_tokens}
            yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
            yield "data: [DONE]\n\n"

        if body.get("stream"):
            return StreamingResponse(events(), media_type="text/event-stream")
        await asyncio.sleep(cfg.first_token_s)
        return JSONResponse({"choices": [{"text": "x"}], "usage": {"prompt_tokens": 7, "completion_tokens": 1}})

    async def embeddings(self, request: Request) -> Response:
        self.requests += 1
        await request.json()
        await self._serve()
        return JSONResponse({"data": [{"embedding": [0.0, 1.0]}], "usage": {"prompt_tokens": 3}})

    async def image(self, request: Request) -> Response:
        self.requests += 1
        data = await request.body()
        if not data.startswith(b"\x89PNG"):
            return JSONResponse({"error": "not a PNG"}, status_code=415)
        await self._serve()
        return JSONResponse({"label": 3})

    async def metrics(self, request: Request) -> Response:
        text = (
            "# TYPE fake_queue_depth gauge\n"
            f"fake_queue_depth {self.in_flight}\n"
            "# TYPE fake_batch_size histogram\n"
            'fake_batch_size_bucket{le="1"} 3\n'
            f"fake_batch_size_sum {self.requests}\n"
            f"fake_batch_size_count {self.requests}\n"
            f"unrelated_total {self.requests}\n"
        )
        return PlainTextResponse(text)


@contextmanager
def running_server(config: FakeServerConfig) -> Iterator[tuple[str, FakeServer]]:
    """Start a FakeServer on 127.0.0.1 (free port) in a daemon thread; yields (base_url, server)."""
    fake = FakeServer(config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(fake.app, log_level="warning", lifespan="off", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("fake server did not start")
        time.sleep(0.01)
    fake._started_s = time.monotonic()
    try:
        yield f"http://127.0.0.1:{port}", fake
    finally:
        server.should_exit = True
        thread.join(timeout=10.0)
        sock.close()


def main() -> None:
    """`python -m tests.loadgen.fake_server --port P --service-s S`: serve until killed (knob-sweep tests)."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--service-s", type=float, default=0.002)
    args = parser.parse_args()
    fake = FakeServer(FakeServerConfig(service_s=args.service_s))
    uvicorn.run(fake.app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="off", access_log=False)


if __name__ == "__main__":
    main()
