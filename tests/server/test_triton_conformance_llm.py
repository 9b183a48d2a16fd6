"""Every model-level method of tritonclient's HTTP and gRPC clients against the LLM (smollm2) of a real
`headroom serve` in explicit model-control mode.

The tensor-model conformance suite (test_triton_conformance.py) covers every public method; this one checks
that each method taking a `model_name` also answers correctly for the LLM: `LLM_HTTP_CALLS` /
`LLM_GRPC_CALLS` map each to a check, and the coverage test fails on a model-level method with none.
HTTP `infer` on the LLM is refused as Triton's HTTP endpoint refuses decoupled models (400 pointing at
`generate`); gRPC serves it (ModelInfer: one response, ModelStreamInfer: one per token chunk).
"""

from __future__ import annotations

import inspect
import queue
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[2] / "models"
GREEDY = {"max_tokens": 6, "temperature": 0.0}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = ["--model", "smollm2", "--model", "digits", "--model-control-mode", "explicit"]
    with run_server(REPO, tmp_path_factory.mktemp("llm-conformance"), args) as server:
        yield server


def _prompt(mod: Any) -> list[Any]:
    inp = mod.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"One, two, three,"], dtype=object))
    return [inp]


def _generated(srv: RunningServer) -> str:
    reply = httpx.post(srv.url + "/v2/models/smollm2/generate", timeout=60,
                       json={"text_input": "One, two, three,", "parameters": GREEDY})
    assert reply.status_code == 200, reply.text
    return str(reply.json()["text_output"])


# --- HTTP ---------------------------------------------------------------------------------------------------
def h_model(c: th.InferenceServerClient, srv: RunningServer) -> None:
    assert c.is_model_ready("smollm2")
    assert c.get_model_metadata("smollm2")["inputs"][0] == {"name": "text_input", "datatype": "BYTES", "shape": [1]}
    assert c.get_model_config("smollm2")["model_transaction_policy"] == {"decoupled": True}


def h_infer(c: th.InferenceServerClient, srv: RunningServer) -> None:
    with pytest.raises(InferenceServerException, match="/v2/models/smollm2/generate"):
        c.infer("smollm2", _prompt(th))
    with pytest.raises(InferenceServerException, match="/v2/models/smollm2/generate"):
        c.async_infer("smollm2", _prompt(th)).get_result()


def h_statistics(c: th.InferenceServerClient, srv: RunningServer) -> None:
    before = c.get_inference_statistics("smollm2")["model_stats"][0]["inference_stats"]["success"]["count"]
    _generated(srv)
    (stats,) = c.get_inference_statistics("smollm2")["model_stats"]
    assert stats["name"] == "smollm2" and stats["inference_stats"]["success"]["count"] == before + 1
    assert stats["inference_stats"]["compute_infer"]["ns"] > 0


def h_trace(c: th.InferenceServerClient, srv: RunningServer) -> None:
    settings = c.get_trace_settings("smollm2")
    assert c.update_trace_settings("smollm2", settings={"trace_level": ["OFF"]}) == settings


def h_control(c: th.InferenceServerClient, srv: RunningServer) -> None:
    c.unload_model("smollm2")
    assert not c.is_model_ready("smollm2") and c.is_server_ready()
    with pytest.raises(InferenceServerException, match="unloaded"):
        c.get_model_config("smollm2")
    assert "smollm2" not in {row["name"] for row in c.get_inference_statistics()["model_stats"]}
    assert httpx.post(srv.url + "/v2/models/smollm2/generate", json={"text_input": "hi"}).status_code == 404
    c.load_model("smollm2")
    assert c.is_model_ready("smollm2") and _generated(srv)


LLM_HTTP_CALLS: dict[str, Callable[[th.InferenceServerClient, RunningServer], None]] = {
    "is_model_ready": h_model, "get_model_metadata": h_model, "get_model_config": h_model,
    "infer": h_infer, "async_infer": h_infer, "get_inference_statistics": h_statistics,
    "get_trace_settings": h_trace, "update_trace_settings": h_trace, "load_model": h_control,
    "unload_model": h_control,
}


# --- gRPC ---------------------------------------------------------------------------------------------------
def g_model(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    assert c.is_model_ready("smollm2")
    assert c.get_model_metadata("smollm2").inputs[0].name == "text_input"
    assert c.get_model_config("smollm2").config.model_transaction_policy.decoupled


def g_infer(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    expected = _generated(srv)
    text = bytes(c.infer("smollm2", _prompt(tg), parameters=GREEDY).as_numpy("text_output")[0]).decode()
    assert text == expected
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    c.async_infer("smollm2", _prompt(tg), lambda result, error: results.put((result, error)), parameters=GREEDY)
    result, error = results.get(timeout=60)
    assert error is None and bytes(result.as_numpy("text_output")[0]).decode() == expected


def g_stream(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    expected = _generated(srv)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    c.start_stream(lambda result, error: results.put((result, error)))
    c.async_stream_infer("smollm2", _prompt(tg), parameters=GREEDY, request_id="llm")
    chunks = []
    while True:
        result, error = results.get(timeout=60)
        assert error is None, error
        chunks.append(bytes(result.as_numpy("text_output")[0]).decode())
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    c.stop_stream()
    assert len(chunks) >= 2 and "".join(chunks) == expected


def g_statistics(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    def successes() -> int:
        row = c.get_inference_statistics("smollm2", as_json=True)["model_stats"][0]
        return int(row["inference_stats"]["success"].get("count", 0))

    before = successes()
    c.infer("smollm2", _prompt(tg), parameters=GREEDY)
    assert successes() == before + 1


def g_trace(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    assert c.get_trace_settings("smollm2", as_json=True)["settings"]["trace_level"]["value"] == ["OFF"]
    c.update_trace_settings("smollm2", settings={"trace_level": ["OFF"]})


def g_control(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    c.unload_model("smollm2")
    assert c.is_server_ready()
    for call in (lambda: c.is_model_ready("smollm2"), lambda: c.get_model_metadata("smollm2"),
                 lambda: c.infer("smollm2", _prompt(tg), parameters=GREEDY)):
        with pytest.raises(InferenceServerException, match="unloaded"):  # as an unloaded tensor model
            call()
    c.load_model("smollm2")
    assert c.is_model_ready("smollm2")


LLM_GRPC_CALLS: dict[str, Callable[[tg.InferenceServerClient, RunningServer], None]] = {
    "is_model_ready": g_model, "get_model_metadata": g_model, "get_model_config": g_model,
    "infer": g_infer, "async_infer": g_infer, "start_stream": g_stream, "async_stream_infer": g_stream,
    "stop_stream": g_stream, "get_inference_statistics": g_statistics, "get_trace_settings": g_trace,
    "update_trace_settings": g_trace, "load_model": g_control, "unload_model": g_control,
}


def _model_methods(cls: type) -> set[str]:
    return {name for name, f in inspect.getmembers(cls) if not name.startswith("_") and callable(f)
            and "model_name" in inspect.signature(f).parameters}


@pytest.mark.parametrize(("cls", "table"), [(th.InferenceServerClient, LLM_HTTP_CALLS),
                                             (tg.InferenceServerClient, LLM_GRPC_CALLS)], ids=["http", "grpc"])
def test_every_model_method_is_checked_on_the_llm(cls: type, table: dict[str, object]) -> None:
    untested = _model_methods(cls) - set(table)
    assert not untested, f"tritonclient model methods with no check on the LLM: {sorted(untested)}"


CHECKS: list[tuple[Any, Callable[[Any, RunningServer], None]]] = [
    *[(th, f) for f in sorted(set(LLM_HTTP_CALLS.values()), key=lambda f: f.__name__)],
    *[(tg, f) for f in sorted(set(LLM_GRPC_CALLS.values()), key=lambda f: f.__name__)],
]


@pytest.mark.parametrize(("client_module", "check"), CHECKS, ids=[f.__name__ for _, f in CHECKS])
def test_client_on_the_llm(srv: RunningServer, client_module: Any, check: Callable[[Any, RunningServer], None]) -> None:
    client = client_module.InferenceServerClient(srv.http_target if client_module is th else srv.grpc_target)
    try:
        check(client, srv)
    finally:
        client.close()
    assert srv.alive()
