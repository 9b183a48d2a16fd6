"""The serving path's own CPU per request, in process and without sockets: gateway -> Starlette ->
data plane -> batcher -> a zero-cost embedding model whose preprocess runs inline, as minilm's does. What is
left is what the event loop pays per request.

    .venv/bin/python benchmarks/serving/bench_app_cpu.py [--requests 4000] [--concurrency 32] [--path /v1/embeddings]
    # A/B against the last commit, interleaved (same machine, same minute):
    git archive HEAD headroom | tar -x -C /tmp/base
    for i in 1 2 3; do PYTHONPATH=/tmp/base .venv/bin/python benchmarks/serving/bench_app_cpu.py; \
                       .venv/bin/python benchmarks/serving/bench_app_cpu.py; done

Prints one JSON line: process CPU microseconds per request (time.process_time: every thread), wall
microseconds per request, and the count of non-200 answers (must be 0). uvicorn's HTTP parsing is not
included (it is the same for every version of headroom); `run_offline_throughput.py` measures the whole server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from headroom.core.clock import MonotonicClock
from headroom.gateway.app import GatewaySetup, wrap_app
from headroom.gateway.middleware import GatewayConfig
from headroom.models.backends.python_backend import PythonModel
from headroom.models.repository import ModelRepository
from headroom.server.dataplane import DataPlane, ServedVersion
from headroom.server.http_app import HttpApi, HttpLimits, build_http_app
from headroom.server.metrics import ServerMetrics

MODEL = """
import numpy as np

class FakeEmbedding:
    def predict(self, inputs):
        return {"embedding": np.zeros((inputs["text"].shape[0], 384), dtype=np.float32)}
"""
CONFIG = """
backend: python
max_batch_size: 16
inputs: [{name: text, datatype: BYTES, shape: [1]}]
outputs: [{name: embedding, datatype: FP32, shape: [384]}]
dynamic_batching: {max_queue_delay_ms: 0, max_queue_size: 1024}
warmup: {batch_sizes: [1]}
parameters: {model_class: "bench_app_cpu:InlinePreprocess"}
"""


class InlinePreprocess(PythonModel):
    """The Python backend with minilm's `cheap_preprocess` (decode on the event loop, no thread hop)."""

    cheap_preprocess = True


async def measure(requests: int, concurrency: int, path: str) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # parameters.model_class imports this file
    root = Path(tempfile.mkdtemp(prefix="headroom-appcpu-"))
    (root / "fakeemb" / "1").mkdir(parents=True)
    (root / "fakeemb" / "config.yaml").write_text(textwrap.dedent(CONFIG))
    (root / "fakeemb" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    repo = ModelRepository(root)
    registry = CollectorRegistry()
    dataplane = DataPlane(ServerMetrics(registry), MonotonicClock())
    for loaded in await repo.load_async(repo.scan(None)):
        dataplane.add(ServedVersion(name=loaded.name, version=loaded.version, config=loaded.config,
                                    model=loaded.model))
    # as `headroom serve` composes it (server.app.Server): the data plane writes the access line, the gateway not
    setup = GatewaySetup(GatewayConfig(access_log=False))
    app = wrap_app(build_http_app(HttpApi(dataplane, registry, HttpLimits())), setup, registry=registry)
    if path == "/v1/embeddings":
        body = json.dumps({"input": "a short sentence of about eight words", "model": "fakeemb"}).encode()
    else:
        body = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1],
                                       "data": ["a short sentence of about eight words"]}]}).encode()
    headers = [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    statuses: list[int] = []

    async def one() -> None:
        sent = False
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # the client never leaves

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            if message["type"] == "http.response.start":
                statuses.append(int(message["status"]))

        scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "root_path": "",
                 "headers": list(headers), "query_string": b"", "scheme": "http", "server": ("127.0.0.1", 80),
                 "client": ("127.0.0.1", 5)}
        await app(scope, receive, send)

    for _ in range(8):  # warm up every path
        await asyncio.gather(*(one() for _ in range(concurrency)))
    statuses.clear()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(max(1, requests // concurrency)):
        await asyncio.gather(*(one() for _ in range(concurrency)))
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    await dataplane.stop()
    n = len(statuses)
    return {"path": path, "requests": n, "concurrency": concurrency,
            "cpu_us_per_request": round(cpu_s / n * 1e6, 1),
            "wall_us_per_request": round(wall_s / n * 1e6, 1), "non_200": sum(s != 200 for s in statuses)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight at once")
    parser.add_argument("--path", default="/v1/embeddings", choices=("/v1/embeddings", "/v2/models/fakeemb/infer"))
    args = parser.parse_args()
    logging.getLogger("headroom").setLevel(logging.WARNING)
    print(json.dumps(asyncio.run(measure(args.requests, args.concurrency, args.path))))


if __name__ == "__main__":
    main()
