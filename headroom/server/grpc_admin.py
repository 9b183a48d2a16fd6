"""Triton's admin RPCs of `inference.GRPCInferenceService`, over the same objects as the HTTP extensions
(server/triton_routes.py): ModelConfig, ModelStatistics, RepositoryIndex / RepositoryModelLoad /
RepositoryModelUnload, System/CudaSharedMemory{Status,Register,Unregister}, TraceSetting, LogSettings.

Plugged into the gRPC server as an `admin` servicer (protocol/grpc_service.py): errors are HeadroomErrors,
which that module maps to gRPC status codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from google.protobuf import json_format

from headroom.protocol.generated import headroom_inference_pb2 as pb
from headroom.protocol.triton_config import triton_model_config_proto
from headroom.server.triton_routes import TritonApi
from headroom.server.triton_settings import load_parameters

R = TypeVar("R")


def _settings_value(value: Any) -> object:
    which = value.WhichOneof("parameter_choice")
    return None if which is None else getattr(value, which)


class TritonAdminServicer:
    """The admin RPCs; each is `async (request message, context) -> response message`."""

    def __init__(self, api: TritonApi) -> None:
        self._dp = api.dp
        self._api = api
        self._settings = api.settings

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        cfg = self._dp.model_config(request.name, request.version)
        return pb.ModelConfigResponse(config=triton_model_config_proto(cfg))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              context: Any) -> pb.ModelStatisticsResponse:
        response = pb.ModelStatisticsResponse()
        json_format.ParseDict({"model_stats": self._dp.model_stats(request.name, request.version)}, response,
                              ignore_unknown_fields=True)  # headroom's queue_depth / cold_start are HTTP-only
        return response

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        rows = self._api.require_manager().index(ready_only=request.ready)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**row) for row in rows])

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: Any) -> pb.RepositoryModelLoadResponse:
        params: Mapping[str, object] = {k: _settings_value(v) for k, v in request.parameters.items()}
        await self._api.require_manager().load(request.model_name, load_parameters(params or None))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: Any) -> pb.RepositoryModelUnloadResponse:
        await self._api.require_manager().unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # --- shared memory: the six RPCs, one pair of kinds (system, cuda) ----------------------------------
    async def _shm(self, kind: str, action: str, region: str, response: type[R]) -> R:
        if action == "status":
            self._settings.shm_status(kind, region)
        elif action == "register":
            self._settings.shm_register(kind, region)  # refused: shared memory is not supported
        return response()  # status: no regions; unregister: nothing is ever registered

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> pb.SystemSharedMemoryStatusResponse:
        return await self._shm("system", "status", request.name, pb.SystemSharedMemoryStatusResponse)

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> pb.SystemSharedMemoryRegisterResponse:
        return await self._shm("system", "register", request.name, pb.SystemSharedMemoryRegisterResponse)

    async def SystemSharedMemoryUnregister(self, request: Any,
                                           context: Any) -> pb.SystemSharedMemoryUnregisterResponse:
        return await self._shm("system", "unregister", request.name, pb.SystemSharedMemoryUnregisterResponse)

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> pb.CudaSharedMemoryStatusResponse:
        return await self._shm("cuda", "status", request.name, pb.CudaSharedMemoryStatusResponse)

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> pb.CudaSharedMemoryRegisterResponse:
        return await self._shm("cuda", "register", request.name, pb.CudaSharedMemoryRegisterResponse)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> pb.CudaSharedMemoryUnregisterResponse:
        return await self._shm("cuda", "unregister", request.name, pb.CudaSharedMemoryUnregisterResponse)

    # --- trace and log settings ------------------------------------------------------------------------
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        if request.model_name:
            self._dp.model_config(request.model_name)  # 404 for an unknown model
        wanted = {k: list(v.value) or None for k, v in request.settings.items()}
        current = (self._settings.update_trace(wanted, request.model_name) if wanted
                   else self._settings.trace(request.model_name))
        value = pb.TraceSettingResponse.SettingValue
        return pb.TraceSettingResponse(settings={
            k: value(value=v if isinstance(v, list) else [str(v)]) for k, v in current.items()})

    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        wanted = {k: _settings_value(v) for k, v in request.settings.items()}
        current = self._settings.update_log(wanted) if wanted else self._settings.log()
        value = pb.LogSettingsResponse.SettingValue
        settings = {}
        for key, v in current.items():
            settings[key] = (value(bool_param=v) if isinstance(v, bool) else value(uint32_param=v)
                             if isinstance(v, int) else value(string_param=str(v)))
        return pb.LogSettingsResponse(settings=settings)


__all__ = ["TritonAdminServicer"]
