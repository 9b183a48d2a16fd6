"""Triton's HTTP extensions beside the KServe V2 core: model configuration, the model repository (index, load
with a `config` override, unload), shared-memory registration, trace and log settings.

Handlers only translate JSON to calls on the data plane, the model manager and `TritonSettings` (shared with
the gRPC servicer); errors come from the error tree like every other route.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from headroom.core.errors import InvalidRequest, NotReady
from headroom.protocol.triton_config import triton_model_config
from headroom.server.dataplane import DataPlane
from headroom.server.model_manager import ModelManager
from headroom.server.triton_settings import TritonSettings, json_object, load_parameters


def _json(payload: object, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


async def _body(request: Request, limit_bytes: int = 16 * 1024 * 1024) -> dict[str, object]:
    raw = await request.body()
    if len(raw) > limit_bytes:
        raise InvalidRequest(f"request body over {limit_bytes} bytes")
    return json_object(raw, "the request body")


class TritonApi:
    """Route handlers for Triton's extensions, bound to one data plane, manager and settings."""

    def __init__(self, dataplane: DataPlane, manager: ModelManager | None, settings: TritonSettings) -> None:
        self.dp = dataplane
        self.manager = manager
        self.settings = settings

    def require_manager(self) -> ModelManager:
        if self.manager is None:
            raise NotReady("this server was started without a model repository manager")
        return self.manager

    async def model_config(self, request: Request) -> Response:
        p = request.path_params
        return _json(triton_model_config(self.dp.model_config(p["model"], p.get("version", ""))))

    async def repository_index(self, request: Request) -> Response:
        body = await _body(request) if request.method == "POST" else {}
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidRequest(f"'ready' must be true or false, got {ready!r}")
        return _json(self.require_manager().index(ready_only=ready))

    async def repository_load(self, request: Request) -> Response:
        override = load_parameters((await _body(request)).get("parameters"))
        await self.require_manager().load(request.path_params["model"], override)
        return _json({})

    async def repository_unload(self, request: Request) -> Response:
        params = (await _body(request)).get("parameters") or {}
        if not isinstance(params, dict) or set(params) - {"unload_dependents"}:
            raise InvalidRequest(f"unload parameters: only 'unload_dependents' is known, got {params!r}")
        await self.require_manager().unload(request.path_params["model"])
        return _json({})

    # --- shared memory: status lists no regions; registration is refused (Unsupported, 400) -------------
    async def shm_status(self, request: Request) -> Response:
        kind = request.path_params["kind"]
        return _json(self.settings.shm_status(kind, request.path_params.get("region", "")))

    async def shm_register(self, request: Request) -> Response:
        self.settings.shm_register(request.path_params["kind"], request.path_params["region"])
        return _json({})

    async def shm_unregister(self, request: Request) -> Response:
        return _json({})  # nothing is ever registered: unregistering any (or all) regions succeeds, as Triton

    # --- trace and log settings ------------------------------------------------------------------------
    async def trace_setting(self, request: Request) -> Response:
        if request.method == "POST":
            return _json(self.settings.update_trace(await _body(request), request.path_params.get("model", "")))
        return _json(self.settings.trace(request.path_params.get("model", "")))

    async def log_settings(self, request: Request) -> Response:
        if request.method == "POST":
            return _json(self.settings.update_log(await _body(request)))
        return _json(self.settings.log())

    def routes(self) -> list[BaseRoute]:
        r = Route
        shm = "/v2/{kind:str}sharedmemory"
        return [
            r("/v2/models/{model}/config", self.model_config, methods=["GET"]),
            r("/v2/models/{model}/versions/{version}/config", self.model_config, methods=["GET"]),
            r("/v2/repository/index", self.repository_index, methods=["GET", "POST"]),
            r("/v2/repository/models/{model}/load", self.repository_load, methods=["POST"]),
            r("/v2/repository/models/{model}/unload", self.repository_unload, methods=["POST"]),
            r(f"{shm}/status", self.shm_status, methods=["GET"]),
            r(f"{shm}/region/{{region}}/status", self.shm_status, methods=["GET"]),
            r(f"{shm}/region/{{region}}/register", self.shm_register, methods=["POST"]),
            r(f"{shm}/unregister", self.shm_unregister, methods=["POST"]),
            r(f"{shm}/region/{{region}}/unregister", self.shm_unregister, methods=["POST"]),
            r("/v2/trace/setting", self.trace_setting, methods=["GET", "POST"]),
            r("/v2/models/{model}/trace/setting", self.trace_setting, methods=["GET", "POST"]),
            r("/v2/logging", self.log_settings, methods=["GET", "POST"]),
        ]


__all__ = ["TritonApi"]
