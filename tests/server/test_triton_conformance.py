"""Every public method of tritonclient's HTTP and gRPC `InferenceServerClient` against a real `headroom serve`.

`HTTP_CALLS` / `GRPC_CALLS` map each method to a call that checks its answer; the coverage tests enumerate
the clients' public methods with `inspect` and fail on any method that is in neither a table nor
`NOT_APPLICABLE` (with its reason), so a new tritonclient method cannot slip through untested.
"""

from __future__ import annotations

import base64
import inspect
import json
import queue
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient._plugin import InferenceServerClientPlugin
from tritonclient.utils import InferenceServerException

from tests.server.conftest import build_test_repository
from tests.support.server import TRUST_PYTHON, RunningServer, run_server

#: public methods that make no server call of their own; each reason says why no server check applies.
NOT_APPLICABLE: dict[str, str] = {}


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = build_test_repository(tmp_path_factory.mktemp("triton-repo"))
    args = ["--model-control-mode", "explicit", *TRUST_PYTHON]
    with run_server(repo, tmp_path_factory.mktemp("triton-logs"), args) as srv:
        yield srv


def _x(mod: Any, values: np.ndarray) -> Any:
    inp = mod.InferInput("x", list(values.shape), "FP32")
    inp.set_data_from_numpy(values)
    return inp


X = np.array([[1.0, 2.0], [3.0, -4.0]], dtype=np.float32)


def _raises(call: Callable[[], object], *needles: str) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    text = str(info.value)
    assert all(n in text for n in needles), text
    return info.value


class HeaderPlugin(InferenceServerClientPlugin):
    def __init__(self, name: str, value: str) -> None:
        self.name, self.value = name, value

    def __call__(self, request: Any) -> None:
        request.headers[self.name] = self.value


# --- HTTP ---------------------------------------------------------------------------------------------------
def h_health(c: th.InferenceServerClient, srv: RunningServer) -> None:
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("echo")
    assert not c.is_model_ready("nope")


def h_server_metadata(c: th.InferenceServerClient, srv: RunningServer) -> None:
    meta = c.get_server_metadata()
    assert meta["name"] == "headroom" and {"model_configuration", "model_repository", "statistics"} <= set(
        meta["extensions"])


def h_model_metadata(c: th.InferenceServerClient, srv: RunningServer) -> None:
    meta = c.get_model_metadata("echo")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]
    _raises(lambda: c.get_model_metadata("nope"), "Request for unknown model: 'nope' is not found")


def h_model_config(c: th.InferenceServerClient, srv: RunningServer) -> None:
    cfg = c.get_model_config("echo")
    assert cfg["name"] == "echo" and cfg["backend"] == "python" and cfg["max_batch_size"] == 16
    assert cfg["input"][0] == {"name": "x", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [2],
                               "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False}
    assert [o["data_type"] for o in cfg["output"]] == ["TYPE_FP32", "TYPE_INT32"]
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 50_000
    assert cfg["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 64
    assert cfg["instance_group"][0]["count"] == 1 and cfg["instance_group"][0]["kind"] == "KIND_CPU"
    assert c.get_model_config("text", "1")["input"][0]["data_type"] == "TYPE_STRING"
    _raises(lambda: c.get_model_config("echo", "7"), "version 7 is not found")


def h_infer(c: th.InferenceServerClient, srv: RunningServer) -> None:
    np.testing.assert_array_equal(c.infer("echo", [_x(th, X)]).as_numpy("y"), X * 2)


def h_async_infer(c: th.InferenceServerClient, srv: RunningServer) -> None:
    pending = [c.async_infer("echo", [_x(th, X + i)], request_id=str(i)) for i in range(3)]
    for i, p in enumerate(pending):
        np.testing.assert_array_equal(p.get_result().as_numpy("y"), (X + i) * 2)


def h_statistics(c: th.InferenceServerClient, srv: RunningServer) -> None:
    c.infer("echo", [_x(th, X)])
    (stats,) = c.get_inference_statistics("echo")["model_stats"]
    inference = stats["inference_stats"]
    assert {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output"} <= set(inference)
    assert inference["success"]["count"] >= 1 and inference["success"]["ns"] > 0
    assert inference["queue"]["count"] == inference["success"]["count"]
    assert stats["inference_count"] >= 2 and stats["execution_count"] >= 1 and stats["last_inference"] > 0
    assert stats["batch_stats"] and all(b["compute_infer"]["count"] >= 1 for b in stats["batch_stats"])
    everything = c.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in everything} >= {"echo", "text", "cams"}


def h_repository(c: th.InferenceServerClient, srv: RunningServer) -> None:
    index = {r["name"]: r for r in c.get_model_repository_index()}
    assert index["echo"] == {"name": "echo", "version": "1", "state": "READY", "reason": ""}
    c.unload_model("cams")
    assert not c.is_model_ready("cams")
    assert {r["name"]: r["state"] for r in c.get_model_repository_index()}["cams"] == "UNAVAILABLE"
    ready = httpx.post(srv.url + "/v2/repository/index", json={"ready": True}).json()
    assert "cams" not in {r["name"] for r in ready} and all(r["state"] == "READY" for r in ready)
    c.load_model("cams")
    assert c.is_model_ready("cams")


def h_load_with_config(c: th.InferenceServerClient, srv: RunningServer) -> None:
    cfg = c.get_model_config("text")
    cfg["max_batch_size"] = 4
    cfg["dynamic_batching"]["max_queue_delay_microseconds"] = 3000
    cfg["instance_group"][0]["count"] = 2
    c.load_model("text", config=json.dumps(cfg))  # applied: the served config changes
    now = c.get_model_config("text")
    assert now["max_batch_size"] == 4 and now["instance_group"][0]["count"] == 2
    assert now["dynamic_batching"]["max_queue_delay_microseconds"] == 3000
    _raises(lambda: c.load_model("text", config=json.dumps({"max_batch_size": 4, "backend": "tensorrt"})),
            "'backend' cannot be changed")
    _raises(lambda: c.load_model("text", config=json.dumps({"max_batch_size": 2, "dynamic_batching": {
        "preferred_batch_size": [8]}})), "exceeds max_batch_size")
    assert c.get_model_config("text")["max_batch_size"] == 4  # a refused override changes nothing
    c.load_model("text")  # no override: config.yaml again
    assert c.get_model_config("text")["max_batch_size"] == 8
    _raises(lambda: c.load_model("nope"), "nope")


def h_shared_memory(c: th.InferenceServerClient, srv: RunningServer) -> None:
    assert c.get_system_shared_memory_status() == [] and c.get_cuda_shared_memory_status() == []
    _raises(lambda: c.register_system_shared_memory("r", "/key", 64), "system shared memory is not supported")
    _raises(lambda: c.register_cuda_shared_memory("r", b"handle", 0, 64), "cuda shared memory is not supported")
    c.unregister_system_shared_memory()
    c.unregister_cuda_shared_memory("r")
    _raises(lambda: c.get_system_shared_memory_status("r"), "Unable to find system shared memory region")


def h_trace(c: th.InferenceServerClient, srv: RunningServer) -> None:
    settings = c.get_trace_settings()
    assert settings["trace_level"] == ["OFF"]
    assert c.update_trace_settings(settings={"trace_level": ["OFF"]}) == settings
    assert c.get_trace_settings("echo") == settings
    _raises(lambda: c.update_trace_settings(settings={"trace_rate": "5"}), "trace_rate", "cannot be changed")


def h_log(c: th.InferenceServerClient, srv: RunningServer) -> None:
    assert c.get_log_settings()["log_info"] is True
    assert c.update_log_settings({"log_info": False})["log_info"] is False
    assert c.update_log_settings({"log_info": True})["log_info"] is True
    _raises(lambda: c.update_log_settings({"log_file": "/tmp/x.log"}), "log_file")


def h_request_body(c: th.InferenceServerClient, srv: RunningServer) -> None:
    body, header_length = th.InferenceServerClient.generate_request_body([_x(th, X)])
    headers = {"Inference-Header-Content-Length": str(header_length)} if header_length else {}
    reply = httpx.post(srv.url + "/v2/models/echo/infer", content=body, headers=headers)
    length = reply.headers.get("inference-header-content-length")
    result = th.InferenceServerClient.parse_response_body(reply.content, header_length=int(length or 0) or None)
    np.testing.assert_array_equal(result.as_numpy("y"), X * 2)


def h_plugin(c: th.InferenceServerClient, srv: RunningServer) -> None:
    plugin = HeaderPlugin("X-Request-Timeout-Ms", "soon")  # the server must see it: a 400 naming the header
    c.register_plugin(plugin)
    assert c.plugin() is plugin
    _raises(lambda: c.infer("echo", [_x(th, X)]), "X-Request-Timeout-Ms")
    c.unregister_plugin()
    assert c.plugin() is None
    h_infer(c, srv)


def h_close(c: th.InferenceServerClient, srv: RunningServer) -> None:
    other = th.InferenceServerClient(srv.http_target)
    assert other.is_server_live()
    other.close()


HTTP_CALLS: dict[str, Callable[[th.InferenceServerClient, RunningServer], None]] = {
    "is_server_live": h_health, "is_server_ready": h_health, "is_model_ready": h_health,
    "get_server_metadata": h_server_metadata, "get_model_metadata": h_model_metadata,
    "get_model_config": h_model_config, "infer": h_infer, "async_infer": h_async_infer,
    "get_inference_statistics": h_statistics, "get_model_repository_index": h_repository,
    "load_model": h_load_with_config, "unload_model": h_repository,
    "get_system_shared_memory_status": h_shared_memory, "register_system_shared_memory": h_shared_memory,
    "unregister_system_shared_memory": h_shared_memory, "get_cuda_shared_memory_status": h_shared_memory,
    "register_cuda_shared_memory": h_shared_memory, "unregister_cuda_shared_memory": h_shared_memory,
    "get_trace_settings": h_trace, "update_trace_settings": h_trace,
    "get_log_settings": h_log, "update_log_settings": h_log,
    "generate_request_body": h_request_body, "parse_response_body": h_request_body,
    "plugin": h_plugin, "register_plugin": h_plugin, "unregister_plugin": h_plugin, "close": h_close,
}


# --- gRPC ---------------------------------------------------------------------------------------------------
def g_health(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("echo")
    _raises(lambda: c.is_model_ready("nope"), "Request for unknown model: 'nope' is not found")


def g_metadata(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    assert "model_configuration" in c.get_server_metadata(as_json=True)["extensions"]
    assert c.get_model_metadata("echo", as_json=True)["inputs"][0]["shape"] == ["-1", "2"]


def g_model_config(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    cfg = c.get_model_config("echo", as_json=True)["config"]
    assert cfg["name"] == "echo" and cfg["max_batch_size"] == 16 and cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == "50000"  # proto3 JSON: uint64 as text
    assert c.get_model_config("echo").config.input[0].dims == [2]
    _raises(lambda: c.get_model_config("nope"), "nope")


def g_infer(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    np.testing.assert_array_equal(c.infer("echo", [_x(tg, X)]).as_numpy("y"), X * 2)


def g_async_infer(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    c.async_infer("echo", [_x(tg, X)], lambda result, error: results.put((result, error)))
    result, error = results.get(timeout=30)
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("y"), X * 2)


def g_stream(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    c.start_stream(lambda result, error: results.put((result, error)))
    for i in range(3):
        c.async_stream_infer("echo", [_x(tg, X + i)], request_id=f"s{i}")
    c.async_stream_infer("nope", [_x(tg, X)], request_id="bad")  # an error for this request only
    c.async_stream_infer("echo", [_x(tg, X + 9)], request_id="s9")
    answers = [results.get(timeout=30) for _ in range(5)]
    c.stop_stream()
    errors = [e for _, e in answers if e is not None]
    assert len(errors) == 1 and "Request for unknown model: 'nope'" in str(errors[0])
    by_id = {r.get_response().id: r for r, e in answers if e is None}
    assert set(by_id) == {"s0", "s1", "s2", "s9"}
    for rid, offset in (("s0", 0), ("s1", 1), ("s2", 2), ("s9", 9)):
        np.testing.assert_array_equal(by_id[rid].as_numpy("y"), (X + offset) * 2)


def g_statistics(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    c.infer("echo", [_x(tg, X)])
    stats = c.get_inference_statistics("echo", as_json=True)["model_stats"][0]
    assert {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output"} <= set(
        stats["inference_stats"])
    assert int(stats["inference_stats"]["success"]["count"]) >= 1 and stats["batch_stats"]
    assert int(stats["last_inference"]) > 0


def g_repository(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    index = {m.name: m for m in c.get_model_repository_index().models}
    assert index["echo"].state == "READY" and index["echo"].version == "1"
    c.unload_model("cams")
    _raises(lambda: c.is_model_ready("cams"), "Request for unknown model: 'cams'")
    assert {m["name"]: m["state"] for m in c.get_model_repository_index(as_json=True)["models"]}[
        "cams"] == "UNAVAILABLE"
    c.load_model("cams", config=json.dumps({"max_batch_size": 4}))
    assert c.get_model_config("cams").config.max_batch_size == 4
    _raises(lambda: c.load_model("cams", config=json.dumps({"max_batch_sise": 4})), "max_batch_sise")
    c.load_model("cams")
    assert c.get_model_config("cams").config.max_batch_size == 8


def g_shared_memory(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    assert not c.get_system_shared_memory_status(as_json=True).get("regions")
    assert not c.get_cuda_shared_memory_status(as_json=True).get("regions")
    err = _raises(lambda: c.register_system_shared_memory("r", "/key", 64), "not supported")
    assert "UNIMPLEMENTED" in str(err.status())
    _raises(lambda: c.register_cuda_shared_memory("r", base64.b64encode(b"handle"), 0, 64), "not supported")
    c.unregister_system_shared_memory()
    c.unregister_cuda_shared_memory("r")


def g_trace(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    settings = c.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"]["value"] == ["OFF"]
    c.update_trace_settings(settings={"trace_level": ["OFF"]})
    _raises(lambda: c.update_trace_settings(settings={"trace_rate": "5"}), "cannot be changed")


def g_log(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    assert c.get_log_settings(as_json=True)["settings"]["log_info"]["bool_param"] is True
    c.update_log_settings({"log_verbose_level": 0})
    _raises(lambda: c.update_log_settings({"log_format": "ISO8601"}), "log_format")


def g_plugin(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    plugin = HeaderPlugin("x-request-id", "from-plugin")
    c.register_plugin(plugin)
    assert c.plugin() is plugin
    g_infer(c, srv)  # the header travels as metadata; the call still succeeds
    c.unregister_plugin()
    assert c.plugin() is None


def g_close(c: tg.InferenceServerClient, srv: RunningServer) -> None:
    other = tg.InferenceServerClient(srv.grpc_target)
    assert other.is_server_live()
    other.close()


GRPC_CALLS: dict[str, Callable[[tg.InferenceServerClient, RunningServer], None]] = {
    "is_server_live": g_health, "is_server_ready": g_health, "is_model_ready": g_health,
    "get_server_metadata": g_metadata, "get_model_metadata": g_metadata, "get_model_config": g_model_config,
    "infer": g_infer, "async_infer": g_async_infer, "start_stream": g_stream, "async_stream_infer": g_stream,
    "stop_stream": g_stream, "get_inference_statistics": g_statistics,
    "get_model_repository_index": g_repository, "load_model": g_repository, "unload_model": g_repository,
    "get_system_shared_memory_status": g_shared_memory, "register_system_shared_memory": g_shared_memory,
    "unregister_system_shared_memory": g_shared_memory, "get_cuda_shared_memory_status": g_shared_memory,
    "register_cuda_shared_memory": g_shared_memory, "unregister_cuda_shared_memory": g_shared_memory,
    "get_trace_settings": g_trace, "update_trace_settings": g_trace,
    "get_log_settings": g_log, "update_log_settings": g_log,
    "plugin": g_plugin, "register_plugin": g_plugin, "unregister_plugin": g_plugin, "close": g_close,
}


def _public(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")}


@pytest.mark.parametrize(("cls", "table"), [(th.InferenceServerClient, HTTP_CALLS),
                                             (tg.InferenceServerClient, GRPC_CALLS)], ids=["http", "grpc"])
def test_every_public_method_is_tested_or_listed(cls: type, table: dict[str, object]) -> None:
    untested = _public(cls) - set(table) - set(NOT_APPLICABLE)
    assert not untested, f"tritonclient methods with no conformance test: {sorted(untested)}"
    assert not set(table) - _public(cls), "the table names methods the client does not have"


@pytest.mark.parametrize("check", sorted(set(HTTP_CALLS.values()), key=lambda f: f.__name__),
                         ids=lambda f: f.__name__)
def test_http_client(explicit: RunningServer, check: Callable[[th.InferenceServerClient, RunningServer], None]) -> None:
    client = th.InferenceServerClient(explicit.http_target, concurrency=4)
    try:
        check(client, explicit)
    finally:
        client.close()
    assert explicit.alive()


@pytest.mark.parametrize("check", sorted(set(GRPC_CALLS.values()), key=lambda f: f.__name__),
                         ids=lambda f: f.__name__)
def test_grpc_client(explicit: RunningServer, check: Callable[[tg.InferenceServerClient, RunningServer], None]) -> None:
    client = tg.InferenceServerClient(explicit.grpc_target)
    try:
        check(client, explicit)
    finally:
        client.close()
    assert explicit.alive()


def test_model_control_none_refuses_load_and_unload_as_triton(server: RunningServer) -> None:
    """The default mode (none): load/unload answer Triton's error and status (UNAVAILABLE: 503)."""
    reply = httpx.post(server.url + "/v2/repository/models/echo/load")
    assert reply.status_code == 503
    assert "explicit model load / unload is not allowed if polling is enabled" in reply.json()["error"]
    assert httpx.post(server.url + "/v2/repository/models/echo/unload").status_code == 503
    err = _raises(lambda: tg.InferenceServerClient(server.grpc_target).unload_model("echo"), "not allowed")
    assert "UNAVAILABLE" in str(err.status())
    assert th.InferenceServerClient(server.http_target).is_model_ready("echo")  # nothing was unloaded


def test_refused_override_keys_are_named(explicit: RunningServer) -> None:
    reply = httpx.post(explicit.url + "/v2/repository/models/echo/load",
                       json={"parameters": {"config": json.dumps({"max_batch_size": 8}), "file:1/model.py": "eA=="}})
    assert reply.status_code == 400 and "file:1/model.py" in reply.json()["error"]
