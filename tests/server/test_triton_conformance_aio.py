"""Every public method of tritonclient's asyncio clients (`tritonclient.http.aio` / `tritonclient.grpc.aio`
`InferenceServerClient`) against a real `headroom serve` in explicit model-control mode.

The same layout as the sync suite (test_triton_conformance.py, whose fixture and helpers this reuses):
`HTTP_AIO_CALLS` / `GRPC_AIO_CALLS` map each method to an async check of its answer, and the coverage test
fails on any public method that is in neither a table nor `NOT_APPLICABLE`. The statistics checks also pin
Triton's `response_stats` (per response index; "0": a tensor model's only response) after real requests.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
import tritonclient.http as th
import tritonclient.http.aio as tha
from tritonclient.utils import InferenceServerException

from tests.server.test_triton_conformance import HeaderPlugin, X, _public, _x, explicit
from tests.support.server import RunningServer

__all__ = ["explicit"]  # the module-scoped explicit-mode server fixture, shared in code (one server per module)

#: public methods that make no server call of their own; each reason says why no server check applies.
NOT_APPLICABLE: dict[str, str] = {}
TEXT = np.array([[b"abc"], [b"\x00x\xff"]], dtype=object)  # BYTES, one with a NUL and a non-UTF-8 byte


async def _raises(call: Awaitable[object], *needles: str) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        await call
    text = str(info.value)
    assert all(n in text for n in needles), text
    return info.value


def _text(mod: Any) -> Any:
    inp = mod.InferInput("text", list(TEXT.shape), "BYTES")
    inp.set_data_from_numpy(TEXT)
    return inp


async def _requests(*requests: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    for request in requests:
        yield request


class CountingPlugin(HeaderPlugin):
    calls = 0

    def __call__(self, request: Any) -> None:
        self.calls += 1
        super().__call__(request)


def _check_response_stats(before: dict[str, Any], after: dict[str, Any], requests: int) -> None:
    """Two statistics rows (HTTP JSON or proto3 JSON) `requests` answered requests apart: each added one
    response "0" (a tensor model's only one) with its infer and output time, and no failed/empty/cancelled one."""
    def gained(name: str) -> tuple[int, int]:  # (count, ns) gained by response "0"'s `name`
        was, now = (row.get("response_stats", {}).get("0", {}).get(name, {}) for row in (before, after))
        return int(now.get("count", 0)) - int(was.get("count", 0)), int(now.get("ns", 0)) - int(was.get("ns", 0))
    assert set(after["response_stats"]) == {"0"}, after["response_stats"]
    infer, output, success = gained("compute_infer"), gained("compute_output"), gained("success")
    assert infer[0] == output[0] == success[0] == requests, (infer, output, success)
    assert infer[1] > 0 and success[1] > 0
    assert abs(success[1] - infer[1] - output[1]) <= requests  # success = infer + output, each rounded to ns
    assert all(gained(n) == (0, 0) for n in ("fail", "empty_response", "cancel")), after["response_stats"]
    success_count = int(after["inference_stats"]["success"]["count"])
    assert success_count - int(before["inference_stats"]["success"]["count"]) == requests


# --- HTTP aio -----------------------------------------------------------------------------------------------
async def ha_health(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    assert await c.is_server_live() and await c.is_server_ready()
    assert await c.is_model_ready("echo") and await c.is_model_ready("echo", "1")
    assert not await c.is_model_ready("nope") and not await c.is_model_ready("echo", "7")


async def ha_metadata(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    meta = await c.get_server_metadata()
    assert meta["name"] == "headroom" and {"model_repository", "statistics"} <= set(meta["extensions"])
    model = await c.get_model_metadata("echo")
    assert model["name"] == "echo" and model["versions"] == ["1"]
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]
    assert [o["datatype"] for o in model["outputs"]] == ["FP32", "INT32"]
    await _raises(c.get_model_metadata("nope"), "Request for unknown model: 'nope' is not found")


async def ha_model_config(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    cfg = await c.get_model_config("echo")
    assert cfg["name"] == "echo" and cfg["max_batch_size"] == 16 and cfg["input"][0]["dims"] == [2]
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 50_000
    assert (await c.get_model_config("text", "1"))["input"][0]["data_type"] == "TYPE_STRING"
    await _raises(c.get_model_config("echo", "7"), "version 7 is not found")


async def ha_infer(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    outputs = [th.InferRequestedOutput("y", binary_data=True), th.InferRequestedOutput("batch", binary_data=False)]
    result = await c.infer("echo", [_x(th, X)], outputs=outputs, request_id="aio-1")  # binary input tensor
    np.testing.assert_array_equal(result.as_numpy("y"), X * 2)
    np.testing.assert_array_equal(result.as_numpy("batch"), [[2], [2]])
    by_name = {o["name"]: o for o in result.get_response()["outputs"]}
    assert result.get_response()["id"] == "aio-1"
    assert by_name["y"]["parameters"]["binary_data_size"] == X.nbytes and "data" not in by_name["y"]
    assert by_name["batch"]["data"] == [2, 2] and "parameters" not in by_name["batch"]
    upper = await c.infer("text", [_text(th)], model_version="1")
    np.testing.assert_array_equal(upper.as_numpy("upper"), np.array([[b"ABC"], [b"\x00X\xff"]], dtype=object))
    await _raises(c.infer("nope", [_x(th, X)]), "Request for unknown model: 'nope'")
    await _raises(c.infer("echo", [_x(th, np.ones((2, 3), np.float32))]), "shape")


async def ha_statistics(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    (before,) = (await c.get_inference_statistics("echo"))["model_stats"]
    for i in range(3):
        await c.infer("echo", [_x(th, X + i)])
    (after,) = (await c.get_inference_statistics("echo", "1"))["model_stats"]
    assert after["name"] == "echo" and after["version"] == "1" and after["last_inference"] > 0
    _check_response_stats(before, after, 3)
    everything = (await c.get_inference_statistics())["model_stats"]
    assert {s["name"] for s in everything} >= {"echo", "text", "cams"}
    assert all("response_stats" in s for s in everything)
    await _raises(c.get_inference_statistics("echo", "7"), "version 7")


async def ha_repository(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    index = {r["name"]: r for r in await c.get_model_repository_index()}
    assert index["echo"] == {"name": "echo", "version": "1", "state": "READY", "reason": ""}
    await c.unload_model("cams")
    assert not await c.is_model_ready("cams")
    assert {r["name"]: r["state"] for r in await c.get_model_repository_index()}["cams"] == "UNAVAILABLE"
    await c.load_model("cams")
    assert await c.is_model_ready("cams")
    await _raises(c.load_model("nope"), "nope")


async def ha_load_with_config(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    cfg = await c.get_model_config("text")
    cfg["max_batch_size"] = 4
    await c.load_model("text", config=json.dumps(cfg))
    assert (await c.get_model_config("text"))["max_batch_size"] == 4
    await _raises(c.load_model("text", config=json.dumps({"max_batch_size": 4, "backend": "tensorrt"})),
                  "'backend' cannot be changed")
    await c.load_model("text")  # no override: config.yaml again
    assert (await c.get_model_config("text"))["max_batch_size"] == 8


async def ha_shared_memory(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    assert await c.get_system_shared_memory_status() == [] and await c.get_cuda_shared_memory_status() == []
    await _raises(c.register_system_shared_memory("r", "/key", 64), "system shared memory is not supported")
    handle = base64.b64encode(b"handle").decode()  # the aio client puts it in the JSON as is
    await _raises(c.register_cuda_shared_memory("r", handle, 0, 64), "cuda shared memory is not supported")
    await c.unregister_system_shared_memory()
    await c.unregister_cuda_shared_memory("r")
    await _raises(c.get_system_shared_memory_status("r"), "Unable to find system shared memory region")


async def ha_trace(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    settings = await c.get_trace_settings()
    assert settings["trace_level"] == ["OFF"]
    assert await c.update_trace_settings(settings={"trace_level": ["OFF"]}) == settings
    assert await c.get_trace_settings("echo") == settings
    await _raises(c.update_trace_settings(settings={"trace_rate": "5"}), "trace_rate", "cannot be changed")


async def ha_log(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    assert (await c.get_log_settings())["log_info"] is True
    assert (await c.update_log_settings({"log_info": False}))["log_info"] is False
    assert (await c.update_log_settings({"log_info": True}))["log_info"] is True
    await _raises(c.update_log_settings({"log_file": "/tmp/x.log"}), "log_file")


async def ha_request_body(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    body, header_length = tha.InferenceServerClient.generate_request_body([_x(th, X)])
    headers = {"Inference-Header-Content-Length": str(header_length)} if header_length else {}
    async with httpx.AsyncClient() as http:
        reply = await http.post(srv.url + "/v2/models/echo/infer", content=body, headers=headers)
    length = reply.headers.get("inference-header-content-length")
    result = tha.InferenceServerClient.parse_response_body(reply.content, header_length=int(length or 0) or None)
    np.testing.assert_array_equal(result.as_numpy("y"), X * 2)


async def ha_plugin(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    plugin = HeaderPlugin("X-Request-Timeout-Ms", "soon")  # the server must see it: a 400 naming the header
    c.register_plugin(plugin)
    assert c.plugin() is plugin
    await _raises(c.infer("echo", [_x(th, X)]), "X-Request-Timeout-Ms")
    c.unregister_plugin()
    assert c.plugin() is None
    np.testing.assert_array_equal((await c.infer("echo", [_x(th, X)])).as_numpy("y"), X * 2)


async def ha_close(c: tha.InferenceServerClient, srv: RunningServer) -> None:
    other = tha.InferenceServerClient(srv.http_target)
    assert await other.is_server_live()
    await other.close()
    with pytest.raises(RuntimeError, match="Session is closed"):
        await other.is_server_live()


HTTP_AIO_CALLS: dict[str, Callable[[tha.InferenceServerClient, RunningServer], Awaitable[None]]] = {
    "is_server_live": ha_health, "is_server_ready": ha_health, "is_model_ready": ha_health,
    "get_server_metadata": ha_metadata, "get_model_metadata": ha_metadata, "get_model_config": ha_model_config,
    "infer": ha_infer, "get_inference_statistics": ha_statistics,
    "get_model_repository_index": ha_repository, "unload_model": ha_repository, "load_model": ha_load_with_config,
    "get_system_shared_memory_status": ha_shared_memory, "register_system_shared_memory": ha_shared_memory,
    "unregister_system_shared_memory": ha_shared_memory, "get_cuda_shared_memory_status": ha_shared_memory,
    "register_cuda_shared_memory": ha_shared_memory, "unregister_cuda_shared_memory": ha_shared_memory,
    "get_trace_settings": ha_trace, "update_trace_settings": ha_trace,
    "get_log_settings": ha_log, "update_log_settings": ha_log,
    "generate_request_body": ha_request_body, "parse_response_body": ha_request_body,
    "plugin": ha_plugin, "register_plugin": ha_plugin, "unregister_plugin": ha_plugin, "close": ha_close,
}


# --- gRPC aio -----------------------------------------------------------------------------------------------
async def ga_health(c: tga.InferenceServerClient, srv: RunningServer) -> None:
    assert await c.is_server_live() and await c.is_server_ready() and await c.is_model_ready("echo")
    await _raises(c.is_model_ready("nope"), "Request for unknown model: 'nope' is not found")


async def ga_metadata(c: tga.InferenceServerClient, srv: RunningServer) -> None:
    assert (await c.get_server_metadata()).name == "headroom"
    assert "statistics" in (await c.get_server_metadata(as_json=True))["extensions"]
    model = await c.get_model_metadata("echo", as_json=True)
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "2"]}]
    assert [o.datatype for o in (await c.get_model_metadata("echo", "1")).outputs] == ["FP32", "INT32"]
    await _raises(c.get_model_metadata("nope"), "nope")


async def ga_model_config(c: tga.InferenceServerClient, srv: RunningServer) -> None:
    cfg = (await c.get_model_config("echo", as_json=True))["config"]
    assert cfg["name"] == "echo" and cfg["max_batch_size"] == 16 and cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == "50000"  # proto3 JSON: uint64 as text
    assert (await c.get_model_config("echo")).config.input[0].dims == [2]
    await _raises(c.get_model_config("nope"), "nope")


async def ga_infer(c: tga.InferenceServerClient, srv: RunningServer) -> None:
    result = await c.infer("echo", [_x(tg, X)], outputs=[tg.InferRequestedOutput("y")], request_id="g1")
    np.testing.assert_array_equal(result.as_numpy("y"), X * 2)
    response = result.get_response()
    assert response.id == "g1" and [o.name for o in response.outputs] == ["y"]
    assert response.raw_output_contents[0] == (X * 2).tobytes()  # binary (raw) output contents
    upper = await c.infer("text", [_text(tg)])
    np.testing.assert_array_equal(upper.as_numpy("upper"), np.array([[b"ABC"], [b"\x00X\xff"]], dtype=object))
    await _raises(c.infer("nope", [_x(tg, X)]), "Request for unknown model: 'nope'")


async def ga_stream(c: tga.InferenceServerClient, srv: RunningServer) -> None:
    requests = _requests(*({"model_name": "echo", "inputs": [_x(tg, X + i)], "request_id": f"s{i}"} for i in range(3)),
                         {"model_name": "nope", "inputs": [_x(tg, X)], "request_id": "bad"},  # an error for it only
                         {"model_name": "text", "inputs": [_text(tg)], "request_id": "t"})
    answers = [answer async for answer in c.stream_infer(requests, stream_timeout=60)]
    assert len(answers) == 5
    errors = [e for _, e in answers if e is not None]
    assert len(errors) == 1 and "Request for unknown model: 'nope'" in str(errors[0])
    by_id = {r.get_response().id: r for r, e in answers if e is None}
    assert set(by_id) == {"s0", "s1", "s2", "t"}
    for i in range(3):
        np.testing.assert_array_equal(by_id[f"s{i}"].as_numpy("y"), (X + i) * 2)
    assert by_id["t"].as_numpy("upper").tolist() == [[b"ABC"], [b"\x00X\xff"]]


async def ga_statistics(c: tga.InferenceServerClient, srv: RunningServer) -> None:
    before = (await c.get_inference_statistics("echo", as_json=True))["model_stats"][0]
    for i in range(2):
        await c.infer("echo", [_x(tg, X + i)])
    async for _, error in c.stream_infer(_requests({"model_name": "echo", "inputs": [_x(tg, X)]})):
        assert error is None
    after = (await c.get_inference_statistics("echo", "1", as_json=True))["model_stats"][0]
    _check_response_stats(before, after, 3)  # the stream's request counts as well
    proto = (await c.get_inference_statistics("echo")).model_stats[0]  # the message, not its JSON
    assert proto.response_stats["0"].success.count == int(after["response_stats"]["0"]["success"]["count"])
    assert proto.response_stats["0"].compute_infer.ns > 0 and proto.last_inference > 0
    everything = (await c.get_inference_statistics()).model_stats
    assert {s.name for s in everything} >= {"echo", "text", "cams"}
    await _raises(c.get_inference_statistics("nope"), "nope")


async def ga_repository(c: tga.InferenceServerClient, srv: RunningServer) -> None:
    index = {m.name: m for m in (await c.get_model_repository_index()).models}
    assert index["echo"].state == "READY" and index["echo"].version == "1"
    await c.unload_model("cams")
    await _raises(c.is_model_ready("cams"), "Request for unknown model: 'cams'")
    rows = (await c.get_model_repository_index(as_json=True))["models"]
    assert {m["name"]: m["state"] for m in rows}["cams"] == "UNAVAILABLE"
    await c.load_model("cams", config=json.dumps({"max_batch_size": 4}))
    assert (await c.get_model_config("cams")).config.max_batch_size == 4
    await _raises(c.load_model("cams", config=json.dumps({"max_batch_sise": 4})), "max_batch_sise")
    await c.load_model("cams")
    assert (await c.get_model_config("cams")).config.max_batch_size == 8


async def ga_shared_memory(c: tga.InferenceServerClient, srv: RunningServer) -> None:
    assert not (await c.get_system_shared_memory_status(as_json=True)).get("regions")
    assert not (await c.get_cuda_shared_memory_status(as_json=True)).get("regions")
    err = await _raises(c.register_system_shared_memory("r", "/key", 64), "not supported")
    assert "UNIMPLEMENTED" in str(err.status())
    await _raises(c.register_cuda_shared_memory("r", base64.b64encode(b"handle"), 0, 64), "not supported")
    await c.unregister_system_shared_memory()
    await c.unregister_cuda_shared_memory("r")


async def ga_trace(c: tga.InferenceServerClient, srv: RunningServer) -> None:
    settings = (await c.get_trace_settings(as_json=True))["settings"]
    assert settings["trace_level"]["value"] == ["OFF"]
    assert (await c.get_trace_settings("echo", as_json=True))["settings"] == settings
    updated = await c.update_trace_settings(settings={"trace_level": ["OFF"]}, as_json=True)
    assert updated["settings"] == settings
    await _raises(c.update_trace_settings(settings={"trace_rate": "5"}), "cannot be changed")


async def ga_log(c: tga.InferenceServerClient, srv: RunningServer) -> None:
    assert (await c.get_log_settings(as_json=True))["settings"]["log_info"]["bool_param"] is True
    updated = await c.update_log_settings({"log_info": False}, as_json=True)
    assert updated["settings"]["log_info"]["bool_param"] is False
    assert (await c.update_log_settings({"log_info": True})).settings["log_info"].bool_param is True
    await _raises(c.update_log_settings({"log_format": "ISO8601"}), "log_format")


async def ga_plugin(c: tga.InferenceServerClient, srv: RunningServer) -> None:
    plugin = CountingPlugin("x-request-id", "from-plugin")
    c.register_plugin(plugin)
    assert c.plugin() is plugin
    np.testing.assert_array_equal((await c.infer("echo", [_x(tg, X)])).as_numpy("y"), X * 2)  # header as metadata
    assert plugin.calls == 1
    c.unregister_plugin()
    assert c.plugin() is None
    await c.is_server_live()
    assert plugin.calls == 1


async def ga_close(c: tga.InferenceServerClient, srv: RunningServer) -> None:
    other = tga.InferenceServerClient(srv.grpc_target)
    assert await other.is_server_live()
    await other.close()
    with pytest.raises(grpc.aio.UsageError, match="Channel is closed"):
        await other.is_server_live()


GRPC_AIO_CALLS: dict[str, Callable[[tga.InferenceServerClient, RunningServer], Awaitable[None]]] = {
    "is_server_live": ga_health, "is_server_ready": ga_health, "is_model_ready": ga_health,
    "get_server_metadata": ga_metadata, "get_model_metadata": ga_metadata, "get_model_config": ga_model_config,
    "infer": ga_infer, "stream_infer": ga_stream, "get_inference_statistics": ga_statistics,
    "get_model_repository_index": ga_repository, "load_model": ga_repository, "unload_model": ga_repository,
    "get_system_shared_memory_status": ga_shared_memory, "register_system_shared_memory": ga_shared_memory,
    "unregister_system_shared_memory": ga_shared_memory, "get_cuda_shared_memory_status": ga_shared_memory,
    "register_cuda_shared_memory": ga_shared_memory, "unregister_cuda_shared_memory": ga_shared_memory,
    "get_trace_settings": ga_trace, "update_trace_settings": ga_trace,
    "get_log_settings": ga_log, "update_log_settings": ga_log,
    "plugin": ga_plugin, "register_plugin": ga_plugin, "unregister_plugin": ga_plugin, "close": ga_close,
}


@pytest.mark.parametrize(("cls", "table"), [(tha.InferenceServerClient, HTTP_AIO_CALLS),
                                             (tga.InferenceServerClient, GRPC_AIO_CALLS)], ids=["http", "grpc"])
def test_every_public_aio_method_is_tested_or_listed(cls: type, table: dict[str, object]) -> None:
    untested = _public(cls) - set(table) - set(NOT_APPLICABLE)
    assert not untested, f"tritonclient aio methods with no conformance test: {sorted(untested)}"
    assert not set(table) - _public(cls), "the table names methods the client does not have"


HTTP_CHECKS = sorted(set(HTTP_AIO_CALLS.values()), key=lambda f: f.__name__)
GRPC_CHECKS = sorted(set(GRPC_AIO_CALLS.values()), key=lambda f: f.__name__)


@pytest.mark.parametrize("check", HTTP_CHECKS, ids=[f.__name__ for f in HTTP_CHECKS])
async def test_http_aio_client(explicit: RunningServer,
                               check: Callable[[tha.InferenceServerClient, RunningServer], Awaitable[None]]) -> None:
    client = tha.InferenceServerClient(explicit.http_target)
    try:
        await check(client, explicit)
    finally:
        await client.close()
    assert explicit.alive()


@pytest.mark.parametrize("check", GRPC_CHECKS, ids=[f.__name__ for f in GRPC_CHECKS])
async def test_grpc_aio_client(explicit: RunningServer,
                               check: Callable[[tga.InferenceServerClient, RunningServer], Awaitable[None]]) -> None:
    client = tga.InferenceServerClient(explicit.grpc_target)
    try:
        await check(client, explicit)
    finally:
        await client.close()
    assert explicit.alive()
