"""Each protocol client against a real local server; parsing helpers on fixed inputs."""

from __future__ import annotations

import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from headroom.core.clock import MonotonicClock
from headroom.loadgen.clients import ClientConfig, make_client, openai_body, parse_server_timing, v2_json_body
from headroom.loadgen.records import ClientReply
from headroom.loadgen.scrape import ScrapeLog, parse_prometheus_text
from headroom.loadgen.workloads import Sample, digits, sentences
from tests.loadgen.fake_server import FakeServerConfig, running_server

TESTS_DIR = Path(__file__).resolve().parents[1]


async def _send(url: str, protocol: str, sample: Sample, model: str = "m", **kw: object) -> ClientReply:
    config = ClientConfig(url=url, model=model, protocol=protocol, **kw)  # type: ignore[arg-type]
    client = make_client(config, MonotonicClock())
    try:
        return await client.send(sample)
    finally:
        await client.aclose()


def test_server_timing_parsing() -> None:
    parsed = parse_server_timing(['queue;dur=1.5, infer;desc="model";dur=3', "cache;desc=hit, total;dur=abc"])
    assert parsed == (("queue", 1.5), ("infer", 3.0))


def test_prometheus_parsing_keeps_the_interesting_series() -> None:
    text = (
        "# HELP x\n"
        'vllm:num_requests_waiting{model_name="m"} 3\n'
        'headroom_queue_depth{model="digits"} 7\n'
        'headroom_batch_size_bucket{le="4"} 2\n'
        "headroom_batch_size_sum 40\n"
        "vllm:kv_cache_usage_perc 0.25\n"
        "process_cpu_seconds_total 12\n"
        "headroom_queue_depth_weird NaN\n"
    )
    assert parse_prometheus_text(text) == {
        'vllm:num_requests_waiting{model_name="m"}': 3.0,
        'headroom_queue_depth{model="digits"}': 7.0,
        "headroom_batch_size_sum": 40.0,
        "vllm:kv_cache_usage_perc": 0.25,
    }
    log = ScrapeLog()
    log.add(0.0, {"a": 1.0, "bs_sum": 10.0, "bs_count": 5.0})
    log.add(1.0, {"a": 2.0, "b": 5.0, "bs_sum": 50.0, "bs_count": 10.0})
    assert log.series["a"] == [1.0, 2.0] and log.series["b"] == [None, 5.0]
    assert log.window_means() == {"bs": 8.0}  # 40 items over 5 batches during the run


def test_request_bodies() -> None:
    img = digits(1, np.random.default_rng(0))[0]
    body = v2_json_body(img, "")
    assert body["inputs"][0]["shape"] == [1, 1, 8, 8] and body["inputs"][0]["datatype"] == "FP32"
    assert len(body["inputs"][0]["data"]) == 64
    text = v2_json_body(Sample(text="hi"), "INPUT0", (1,))
    assert v2_json_body(Sample(text="hi"), "")["inputs"][0]["shape"] == [1, 1]  # default: a batching model
    assert text["inputs"][0] == {"name": "INPUT0", "shape": [1], "datatype": "BYTES", "data": ["hi"]}
    chat = openai_body(ClientConfig(url="u", model="m", protocol="openai-chat", ignore_eos=True), Sample(text="q"))
    assert chat["messages"] == [{"role": "user", "content": "q"}] and chat["stream"] is True
    assert chat["ignore_eos"] is True and chat["max_tokens"] == 64


@pytest.mark.parametrize("http_client", ["httpx", "aiohttp"])
async def test_http_protocols_against_the_fake_server(http_client: str) -> None:
    img = digits(1, np.random.default_rng(0))[0]
    text = sentences(1, np.random.default_rng(0))[0]
    cfg = FakeServerConfig(service_s=0.001, num_tokens=4, first_token_s=0.05, token_gap_s=0.02)
    with running_server(cfg) as (url, _):
        kw = {"http_client": http_client}
        v2 = await _send(url, "v2-http", img, **kw)
        image = await _send(url + "/image", "image", img, **kw)
        emb = await _send(url, "openai-embeddings", text, **kw)
        chat = await _send(url, "openai-chat", Sample(text="hello", max_output_tokens=4), **kw)
        comp = await _send(url, "openai-completions", Sample(text="hello", max_output_tokens=4), **kw)
        unary = await _send(url, "openai-chat", Sample(text="hello"), stream=False, **kw)
        missing = await _send(url + "/nope", "image", img, **kw)
    assert v2.ok and v2.status == "200" and dict(v2.server_timing_ms)["compute"] == 1.0
    assert image.ok and emb.ok and emb.input_tokens == 3
    for streamed in (chat, comp):
        assert streamed.ok and len(streamed.chunk_times_s) == 4 and streamed.output_tokens == 4
        assert streamed.chunk_times_s[0] - streamed.sent_s >= 0.05
        # The last chunk cannot arrive before the server sent it: 50 ms + 3 gaps of 20 ms after the request.
        assert streamed.chunk_times_s[-1] - streamed.sent_s >= 0.11
    assert unary.ok and unary.chunk_times_s == () and unary.output_tokens == 1
    assert not missing.ok and missing.status == "404"


@pytest.mark.parametrize("http_client", ["httpx", "aiohttp"])
async def test_connection_errors_are_reported_not_raised(http_client: str) -> None:
    reply = await _send("http://127.0.0.1:9", "v2-http", Sample(text="x"), timeout_s=2.0, http_client=http_client)
    assert not reply.ok and reply.status == "connect_error"


@pytest.fixture(scope="module")
def grpc_url() -> Iterator[str]:
    """The protocol team's fake V2 gRPC server (its own process; see tests/protocol/grpc_fake_server.py)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "protocol.grpc_fake_server"],
        cwd=TESTS_DIR,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the gRPC test server did not start within 60 s"
        line = proc.stdout.readline()
        assert line.startswith("PORT "), f"unexpected server output {line!r}"
        yield f"127.0.0.1:{int(line.split()[1])}"
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_v2_grpc_client(grpc_url: str) -> None:
    ok = await _send("grpc://" + grpc_url, "v2-grpc", Sample(text="hello"), "echo_bytes", input_name="INPUT0",
                     text_shape=(1,))  # echo_bytes does not batch: its input is BYTES [-1]
    assert ok.ok and ok.status == "OK"
    # Model names go into the request as given; an unknown model comes back as a gRPC status, not an exception.
    client = make_client(ClientConfig(url=grpc_url, model="no_such_model", protocol="v2-grpc"), MonotonicClock())
    try:
        bad = await client.send(Sample(text="hello"))
    finally:
        await client.aclose()
    assert not bad.ok and bad.status == "NOT_FOUND"
