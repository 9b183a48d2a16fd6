"""The LLM under Triton's model control, through a real `headroom serve`: poll mode reloads it when its
config.yaml changes (in-flight requests finish on the old engine), explicit mode loads and unloads it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
LONG = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 120, "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True}}


def _max_model_len(srv: RunningServer) -> int | None:
    cards = {c["id"]: c for c in httpx.get(srv.url + "/v1/models", timeout=30).json()["data"]}
    return cards["smollm2"]["max_model_len"] if "smollm2" in cards else None


def _until(check: object, what: str, srv: RunningServer, timeout_s: float = 120.0) -> None:
    """Poll `check()` (each call a request to the server) until true, at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
    raise AssertionError(f"{what} did not happen within {timeout_s} s; server log:\n{srv.log()[-3000:]}")


def _events(lines: Iterator[str]) -> list[dict[str, object]]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


def _completion_tokens(events: list[dict[str, object]]) -> int:
    usage = [e["usage"] for e in events if e.get("usage")]
    assert len(usage) == 1, events[-3:]
    return int(usage[0]["completion_tokens"])  # type: ignore[index]


def test_poll_mode_reloads_the_llm_and_lets_in_flight_requests_finish(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "smollm2").mkdir(parents=True)
    config = (REPO / "smollm2" / "config.yaml").read_text()
    assert "max_model_len: 2048" in config
    (repo / "smollm2" / "config.yaml").write_text(config)
    args = ["--grpc-port", "-1", "--model-control-mode", "poll", "--repository-poll-secs", "0.2"]
    with run_server(repo, tmp_path, args) as srv:
        assert _max_model_len(srv) == 2048
        with httpx.stream("POST", srv.url + "/v1/completions", json=LONG, timeout=120) as reply:
            assert reply.status_code == 200
            lines = reply.iter_lines()
            first = _events(line for line in [next(lines)])  # the stream is running on the first engine
            (repo / "smollm2" / "config.yaml").write_text(config.replace("max_model_len: 2048", "max_model_len: 1024"))
            _until(lambda: _max_model_len(srv) == 1024, "the reload", srv)
            rest = _events(lines)
        assert first and _completion_tokens(rest) == 120  # not cut by the reload
        _until(lambda: "poll: loaded smollm2" in srv.log(), "the old engine's drain", srv)
        short = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "model": "smollm2", "prompt": PROMPT, "max_tokens": 4, "temperature": 0})
        assert short.status_code == 200, short.text
        too_long = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "model": "smollm2", "prompt": PROMPT, "max_tokens": 1500})
        assert too_long.status_code == 400 and "1024" in too_long.text  # the new config's limit
        config_json = httpx.get(srv.url + "/v2/models/smollm2/config", timeout=30).json()
        assert config_json["parameters"]["max_model_len"] == {"string_value": "1024"}
        # a broken config: the reload fails, the running engine keeps serving
        (repo / "smollm2" / "config.yaml").write_text(config.replace("max_model_len: 2048", "max_model_len: -3"))
        _until(lambda: "poll: loading smollm2 failed" in srv.log(), "the failed reload", srv)
        assert _max_model_len(srv) == 1024
        assert httpx.post(srv.url + "/v2/models/smollm2/generate", timeout=60, json={
            "text_input": PROMPT, "parameters": {"max_tokens": 2}}).status_code == 200
        assert srv.alive()


def _not_found(call: object) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()  # type: ignore[operator]
    assert info.value.status() == str(grpc.StatusCode.NOT_FOUND), info.value
    return str(info.value)


def _prompt() -> list[tg.InferInput]:
    inp = tg.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
    return [inp]


def _generate(srv: RunningServer) -> httpx.Response:
    return httpx.post(srv.url + "/v2/models/smollm2/generate", timeout=60,
                      json={"text_input": PROMPT, "parameters": {"max_tokens": 3, "temperature": 0}})


def test_explicit_mode_loads_and_unloads_the_llm(tmp_path: Path) -> None:
    args = ["--model", "smollm2", "--model", "digits", "--model-control-mode", "explicit", "--load-model", "digits"]
    with run_server(REPO, tmp_path, args) as srv:
        http, rpc = th.InferenceServerClient(srv.http_target), tg.InferenceServerClient(srv.grpc_target)
        # not in --load-model: known, listed UNAVAILABLE, refused with 404 / NOT_FOUND; the server is ready
        index = {r["name"]: r for r in http.get_model_repository_index()}
        assert index["smollm2"]["state"] == "UNAVAILABLE" and index["smollm2"]["reason"] == "unloaded"
        assert http.is_server_ready() and not http.is_model_ready("smollm2")
        assert _generate(srv).status_code == 404 and _max_model_len(srv) is None
        assert "unloaded" in _not_found(lambda: rpc.infer("smollm2", _prompt()))
        rpc.load_model("smollm2")
        assert http.is_model_ready("smollm2") and _max_model_len(srv) == 2048
        text = _generate(srv).json()["text_output"]
        assert text and bytes(rpc.infer("smollm2", _prompt(), parameters={
            "max_tokens": 3, "temperature": 0.0}).as_numpy("text_output")[0]).decode() == text
        # unload with a request in flight: the unload waits for it, the request completes
        with httpx.stream("POST", srv.url + "/v1/completions", json=LONG, timeout=120) as reply, \
                ThreadPoolExecutor(1) as pool:
            lines = reply.iter_lines()
            assert _events(line for line in [next(lines)])
            unloading = pool.submit(lambda: tg.InferenceServerClient(srv.grpc_target).unload_model("smollm2"))
            rest = _events(lines)
            unloading.result(timeout=120)
        assert _completion_tokens(rest) == 120
        assert _generate(srv).status_code == 404 and not http.is_model_ready("smollm2")
        assert httpx.post(srv.url + "/v1/completions", timeout=30,
                          json={"model": "smollm2", "prompt": "hi"}).status_code == 404
        assert http.is_server_ready()
        with pytest.raises(InferenceServerException, match="config override is not supported"):
            http.load_model("smollm2", config=json.dumps({"max_batch_size": 0}))
        http.load_model("smollm2")  # and back
        assert _generate(srv).json()["text_output"] == text
        assert srv.alive()
