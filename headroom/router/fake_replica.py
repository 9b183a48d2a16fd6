"""A synthetic replica (like Envoy's FakeUpstream) for router tests and benchmarks, in-process or as a process.

It answers the V2 health endpoints, `POST /v2/models/{name}/infer` after `delay_ms` (every
`stall_every`-th one takes `stall_ms` instead) using at most `concurrency` requests at a time, streams
`POST /v1/completions` as SSE, and on SIGTERM reports not-ready at once, finishes what it holds, then exits.

    python -m headroom.router.fake_replica --port 8011 --delay-ms 10 --name r1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import FrameType
from typing import Literal

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from headroom.router.upstream import DRAINING_HEADER


@dataclass
class ReplicaBehaviour:
    """How the fake replica behaves (mutable: tests flip `ready` / `draining` while it runs) and what it saw."""

    name: str = "r"  # reported in answers
    delay_ms: float = 5.0  # service time of one inference
    stall_every: int = 0  # every Nth inference (N-1, 2N-1, ...) takes stall_ms instead (0 = never)
    stall_ms: float = 1000.0
    stall_offset: int = 0  # shifts which inferences stall, so replicas do not stall in lockstep
    stalls: int = 0  # inferences that stalled
    stalls_completed: int = 0  # stalled inferences that ran to the end (nobody cancelled them)
    concurrency: int = 4  # inferences served at once; the rest queue
    fail_status: int = 0  # answer every inference with this status (0 = succeed)
    fail_models: tuple[str, ...] = ()  # with fail_status: fail only inferences for these models (empty = all)
    ready: bool = True  # readiness endpoint answers 200 (False: loading)
    draining: bool = False  # readiness and inference answer 503 not_ready
    inflight: int = 0  # inferences admitted and unfinished
    started: int = 0  # inferences that got a slot
    served: int = 0  # inferences answered
    cancelled: int = 0  # inferences abandoned because the client went away


def make_app(b: ReplicaBehaviour) -> Starlette:
    """The replica's ASGI app."""
    sem = asyncio.Semaphore(b.concurrency)

    async def ready(request: Request) -> Response:
        if b.draining or not b.ready:
            return JSONResponse({"error": "draining", "reason": "not_ready"}, 503)
        return Response(status_code=200)

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    async def infer(request: Request) -> Response:
        body = await request.body()
        if b.draining:  # as a headroom server does: the header says the request never started here
            return JSONResponse({"error": "draining", "reason": "not_ready"}, 503, {DRAINING_HEADER: "1"})
        if b.fail_status and (not b.fail_models or request.path_params["name"] in b.fail_models):
            return JSONResponse({"error": "boom", "reason": "internal"}, b.fail_status)
        b.inflight += 1
        try:
            async with sem:
                b.started += 1
                stall = b.stall_every > 0 and (b.started + b.stall_offset) % b.stall_every == 0
                b.stalls += stall
                work = asyncio.ensure_future(asyncio.sleep((b.stall_ms if stall else b.delay_ms) / 1e3))
                gone = asyncio.ensure_future(request.receive())  # resolves on http.disconnect
                await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
                gone.cancel()
                if not work.done():  # the client went away (e.g. it lost a hedge race): stop working
                    work.cancel()
                    b.cancelled += 1
                    return Response(status_code=499)
                b.stalls_completed += stall
        finally:
            b.inflight -= 1
        b.served += 1
        return Response(orjson.dumps({"model_name": request.path_params["name"], "replica": b.name,
                                      "echo_bytes": len(body)}), media_type="application/json")

    async def completions(request: Request) -> Response:
        doc = orjson.loads(await request.body())
        if b.draining:
            return JSONResponse({"error": {"message": "draining", "type": "server_error"}}, 503,
                                {DRAINING_HEADER: "1"})
        n = int(doc.get("max_tokens", 5))

        async def events() -> AsyncIterator[bytes]:
            b.inflight += 1
            try:
                for i in range(n):
                    await asyncio.sleep(b.delay_ms / 1e3)
                    yield b"data: " + orjson.dumps({"replica": b.name, "index": i}) + b"\n\n"
                yield b"data: [DONE]\n\n"
            finally:
                b.inflight -= 1
                b.served += 1

        return StreamingResponse(events(), media_type="text/event-stream")

    async def stats(request: Request) -> Response:
        return JSONResponse({"name": b.name, "served": b.served, "cancelled": b.cancelled,
                             "inflight": b.inflight})

    return Starlette(routes=[
        Route("/v2/health/ready", ready), Route("/v2/health/live", live),
        Route("/v2/models/{name}/infer", infer, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]), Route("/stats", stats),
    ])


class DrainingServer(uvicorn.Server):
    """SIGTERM: not-ready at once, finish in-flight requests, then exit (what a headroom replica does)."""

    def __init__(self, config: uvicorn.Config, behaviour: ReplicaBehaviour) -> None:
        super().__init__(config)
        self.behaviour = behaviour
        self._drainer: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self.behaviour.draining:
            super().handle_exit(sig, frame)
            return
        self.behaviour.draining = True
        self._drainer = asyncio.get_event_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self.behaviour.inflight > 0:
            await asyncio.sleep(0.01)
        self.should_exit = True


def bound_socket() -> socket.socket:
    """A 127.0.0.1 socket on a free port with TCP_NODELAY (uvicorn does not set it on sockets it is handed,
    and without it every response waits ~40 ms for a delayed ACK)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.asynccontextmanager
async def serve_asgi(app: Starlette, lifespan: Literal["on", "off"] = "off") -> AsyncIterator[str]:
    """Run an ASGI app with uvicorn on this event loop on a free 127.0.0.1 port; yields its base URL."""
    sock = bound_socket()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan=lifespan))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def main() -> None:
    """Run one fake replica process (SIGTERM drains)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", default="r")
    p.add_argument("--delay-ms", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--ready-after-s", type=float, default=0.0)
    p.add_argument("--fail-status", type=int, default=0, help="answer every inference with this status (a bad "
                   "version in rollout tests)")
    a = p.parse_args()
    b = ReplicaBehaviour(name=a.name, delay_ms=a.delay_ms, concurrency=a.concurrency, ready=a.ready_after_s <= 0,
                         fail_status=a.fail_status)

    async def run() -> None:
        server = DrainingServer(uvicorn.Config(make_app(b), host="127.0.0.1", port=a.port, log_level="warning",
                                               lifespan="off"), b)
        if not b.ready:
            asyncio.get_running_loop().call_later(a.ready_after_s, lambda: setattr(b, "ready", True))
        await server.serve()

    asyncio.run(run())


if __name__ == "__main__":
    main()
