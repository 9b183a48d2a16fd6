"""Issue 17: `/v1/embeddings` decides admission before it parses the body (the model's name is peeked from the
raw bytes), and counts the time spent at the edge against the budget. Through a real `headroom serve`."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import _model
from tests.support.server import TRUST_PYTHON, RunningServer, run_server
from tests.support.waiting import until_async

LAG = """
import time
import numpy as np

class Lag:
    def predict(self, inputs):
        rows = [bytes(b) for b in inputs["w"].reshape(-1)]
        time.sleep(max(float(r) if r.isdigit() else 0.0 for r in rows) / 1000.0)  # warmup sends other text
        return {"embedding": np.ones((len(rows), 4), dtype=np.float32)}
"""

# an embedding model (one BYTES input, an FP32 `embedding`) that sleeps as many ms as its text says
LAG_CONFIG = """
backend: python
max_batch_size: 1
inputs: [{name: w, datatype: BYTES, shape: [1]}]
outputs: [{name: embedding, datatype: FP32, shape: [4]}]
dynamic_batching: {max_queue_delay_ms: 0, max_queue_size: 8, default_timeout_ms: 30000, slo_p99_ms: 300}
warmup: {batch_sizes: []}
"""


@pytest.fixture(scope="module")
def lag_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("lag-repo")
    _model(root, "lag", LAG_CONFIG, LAG)
    with run_server(root, tmp_path_factory.mktemp("lag-logs"), [*TRUST_PYTHON, "--grpc-port", "-1"]) as running:
        yield running


async def _depth(client: httpx.AsyncClient, url: str) -> int:
    stats = (await client.get(url + "/v2/models/lag/stats")).json()["model_stats"]
    return sum(int(s["queue_depth"]) for s in stats)


async def _blocked(client: httpx.AsyncClient, url: str, warm_ms: int, block_ms: int) -> asyncio.Task[httpx.Response]:
    """One request of `warm_ms` (the service-time estimate learns from it), then one of `block_ms` running: the
    task of the second, once it is admitted."""
    assert (await client.post("/embeddings", json={"model": "lag", "input": str(warm_ms)})).status_code == 200
    blocker = asyncio.create_task(client.post("/embeddings", json={"model": "lag", "input": str(block_ms)}))

    async def one_ahead() -> bool:
        return await _depth(client, url) == 1

    await until_async(one_ahead, "the blocker to be admitted")
    return blocker


async def test_an_overloaded_embedding_model_refuses_before_the_body_is_parsed(lag_server: RunningServer) -> None:
    """After a 1 s batch the estimate predicts >= 2 s for a request behind one running: over the 300 ms SLO.
    A body that is not even valid JSON, but names the model, gets the 503 (and Retry-After), not the 400 that
    parsing would give; the name quoted inside a string is not taken for the key. Once the backlog is gone the
    same broken body is a 400: the parse decides again."""
    broken = b'{"model": "lag", "input": ["0"'  # truncated: a parse would answer 400
    async with httpx.AsyncClient(base_url=lag_server.url + "/v1", timeout=60) as client:
        blocker = await _blocked(client, lag_server.url, warm_ms=1000, block_ms=2000)
        refused = await client.post("/embeddings", content=broken, headers={"content-type": "application/json"})
        quoted = await client.post("/embeddings", json={"input": ['"model": "lag"'], "model": "nope"})
        assert not blocker.done()
        assert refused.status_code == 503, refused.text
        assert "overloaded" in refused.json()["error"]["message"] and int(refused.headers["Retry-After"]) >= 1
        assert quoted.status_code == 404, quoted.text  # the key is `nope`: not found, not lag's 503
        assert (await blocker).status_code == 200
        parsed = await client.post("/embeddings", content=broken, headers={"content-type": "application/json"})
        assert parsed.status_code == 400 and parsed.json()["error"]["code"] == "invalid_json", parsed.text


async def test_a_client_that_resends_at_once_on_a_503_is_paced(lag_server: RunningServer) -> None:
    """Issue 17, a retry storm: a client that re-sends the moment it is refused. The first refusals are answered
    at once; once refusals outnumber admissions more than 8 to 1 over the last second, each refusal is held for
    a while (its message says how long, and the client waits at least that), so the loop is paced by the server
    instead of spending its CPU. The request the model is running is unaffected."""
    async with httpx.AsyncClient(base_url=lag_server.url + "/v1", timeout=60) as client:
        blocker = await _blocked(client, lag_server.url, warm_ms=10, block_ms=5000)
        fast = 0
        for _ in range(40):
            start = time.monotonic()
            refused = await client.post("/embeddings", json={"model": "lag", "input": "1"})
            took_s = time.monotonic() - start
            assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1, refused.text
            held = re.search(r"answered after (\d+) ms", refused.json()["error"]["message"])
            if held is None:
                fast += 1
                continue
            assert 10 <= int(held.group(1)) <= 1000 and took_s >= int(held.group(1)) / 1e3 * 0.95
            assert "without waiting for Retry-After" in refused.json()["error"]["message"]
            break
        else:
            pytest.fail("40 refusals in a row and none held")
        assert 8 <= fast <= 24, fast  # 8 x max(the admissions in the last second, 1/s) answered at once
        assert not blocker.done()
        assert (await blocker).status_code == 200
