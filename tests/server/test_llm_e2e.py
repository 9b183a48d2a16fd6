"""SmolLM2 through the real `headroom serve` process and the unchanged `openai` SDK."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from tests.server.test_tied_notice_e2e import NoticeListener
from tests.support.server import RunningServer, run_server
from tests.support.waiting import until

REPO = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(REPO, tmp_path_factory.mktemp("llm"), ["--model", "smollm2", "--grpc-port", "-1"]) as srv:
        yield srv


def test_chat_completions_streaming_and_not(llm_server: RunningServer) -> None:
    client = OpenAI(base_url=llm_server.url + "/v1", api_key="unused")
    assert "smollm2" in [m.id for m in client.models.list().data]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.completion_tokens <= 8
    text = reply.choices[0].message.content or ""
    chunks = list(client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8,  # type: ignore[arg-type]
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text  # greedy: the stream carries exactly the non-streamed answer
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == reply.usage.completion_tokens


def test_completions_and_openai_shaped_errors(llm_server: RunningServer) -> None:
    client = OpenAI(base_url=llm_server.url + "/v1", api_key="unused")
    out = client.completions.create(model="smollm2", prompt="One, two, three,", max_tokens=4, temperature=0)
    assert out.choices[0].text and out.usage is not None and out.usage.prompt_tokens > 0
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model="smollm2", prompt="hi", max_tokens=10_000_000)
    assert "context" in str(too_long.value).lower() or "max_tokens" in str(too_long.value).lower()
    bad = httpx.post(llm_server.url + "/v1/chat/completions", content=b"{nope",
                     headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "message" in bad.json()["error"]
    metrics = httpx.get(llm_server.url + "/metrics").text
    assert "headroom_llm_time_to_first_token_seconds" in metrics


def test_hostile_sampling_parameters_fail_that_request_only(llm_server: RunningServer) -> None:
    """repetition_penalty 1e-300 at temperature 0.7 makes the distribution non-finite: a 400 for that request
    (streamed: an error event), while the engine, readiness and the next request are unaffected."""
    client = OpenAI(base_url=llm_server.url + "/v1", api_key="unused")
    messages = [{"role": "user", "content": "Say something about Paris, please."}]
    hostile = {"repetition_penalty": 1e-300}
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="smollm2", messages=messages, max_tokens=4,  # type: ignore[arg-type]
                                       temperature=0.7, extra_body=hostile)
    assert "repetition_penalty" in str(bad.value)
    body = {"model": "smollm2", "messages": messages, "max_tokens": 4, "temperature": 0.7, "stream": True, **hostile}
    with httpx.stream("POST", llm_server.url + "/v1/chat/completions", json=body, timeout=30) as stream:
        events = [line for line in stream.iter_lines() if line.startswith("data: ")]
    if stream.status_code == 200:  # admitted, failed in the step: an error event, then [DONE]
        assert '"error"' in events[-2] and events[-1] == "data: [DONE]"
    else:  # refused up front by request validation
        assert stream.status_code == 400
    assert httpx.get(llm_server.url + "/v2/health/ready").status_code == 200
    assert httpx.get(llm_server.url + "/v2/health/live").status_code == 200
    reply = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert reply.choices[0].message.content


def _gauges(srv: RunningServer) -> tuple[float, float, float]:
    """(running, waiting, kv_cache_usage_perc) of smollm2 from /metrics."""
    values: dict[str, float] = {}
    for line in httpx.get(srv.url + "/metrics").text.splitlines():
        for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
            if line.startswith(f'headroom_llm_{name}{{model_name="smollm2"}}'):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values["num_requests_running"], values["num_requests_waiting"], values["kv_cache_usage_perc"]


def test_abandoned_streams_leave_the_gauges_at_idle(llm_server: RunningServer) -> None:
    """16 clients start a long stream each and go away after its first event: the gauges go back to idle
    without another request arriving (they used to keep their values until the next step)."""

    async def open_and_abandon() -> None:
        readers = []  # each stream's line iterator, kept: a collected one would close its response early
        async with httpx.AsyncClient(base_url=llm_server.url, timeout=60) as client, AsyncExitStack() as streams:
            for i in range(16):
                body = {"messages": [{"role": "user", "content": f"Tell story number {i}."}], "stream": True,
                        "max_tokens": 1000, "ignore_eos": True, "temperature": 0.7}
                resp = await streams.enter_async_context(client.stream("POST", "/v1/chat/completions", json=body))
                assert resp.status_code == 200
                readers.append(resp.aiter_lines())
                async for line in readers[-1]:
                    if line.startswith("data: "):
                        break
            running, waiting, kv = _gauges(llm_server)
            assert running + waiting == 16 and kv > 0  # all 16 generating when their clients go
        # leaving the stack closed every response before its end: 16 client disconnects

    asyncio.run(open_and_abandon())
    deadline = time.monotonic() + 10.0
    while _gauges(llm_server) != (0.0, 0.0, 0.0):  # polled with a bound: the server has nothing to await on
        assert time.monotonic() < deadline, f"gauges not idle 10 s after the disconnects: {_gauges(llm_server)}"
        time.sleep(0.01)
def _steps_cancelled(srv: RunningServer) -> float:
    for line in httpx.get(srv.url + "/metrics").text.splitlines():
        if line.startswith('headroom_llm_steps_cancelled_total{model_name="smollm2"}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no headroom_llm_steps_cancelled_total for smollm2")


def test_streams_abandoned_during_their_prefill_cancel_the_step_in_flight(llm_server: RunningServer) -> None:
    """16 clients send a long prompt each and go away once admitted, while the engine prefills them in chunks of
    512 tokens: the step in flight when the last one leaves carries only abandoned requests, so it stops at its
    next layer boundary (the counter says so) instead of running to its end, and the gauges go back to idle.

    The last disconnect can also land in the short gap between two steps (then nothing is in flight to cancel):
    up to 3 rounds with fresh prompts, and at least one must have cancelled a step."""

    async def abandon(round_no: int) -> None:
        async with httpx.AsyncClient(base_url=llm_server.url, timeout=60) as client, AsyncExitStack() as streams:
            async def admitted(i: int) -> None:
                words = " ".join(f"lighthouse{round_no}x{i}x{k}" for k in range(60))  # hundreds of fresh tokens each
                body = {"model": "smollm2", "prompt": words, "stream": True, "max_tokens": 200, "temperature": 0}
                resp = await streams.enter_async_context(client.stream("POST", "/v1/completions", json=body))
                assert resp.status_code == 200  # headers arrive at admission, before the first token

            await asyncio.gather(*(admitted(i) for i in range(16)))
        # leaving the stack closed the 16 responses: 16 client disconnects during the prefill

    before = _steps_cancelled(llm_server)
    for round_no in range(3):
        asyncio.run(abandon(round_no))
        deadline = time.monotonic() + 30.0
        while _gauges(llm_server) != (0.0, 0.0, 0.0):  # polled with a bound: the server has nothing to await on
            assert time.monotonic() < deadline, f"gauges not idle 30 s after the disconnects: {_gauges(llm_server)}"
            time.sleep(0.01)
        if _steps_cancelled(llm_server) > before:
            break
    assert _steps_cancelled(llm_server) > before, "no step was cancelled in 3 rounds of abandoned prefills"


def test_metrics_filtered_by_name_is_a_page_of_only_those_series(llm_server: RunningServer) -> None:
    """`/metrics?name[]=...` (Prometheus' filter): the pollers of the reliability suite read 3 series cheaply."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = ["headroom_llm_num_requests_running", "headroom_llm_kv_cache_usage_perc",
              "headroom_llm_steps_cancelled_total"]
    page = httpx.get(llm_server.url + "/metrics", params={"name[]": wanted})
    assert page.status_code == 200
    names = {sample.name for family in text_string_to_metric_families(page.text) for sample in family.samples}
    assert names == set(wanted)
    assert len(page.content) * 20 < len(httpx.get(llm_server.url + "/metrics").content)


VLLM_DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "vllm-dashboard.json"
# vLLM's metric names (docs/design/metrics.md, V1), each exported with the labels model_name and engine
#: vLLM 0.33.0's PrometheusStatLogger series, from the wheel (scripts/vllm_metric_names.py; see its header)
VLLM_PIN = json.loads((Path(__file__).parent / "data" / "vllm_metrics.json").read_text())
#: each series a vLLM server exports whatever its configuration (LoRA, KV connectors, spec decode: conditional)
VLLM_ALWAYS = [s for s in VLLM_PIN["series"] if s["when"] == "always"]
#: vLLM names headroom also answers to that 0.33 no longer has: older dashboards query them
VLLM_OLDER_NAMES = {"vllm:time_per_output_token_seconds", "vllm:gpu_cache_usage_perc"}
SAMPLE_SUFFIX = {"counter": "_total", "gauge": "", "histogram": "_bucket"}


def _scrape(url: str) -> dict[str, list[dict[str, str]]]:
    """Sample name -> the label sets it was exported with, from the live /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    series: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            series.setdefault(sample.name, []).append(dict(sample.labels))
    return series


def test_vllm_metric_names_and_dashboard_against_the_live_server(llm_server: RunningServer) -> None:
    client = OpenAI(base_url=llm_server.url + "/v1", api_key="unused")
    client.completions.create(model="smollm2", prompt="One, two, three,", max_tokens=4, temperature=0, n=2)
    series = _scrape(llm_server.url)
    assert VLLM_PIN["vllm_version"] == "0.33.0" and len(VLLM_ALWAYS) >= 30
    for pinned in VLLM_ALWAYS:
        name = pinned["name"] + SAMPLE_SUFFIX[pinned["type"]]
        assert name in series, f"{name} (vLLM {VLLM_PIN['vllm_version']}) is not exported"
        keys = set(series[name][0]) - {"le"}
        if pinned["name"] == "vllm:cache_config_info":  # vLLM labels it with every CacheConfig field
            assert {"engine", "block_size", "num_gpu_blocks"} <= keys, keys
            continue
        assert keys == set(pinned["labels"]), (name, keys, pinned["labels"])
        assert all(labels.get("model_name") == "smollm2" for labels in series[name]), series[name]
        assert all(labels.get("engine", "0") == "0" for labels in series[name]), series[name]
    exported = {n for n in series if n.startswith("vllm:")}
    ends = ("", "_total", "_bucket", "_count", "_sum", "_created")
    known = {p["name"] + end for p in VLLM_PIN["series"] for end in ends}
    older = {n + end for n in VLLM_OLDER_NAMES for end in ends}
    assert exported - known - older == set(), "vllm: names that vLLM 0.33.0 does not have"
    assert "headroom_llm_time_to_first_token_seconds_bucket" in series  # headroom's own names stay
    cache = series["vllm:cache_config_info"]
    assert len(cache) == 1 and cache[0]["block_size"] == "16" and int(cache[0]["num_gpu_blocks"]) > 100
    assert cache[0]["enable_prefix_caching"] == "True"  # models/smollm2/config.yaml
    doc = json.loads(VLLM_DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    assert len(exprs) >= 25
    for expr in exprs:
        names = re.findall(r"vllm:[a-zA-Z0-9_:]+", expr)
        assert names and all(n in series for n in names), (expr, [n for n in names if n not in series])
        assert 'model_name="$model_name"' in expr
    variable = next(v for v in doc["templating"]["list"] if v["name"] == "model_name")
    assert variable["definition"] == 'label_values({__name__=~"vllm:.*"},model_name)'


async def test_a_tied_llm_copy_notifies_on_its_first_token_streamed_or_not(llm_server: RunningServer) -> None:
    """headroom.server.tied on the OpenAI routes: the engine's first output of a tagged request sends one start
    notice, streamed and unstreamed alike."""
    async with NoticeListener() as router, httpx.AsyncClient(base_url=llm_server.url, timeout=120.0) as client:
        for copy, stream in ((0, False), (1, True)):
            tag = f"LlmT1ed_{copy}x.{copy}"
            body = {"model": "smollm2", "prompt": "Count: one, two,", "max_tokens": 24, "temperature": 0,
                    "ignore_eos": True, "stream": stream}
            r = await client.post("/v1/completions", json=body,
                                  headers={"x-headroom-tied": tag, "x-headroom-tied-port": str(router.port)})
            assert r.status_code == 200, r.text
            path = f"POST /router/tied/{tag}"
            await until(lambda: path in [p for p, _ in router.notices], f"{tag}'s notice")  # noqa: B023
        assert len(router.notices) == 2
