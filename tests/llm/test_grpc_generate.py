"""The LLM over gRPC (`ModelInfer`, `ModelStreamInfer`) through a real `headroom serve` and tritonclient.grpc."""

from __future__ import annotations

import json
import queue
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[2] / "models"
PROMPT = "One, two, three,"
GREEDY = {"max_tokens": 6, "temperature": 0.0}


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(REPO, tmp_path_factory.mktemp("grpc-llm"), ["--model", "smollm2", "--model", "digits"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def expected(llm: RunningServer) -> str:
    reply = httpx.post(llm.url + "/v2/models/smollm2/generate", timeout=60,
                       json={"text_input": PROMPT, "parameters": GREEDY})
    assert reply.status_code == 200, reply.text
    text = str(reply.json()["text_output"])
    assert text
    return text


def _bytes_input(name: str, value: str) -> tg.InferInput:
    inp = tg.InferInput(name, [1], "BYTES")
    inp.set_data_from_numpy(np.array([value.encode()], dtype=object))
    return inp


def _text(result: Any) -> str:
    return bytes(result.as_numpy("text_output")[0]).decode()


def _status(call: Callable[[], object], code: grpc.StatusCode, needle: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == str(code), (info.value.status(), str(info.value))
    assert needle in str(info.value), str(info.value)


def test_model_infer_answers_what_generate_answers(llm: RunningServer, expected: str) -> None:
    client = tg.InferenceServerClient(llm.grpc_target)
    result = client.infer("smollm2", [_bytes_input("text_input", PROMPT)], parameters=GREEDY, request_id="r1")
    assert _text(result) == expected
    response = result.get_response()
    assert response.id == "r1" and response.model_name == "smollm2"
    assert response.parameters["finish_reason"].string_param in ("stop", "length")
    # Triton's vLLM backend style: a JSON `sampling_parameters` input
    vllm = client.infer("smollm2", [_bytes_input("text_input", PROMPT),
                                    _bytes_input("sampling_parameters", json.dumps(GREEDY))])
    assert _text(vllm) == expected
    # TensorRT-LLM ensemble style: settings as one-element tensors
    max_tokens = tg.InferInput("max_tokens", [1], "INT32")
    max_tokens.set_data_from_numpy(np.array([6], dtype=np.int32))
    trt = client.infer("smollm2", [_bytes_input("text_input", PROMPT), max_tokens],
                       parameters={"temperature": 0.0}, outputs=[tg.InferRequestedOutput("text_output")])
    assert _text(trt) == expected


def _stream(client: tg.InferenceServerClient, count_final: int = 1,
            **kwargs: Any) -> list[tuple[Any, Any]]:
    """Send one streamed request; collect its responses until `count_final` final flags (or an error)."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("smollm2", [_bytes_input("text_input", PROMPT)], **kwargs)
        got: list[tuple[Any, Any]] = []
        while True:
            result, error = answers.get(timeout=60)
            got.append((result, error))
            if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                return got
    finally:
        client.stop_stream()


def test_stream_infer_sends_a_response_per_token_chunk_and_a_final_flag(llm: RunningServer, expected: str) -> None:
    client = tg.InferenceServerClient(llm.grpc_target)
    got = _stream(client, parameters=GREEDY, request_id="s1")
    assert all(error is None for _, error in got)
    assert len(got) >= 2  # one response per token chunk
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r, _ in got]
    assert finals == [False] * (len(got) - 1) + [True]
    assert {r.get_response().id for r, _ in got} == {"s1"}
    assert "".join(_text(r) for r, _ in got) == expected
    assert got[-1][0].get_response().parameters["finish_reason"].string_param in ("stop", "length")


def test_stream_infer_with_an_empty_final_response(llm: RunningServer, expected: str) -> None:
    client = tg.InferenceServerClient(llm.grpc_target)
    got = _stream(client, parameters=GREEDY, enable_empty_final_response=True)
    last = got[-1][0].get_response()
    assert last.parameters["triton_final_response"].bool_param and not last.outputs
    assert not any(r.get_response().parameters["triton_final_response"].bool_param for r, _ in got[:-1])
    assert "".join(_text(r) for r, _ in got[:-1]) == expected


def test_stream_false_answers_once_on_the_stream(llm: RunningServer, expected: str) -> None:
    client = tg.InferenceServerClient(llm.grpc_target)
    got = _stream(client, parameters={**GREEDY, "stream": False})
    assert len(got) == 1 and _text(got[0][0]) == expected


def test_a_bad_request_in_a_stream_fails_alone(llm: RunningServer, expected: str) -> None:
    client = tg.InferenceServerClient(llm.grpc_target)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("smollm2", [_bytes_input("text_input", PROMPT)],
                                  parameters={"max_tokenz": 3}, request_id="bad")
        _, error = answers.get(timeout=60)
        assert error is not None and "'max_tokenz'" in str(error)
        client.async_stream_infer("smollm2", [_bytes_input("text_input", PROMPT)], parameters=GREEDY)
        text = ""
        while True:
            result, error = answers.get(timeout=60)
            assert error is None
            text += _text(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        assert text == expected
    finally:
        client.stop_stream()


INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(("inputs", "kwargs", "code", "needle"), [
    ([], {"parameters": GREEDY}, INVALID, "at least one input"),
    ([("sampling_parameters", "{}")], {}, INVALID, "'text_input'"),
    ([("text_input", "hi")], {"parameters": {"max_tokenz": 3}}, INVALID, "'max_tokenz'"),
    ([("text_input", "hi")], {"parameters": {"temperature": 9.0}}, INVALID, "temperature"),
    ([("text_input", "hi")], {"parameters": {"max_tokens": 4000}}, INVALID, "maximum context length"),
    ([("text_input", "hi")], {"parameters": {"stream": True}}, INVALID, "ModelStreamInfer"),
    ([("text_input", "hi"), ("sampling_parameters", "[1]")], {}, INVALID, "JSON object"),
    ([("text_input", "hi"), ("sampling_parameters", "{\"max_tokens\": 2}")], {"parameters": {"max_tokens": 3}},
     INVALID, "given twice"),
    ([("text_input", "hi")], {"timeout": 5}, INVALID, "'timeout'"),
    ([("text_input", "hi")], {"outputs": ["logits"]}, INVALID, "no output 'logits'"),
    ([("text_input", "hi")], {"model_version": "3"}, grpc.StatusCode.NOT_FOUND, "version 3 is not found"),
])
def test_bad_llm_requests_get_grpc_status_codes(llm: RunningServer, inputs: list[tuple[str, str]],
                                                 kwargs: dict[str, Any], code: grpc.StatusCode,
                                                 needle: str) -> None:
    client = tg.InferenceServerClient(llm.grpc_target)
    tensors = [_bytes_input(name, value) for name, value in inputs]
    if "outputs" in kwargs:
        kwargs = {**kwargs, "outputs": [tg.InferRequestedOutput(n) for n in kwargs["outputs"]]}
    _status(lambda: client.infer("smollm2", tensors, **kwargs), code, needle)
    assert llm.alive()


def test_non_utf8_and_wrongly_typed_prompts_are_invalid(llm: RunningServer) -> None:
    client = tg.InferenceServerClient(llm.grpc_target)
    raw = tg.InferInput("text_input", [1], "BYTES")
    raw.set_data_from_numpy(np.array([b"\xff\xfe"], dtype=object))
    _status(lambda: client.infer("smollm2", [raw]), INVALID, "UTF-8")
    fp = tg.InferInput("text_input", [1], "FP32")
    fp.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    _status(lambda: client.infer("smollm2", [fp]), INVALID, "must be BYTES")
    two = tg.InferInput("text_input", [2], "BYTES")
    two.set_data_from_numpy(np.array([b"a", b"b"], dtype=object))
    _status(lambda: client.infer("smollm2", [two]), INVALID, "one element")


def test_the_llm_metadata_and_config_over_grpc_match_http(llm: RunningServer) -> None:
    client = tg.InferenceServerClient(llm.grpc_target)
    meta = client.get_model_metadata("smollm2", as_json=True)
    http_meta = httpx.get(llm.url + "/v2/models/smollm2").json()
    assert [i["name"] for i in meta["inputs"]] == [i["name"] for i in http_meta["inputs"]] == ["text_input"]
    assert meta["outputs"][0]["name"] == "text_output" and meta["outputs"][0]["datatype"] == "BYTES"
    config = client.get_model_config("smollm2", as_json=True)["config"]
    http_config = httpx.get(llm.url + "/v2/models/smollm2/config").json()
    assert config["model_transaction_policy"]["decoupled"] is True
    assert http_config["model_transaction_policy"] == {"decoupled": True}
    optional = {i["name"]: i for i in http_config["input"] if i["optional"]}
    assert {"sampling_parameters", "stream", "max_tokens"} <= set(optional)
    assert [i["name"] for i in config["input"]] == [i["name"] for i in http_config["input"]]
    assert client.is_model_ready("smollm2")


def _stats(llm: RunningServer) -> dict[str, Any]:
    """The LLM's statistics through tritonclient.http, checked against tritonclient.grpc's."""
    rows = th.InferenceServerClient(llm.http_target).get_inference_statistics("smollm2")["model_stats"]
    assert len(rows) == 1
    via_http = dict(rows[0])
    via_grpc = tg.InferenceServerClient(llm.grpc_target).get_inference_statistics("smollm2", as_json=True)
    grpc_row = via_grpc["model_stats"][0]
    assert grpc_row["name"] == via_http["name"] == "smollm2"
    assert int(grpc_row.get("inference_count", 0)) >= int(via_http["inference_count"])  # read after HTTP
    return via_http


def _wait_for_successes(llm: RunningServer, count: int) -> dict[str, Any]:
    """Poll (bounded) until `count` successes are counted: a stream's report lands after its last chunk."""
    for _ in range(600):
        stats = _stats(llm)
        if stats["inference_stats"]["success"]["count"] >= count:
            return stats
        httpx.get(llm.url + "/v2/health/live", timeout=10)  # a round trip, not a sleep
    raise AssertionError(f"statistics never reached {count} successes: {stats}")


def test_llm_statistics_count_every_route_in_tritons_schema(llm: RunningServer) -> None:
    before = _stats(llm)
    ok, fail = before["inference_stats"]["success"]["count"], before["inference_stats"]["fail"]["count"]
    client = tg.InferenceServerClient(llm.grpc_target)
    client.infer("smollm2", [_bytes_input("text_input", PROMPT)], parameters=GREEDY)  # gRPC ModelInfer
    _stream(client, parameters=GREEDY)  # gRPC ModelStreamInfer
    assert httpx.post(llm.url + "/v2/models/smollm2/generate", timeout=60,
                      json={"text_input": PROMPT, "parameters": GREEDY}).status_code == 200
    assert httpx.post(llm.url + "/v1/completions", timeout=60,
                      json={"model": "smollm2", "prompt": PROMPT, **GREEDY}).status_code == 200
    assert httpx.post(llm.url + "/v1/completions", timeout=60,  # refused by the engine's validation: a failure
                      json={"model": "smollm2", "prompt": PROMPT, "temperature": 9}).status_code == 400
    after = _wait_for_successes(llm, ok + 4)
    stats = after["inference_stats"]
    assert stats["success"]["count"] == ok + 4 and stats["fail"]["count"] == fail + 1
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["execution_count"] - before["execution_count"] == 4
    for stage in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[stage]["count"] - before["inference_stats"][stage]["count"] == 4, stage
    grew = stats["compute_infer"]["ns"] - before["inference_stats"]["compute_infer"]["ns"]
    assert grew > 0 and stats["success"]["ns"] >= stats["compute_infer"]["ns"]
    assert after["last_inference"] > 0 and after["batch_stats"][0]["batch_size"] == 1
    every = httpx.get(llm.url + "/v2/models/stats", timeout=10).json()["model_stats"]
    assert {"smollm2", "digits"} <= {row["name"] for row in every}
    assert httpx.get(llm.url + "/v2/models/smollm2/versions/2/stats", timeout=10).status_code == 404
