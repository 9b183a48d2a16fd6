"""Issue 17 regressions through a real `headroom serve`: hostile shapes cost O(body) and get 400, requests of
other shapes never share (and fail) a batch, and unknown model names never become series labels."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.protocol.strategies import hostile_shapes
from tests.server.conftest import ECHO, _model
from tests.server.test_http_e2e import metric
from tests.support.server import TRUST_PYTHON, RunningServer, run_server

WORDS = """
import numpy as np

class Words:
    def predict(self, inputs):
        n = np.array([[len(row)] for row in inputs["w"]], dtype=np.int64)
        return {"embedding": np.repeat(n.astype(np.float32), 4, axis=1), "n": n}
"""


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("hostile-repo")
    _model(root, "vary", """
        backend: python
        max_batch_size: 64
        inputs: [{name: x, datatype: FP32, shape: [-1]}]
        outputs: [{name: y, datatype: FP32, shape: [-1]}, {name: batch, datatype: INT32, shape: [1]}]
        dynamic_batching: {max_queue_delay_ms: 20, max_queue_size: 256}
        warmup: {batch_sizes: [1]}
    """, ECHO)
    _model(root, "words", """
        backend: python
        max_batch_size: 8
        inputs: [{name: w, datatype: BYTES, shape: [-1]}]
        outputs: [{name: embedding, datatype: FP32, shape: [4]}, {name: n, datatype: INT64, shape: [1]}]
        warmup: {batch_sizes: [1]}
    """, WORDS)  # a BYTES input and an FP32 `embedding` output: /v1/embeddings serves it too
    with run_server(root, tmp_path_factory.mktemp("hostile-logs"), TRUST_PYTHON) as running:
        yield running


def _rss_bytes(server: RunningServer) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc status")


def _binary_body(name: str, datatype: str, shape: list[int], payload: bytes) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": shape,
                                     "parameters": {"binary_data_size": len(payload)}}]}).encode()
    return header + payload, {"Inference-Header-Content-Length": str(len(header)),
                              "Content-Type": "application/octet-stream"}


def test_a_tiny_request_declaring_5e7_bytes_elements_is_refused_without_allocating(
        hostile_server: RunningServer) -> None:
    body, headers = _binary_body("w", "BYTES", [1, 50_000_000], b"")
    assert len(body) < 120
    before = _rss_bytes(hostile_server)
    with httpx.Client(base_url=hostile_server.url, timeout=30) as client:
        for _ in range(20):
            r = client.post("/v2/models/words/infer", content=body, headers=headers)
            assert r.status_code == 400, r.text
            assert "input 'w'" in r.json()["error"] and "need at least 200000000 bytes" in r.json()["error"]
    assert _rss_bytes(hostile_server) - before < 50 * 2**20  # the old decoder grew by ~380 MB per request


@pytest.mark.parametrize("shape", [[1, 2**62], [1, 2**63 - 1], [2**62, 1], [1, -3], [1] * 40])
def test_overflowing_shapes_get_400_naming_the_input_on_http_and_grpc(hostile_server: RunningServer,
                                                                     shape: list[int]) -> None:
    body, headers = _binary_body("x", "FP32", shape, b"")
    r = httpx.post(f"{hostile_server.url}/v2/models/vary/infer", content=body, headers=headers, timeout=30)
    assert r.status_code == 400 and "input 'x'" in r.json()["error"], r.text
    message = pb.ModelInferRequest(model_name="vary")
    message.inputs.add(name="x", datatype="FP32", shape=shape)
    message.raw_input_contents.append(b"")
    with grpc.insecure_channel(hostile_server.grpc_target) as channel, pytest.raises(grpc.RpcError) as err:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "input 'x'" in (err.value.details() or "")


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=hostile_shapes(), model=st.sampled_from(["vary", "words"]), payload=st.binary(max_size=16),
       raw=st.booleans())
def test_fuzzed_shapes_never_get_a_5xx(hostile_server: RunningServer, shape: list[int], model: str, payload: bytes,
                                       raw: bool) -> None:
    name, datatype = ("x", "FP32") if model == "vary" else ("w", "BYTES")
    body, headers = _binary_body(name, datatype, shape, payload)
    r = httpx.post(f"{hostile_server.url}/v2/models/{model}/infer", content=body, headers=headers, timeout=30)
    assert r.status_code in (200, 400), r.text
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name=name, datatype=datatype, shape=[max(-(2**63), min(d, 2**63 - 1)) for d in shape])
    if raw:
        message.raw_input_contents.append(payload)
    with grpc.insecure_channel(hostile_server.grpc_target) as channel:
        try:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=30)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()


async def test_forty_concurrent_requests_of_two_shapes_all_succeed(hostile_server: RunningServer) -> None:
    """Issue 17: [1,3] and [1,4] alternating used to be collated into one batch and 39 of 40 got 500."""
    async with httpx.AsyncClient(base_url=hostile_server.url, timeout=60) as client:
        bodies = [{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3 + i % 2],
                               "data": [float(i)] * (3 + i % 2)}]} for i in range(40)]
        replies = await asyncio.gather(*(client.post("/v2/models/vary/infer", json=b) for b in bodies))
    assert [r.status_code for r in replies] == [200] * 40, [r.text for r in replies if r.status_code != 200][:3]
    batch_sizes = []
    for i, r in enumerate(replies):
        outputs = {o["name"]: o for o in r.json()["outputs"]}
        assert outputs["y"]["shape"] == [1, 3 + i % 2] and outputs["y"]["data"] == [2.0 * i] * (3 + i % 2)
        batch_sizes.append(outputs["batch"]["data"][0])
    assert max(batch_sizes) > 1  # requests of one shape still batch together


def test_unknown_model_names_are_counted_under_one_label(hostile_server: RunningServer) -> None:
    names = [f"nope-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for name in names:
        r = httpx.post(f"{hostile_server.url}/v2/models/{name}/infer", timeout=30,
                       json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]})
        assert r.status_code == 404
    client = triton_grpc.InferenceServerClient(hostile_server.grpc_target)
    inp = triton_grpc.InferInput("x", [1, 1], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
    for name in names:
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.infer(name, [inp])
    with pytest.raises(InferenceServerException, match="version 7-bogus is not found"):
        client.infer("vary", [inp], model_version="7-bogus")
    text = httpx.get(f"{hostile_server.url}/metrics", timeout=30).text
    assert not any(name in text for name in names) and "7-bogus" not in text
    assert metric(text, "headroom_requests_total", model="__unknown__", version="__unknown__") == 6
    assert metric(text, "headroom_requests_total", model="vary", version="__unknown__") == 1


def test_x_request_timeout_ms_applies_to_embeddings(hostile_server: RunningServer) -> None:
    """Issue 17: the header was ignored on /v1/embeddings. A 1 µs budget expires before the batch (504);
    a malformed one is a 400 in OpenAI's error shape."""
    url = f"{hostile_server.url}/v1/embeddings"
    body = {"model": "words", "input": ["a b c"]}
    assert httpx.post(url, json=body, timeout=30).status_code == 200
    late = httpx.post(url, json=body, headers={"X-Request-Timeout-Ms": "0.001"}, timeout=30)
    assert late.status_code == 504 and "deadline" in late.json()["error"]["message"], late.text
    for bad in ("soon", "0", "-5", "nan", "inf"):
        r = httpx.post(url, json=body, headers={"X-Request-Timeout-Ms": bad}, timeout=30)
        assert r.status_code == 400 and "X-Request-Timeout-Ms" in r.json()["error"]["message"], r.text
