"""SmolLM2 through a real `headroom serve` with LLM-token rate limits and span export: unused `max_tokens` are
refunded when a generation ends (also when the client leaves mid-stream or the request fails), and every
generation gets llm.queue / llm.prefill / llm.decode spans, `Server-Timing` and an access line with tokens."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from headroom.core.server_timing import parse_server_timing
from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[2] / "models"
TRACE = "5bf92f3577b34da6a3ce929d0e0e4737"
# Greedy, and any space or punctuation stops it: a 512-token ask ends after a token or two.
SHORT = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 512, "temperature": 0,
         "stop": [" ", "\n", ".", ","]}


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    tmp = tmp_path_factory.mktemp("llm-gw")
    spans = tmp / "spans.jsonl"
    # 700-token burst, refilled at 0.5 tokens/s: one 512-token ask fits, a second only after a refund
    args = ["--model", "smollm2", "--grpc-port", "-1", "--trace-spans-file", str(spans),
            "--llm-tokens-per-s", "0.5", "--llm-token-burst", "700"]
    with run_server(REPO, tmp, args) as server:
        yield server, spans


def spans_of(path: Path, trace_hex: str) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [s for s in map(json.loads, lines) if s["trace_id"] == trace_hex]


def access_line(server: RunningServer, request_id: str) -> dict[str, Any] | None:
    for line in server.log().splitlines():
        if line.startswith("{") and request_id in line:
            entry: dict[str, Any] = json.loads(line)
            if entry.get("logger") == "headroom.gateway.access" and entry.get("request_id") == request_id:
                return entry
    return None


def test_unused_max_tokens_are_refunded(llm: tuple[RunningServer, Path]) -> None:
    server, _ = llm
    with httpx.Client(base_url=server.url, timeout=120.0) as client:
        for i in range(4):  # each charges 7 + 512 of the 700; without refunds the second is a 429
            r = client.post("/v1/completions", json=SHORT, headers={"X-Request-Id": f"short-{i}"})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] <= 3
        failed = client.post("/v1/completions", json={**SHORT, "model": "nope"})
        assert failed.status_code == 404  # refused by the route: nothing generated, all refunded
        assert client.post("/v1/completions", json=SHORT).status_code == 200
        entry = access_line(server, "short-0")
        assert entry is not None and entry["completion_tokens"] <= 3 and entry["prompt_tokens"] > 0


def test_a_client_leaving_mid_stream_is_refunded(llm: tuple[RunningServer, Path]) -> None:
    server, _ = llm
    long_ask = {**SHORT, "stop": None, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.url, timeout=120.0) as client:
        with client.stream("POST", "/v1/completions", json=long_ask, headers={"X-Request-Id": "left"}) as s:
            assert s.status_code == 200
            events = 0
            for line in s.iter_lines():
                events += line.startswith("data:")
                if events == 3:
                    break  # leave after three tokens of 512
        deadline = time.monotonic() + 60
        while (entry := access_line(server, "left")) is None:  # the server settles once it notices
            assert time.monotonic() < deadline, server.log()[-3000:]
            time.sleep(0.05)
        assert entry["finish_reason"] == "abort" and 3 <= entry["completion_tokens"] < 512
        r = client.post("/v1/completions", json=SHORT)
        assert r.status_code == 200, r.text  # 700 - 519 + refund: fits again


def test_llm_spans_server_timing_and_ordering(llm: tuple[RunningServer, Path]) -> None:
    server, spans_file = llm
    ask = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 6,
           "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=120.0) as client:
        r = client.post("/v1/chat/completions", json=ask,
                        headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    timing = parse_server_timing(r.headers["server-timing"])
    assert {"queue", "prefill", "decode", "total"} <= set(timing)
    assert timing["queue"] + timing["prefill"] + timing["decode"] <= timing["total"]
    spans = spans_of(spans_file, TRACE)
    (ingress,) = [s for s in spans if s["name"] == "ingress"]
    assert ingress["parent_id"] == "00f067aa0ba902b7"
    children = sorted((s for s in spans if s["parent_id"] == ingress["span_id"]), key=lambda s: s["start_ns"])
    assert [s["name"] for s in children] == ["llm.queue", "llm.prefill", "llm.decode"]
    for before, after in itertools.pairwise(children):
        assert before["end_ns"] <= after["start_ns"]
    assert ingress["start_ns"] <= children[0]["start_ns"] and children[-1]["end_ns"] <= ingress["end_ns"]
    durations_ns = [s["end_ns"] - s["start_ns"] for s in children]
    assert all(d >= 0 for d in durations_ns) and durations_ns[1] > 0 and durations_ns[2] > 0
    assert sum(durations_ns) <= ingress["end_ns"] - ingress["start_ns"]
    prefill, decode = children[1], children[2]
    assert prefill["attributes"]["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert decode["attributes"]["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 6


def test_a_stream_ends_with_its_server_timing_and_the_access_line_has_it(llm: tuple[RunningServer, Path]) -> None:
    """Headers go before the first token, so a stream's Server-Timing comes at its end: an SSE comment (which SSE
    clients ignore) right before `data: [DONE]`; the stages are disjoint and sum to the total, as in the access
    line."""
    server, _ = llm
    ask = {**SHORT, "max_tokens": 4, "stop": None, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.url, timeout=120.0) as client, \
            client.stream("POST", "/v1/completions", json=ask, headers={"X-Request-Id": "timed-stream"}) as s:
        assert s.status_code == 200
        lines = [line for line in s.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and lines[-2].startswith(": server-timing ")
    timing = parse_server_timing(lines[-2].removeprefix(": server-timing "))
    stages = ("preprocess", "queue", "prefill", "decode", "other")
    assert set(timing) == {*stages, "total"} and all(timing[k] >= 0 for k in stages)
    assert sum(timing[k] for k in stages) == pytest.approx(timing["total"], abs=1.0)
    assert timing["decode"] > 0
    deadline = time.monotonic() + 60
    while (entry := access_line(server, "timed-stream")) is None:  # written once the response completed
        assert time.monotonic() < deadline, "no access line for the stream"
        time.sleep(0.05)
    assert set(parse_server_timing(entry["server_timing"])) == {*stages, "total"}
