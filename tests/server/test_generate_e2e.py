"""Triton's generate extension and the V2 model routes for the LLM, through a real `headroom serve`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.http as th

from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[2] / "models"
PROMPT = "One, two, three,"


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = ["--model", "smollm2", "--model", "digits", "--grpc-port", "-1"]
    with run_server(REPO, tmp_path_factory.mktemp("generate"), args) as srv:
        yield srv


def test_generate_answers_what_the_completion_route_answers(llm: RunningServer) -> None:
    completion = httpx.post(llm.url + "/v1/completions", timeout=60, json={
        "model": "smollm2", "prompt": PROMPT, "max_tokens": 6, "temperature": 0}).json()
    reply = httpx.post(llm.url + "/v2/models/smollm2/generate", timeout=60, json={
        "text_input": PROMPT, "parameters": {"max_tokens": 6, "temperature": 0}})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model_name"] == "smollm2" and body["text_output"] == completion["choices"][0]["text"]
    assert body["text_output"]
    top_level = httpx.post(llm.url + "/v2/models/smollm2/generate", timeout=60, json={
        "text_input": PROMPT, "max_tokens": 6, "temperature": 0, "stream": False})  # Triton ensemble style
    assert top_level.json()["text_output"] == body["text_output"]


def test_generate_stream_is_server_sent_events_of_the_same_text(llm: RunningServer) -> None:
    expected = httpx.post(llm.url + "/v2/models/smollm2/generate", timeout=60, json={
        "text_input": PROMPT, "parameters": {"max_tokens": 6, "temperature": 0}}).json()["text_output"]
    events = []
    with httpx.stream("POST", llm.url + "/v2/models/smollm2/generate_stream", timeout=60, json={
            "text_input": PROMPT, "parameters": {"max_tokens": 6, "temperature": 0}}) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in reply.iter_lines() if line.startswith("data: ")]
    assert len(events) >= 2 and "".join(e["text_output"] for e in events) == expected
    assert events[-1]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(("path", "body", "status", "needle"), [
    ("/v2/models/smollm2/generate", {"text_input": "hi", "parameters": {"max_tokenz": 3}}, 400, "'max_tokenz'"),
    ("/v2/models/smollm2/generate", {"text_input": "hi", "parameters": {"temperature": 9}}, 400, "temperature"),
    ("/v2/models/smollm2/generate", {"parameters": {"max_tokens": 3}}, 400, "'text_input'"),
    ("/v2/models/smollm2/generate", {"text_input": "hi", "max_tokens": 2, "parameters": {"max_tokens": 3}}, 400,
     "both at the top level"),
    ("/v2/models/smollm2/generate", {"text_input": "hi", "max_tokens": 4000}, 400, "maximum context length"),
    ("/v2/models/smollm2/generate", {"text_input": "hi", "max_tokens": 10_000_000}, 400,
     "exceeds this server's limit"),  # the gateway's input limits apply to generate as to /v1/completions
    ("/v2/models/smollm2/versions/3/generate", {"text_input": "hi"}, 404, "version 3 is not found"),
    ("/v2/models/nope/generate", {"text_input": "hi"}, 404, "Request for unknown model: 'nope'"),
    ("/v2/models/digits/generate_stream", {"text_input": "hi"}, 400, "not a generative model"),
])
def test_bad_generate_requests_get_triton_errors(llm: RunningServer, path: str, body: dict[str, object],
                                                 status: int, needle: str) -> None:
    reply = httpx.post(llm.url + path, json=body, timeout=60)
    assert reply.status_code == status, reply.text
    assert needle in reply.json()["error"]


def test_the_llm_on_the_v2_model_routes_is_consistent(llm: RunningServer) -> None:
    client = th.InferenceServerClient(llm.http_target)
    assert client.is_model_ready("smollm2")
    meta = client.get_model_metadata("smollm2")
    assert meta["platform"] == "headroom_llm" and meta["inputs"][0]["name"] == "text_input"
    assert client.get_model_config("smollm2")["backend"] == "llm"
    index = {r["name"]: r for r in client.get_model_repository_index()}
    assert set(index) == {"smollm2", "digits"} and index["smollm2"]["state"] == "READY"
    infer = httpx.post(llm.url + "/v2/models/smollm2/infer", json={"inputs": []})
    assert infer.status_code == 400 and "/v2/models/smollm2/generate" in infer.json()["error"]
    assert "generate" in client.get_server_metadata()["extensions"]
