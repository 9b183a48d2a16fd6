"""The OpenAPI 3.1 document served at /openapi.json (hand-written: the handlers take raw bodies)."""

from __future__ import annotations

from typing import Any

from headroom import __version__

_ERROR = {"type": "object", "required": ["error"],
          "properties": {"error": {"type": "string"}, "reason": {"type": "string"}}}
_OPENAI_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
_TENSOR_META = {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
    "name": {"type": "string"}, "datatype": {"type": "string"},
    "shape": {"type": "array", "items": {"type": "integer"}}}}
_TENSOR = {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
    "name": {"type": "string"}, "datatype": {"type": "string",
                                             "enum": ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8",
                                                      "INT16", "INT32", "INT64", "FP16", "FP32", "FP64",
                                                      "BYTES"]},
    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    "parameters": {"type": "object"}, "data": {"type": "array"}}}
_INFER_REQUEST = {"type": "object", "required": ["inputs"], "properties": {
    "id": {"type": "string"}, "parameters": {"type": "object"},
    "inputs": {"type": "array", "items": _TENSOR},
    "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "parameters": {"type": "object"}}}}}}
_BINARY = {"type": "string", "format": "binary"}
_INFER_RESPONSE = {"type": "object", "required": ["model_name", "outputs"], "properties": {
    "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
    "parameters": {"type": "object"}, "outputs": {"type": "array", "items": _TENSOR}}}


def _errors(*codes: int, openai: bool = False) -> dict[str, Any]:
    schema = _OPENAI_ERROR if openai else _ERROR
    return {str(c): {"description": "error", "content": {"application/json": {"schema": schema}}}
            for c in codes}


def _ok(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"200": {"description": description, "content": {"application/json": {"schema": schema}}}}


def _param(name: str, where: str, schema: dict[str, Any], required: bool = False) -> dict[str, Any]:
    """A parameter object: `where` is path, query or header."""
    return {"name": name, "in": where, "required": required, "schema": schema}


def _body(schemas: dict[str, dict[str, Any]], required: bool = True) -> dict[str, Any]:
    """A requestBody object taking each media type in `schemas` with its schema."""
    return {"required": required, "content": {media: {"schema": schema} for media, schema in schemas.items()}}


def _model_params(with_version: bool) -> list[dict[str, Any]]:
    names = ("model", "version") if with_version else ("model",)
    return [_param(name, "path", {"type": "string"}, required=True) for name in names]


def _model_paths(prefix: str, with_version: bool) -> dict[str, Any]:
    params = _model_params(with_version)
    meta = {"type": "object", "required": ["name", "versions", "platform", "inputs", "outputs"], "properties": {
        "name": {"type": "string"}, "versions": {"type": "array", "items": {"type": "string"}},
        "platform": {"type": "string"}, "inputs": {"type": "array", "items": _TENSOR_META},
        "outputs": {"type": "array", "items": _TENSOR_META}}}
    ready = {"type": "object", "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}}
    return {
        prefix: {"get": {"summary": "Model metadata", "parameters": params,
                         "responses": {**_ok(meta), **_errors(400, 404)}}},
        f"{prefix}/ready": {"get": {"summary": "Model readiness", "parameters": params,
                                    "responses": {**_ok(ready), **_errors(400, 404, 503)}}},
        f"{prefix}/stats": {"get": {"summary": "Model statistics (V2 statistics extension)", "parameters": params,
                                    "responses": {**_ok({"type": "object"}), **_errors(400, 404)}}},
        f"{prefix}/classify": {"post": {
            "summary": "Raw PNG/JPEG image → top-k labelled predictions (image classifiers)",
            "parameters": [*params, _param("top_k", "query", {"type": "integer", "minimum": 1}),
                           _param("min_confidence", "query", {"type": "number", "minimum": 0, "maximum": 1})],
            "requestBody": _body({"image/png": _BINARY, "image/jpeg": _BINARY}),
            "responses": {**_ok({"type": "object", "properties": {
                "predictions": {"type": "array"}, "model_version": {"type": "string"},
                "inference_time_ms": {"type": "number"}}}), **_errors(400, 404, 413, 503, 504)},
        }},
        f"{prefix}/config": {"get": {"summary": "Model configuration in Triton's schema", "parameters": params,
                                     "responses": {**_ok({"type": "object"}), **_errors(400, 404)}}},
        f"{prefix}/generate": {"post": _generate("Generate text (Triton's generate extension)", params)},
        f"{prefix}/generate_stream": {"post": _generate("Generate text as server-sent events", params,
                                                        "text/event-stream")},
        f"{prefix}/infer": {"post": {
            "summary": "Inference (JSON tensors, or the binary tensor data extension)",
            "parameters": [*params,
                           _param("Inference-Header-Content-Length", "header", {"type": "integer", "minimum": 0}),
                           _param("X-Request-Timeout-Ms", "header", {"type": "number", "exclusiveMinimum": 0})],
            "requestBody": _body({"application/json": _INFER_REQUEST, "application/octet-stream": _BINARY}),
            "responses": {**_ok(_INFER_RESPONSE), **_errors(400, 404, 413, 422, 429, 503, 504)},
        }},
    }


def _generate(summary: str, params: list[dict[str, Any]], media: str = "application/json") -> dict[str, Any]:
    body = {"type": "object", "required": ["text_input"], "properties": {
        "text_input": {"type": "string"}, "parameters": {"type": "object"}}}
    ok = {"200": {"description": "OK", "content": {media: {"schema": {"type": "object"} if media.endswith("json")
                                                            else {"type": "string"}}}}}
    return {"summary": summary, "parameters": params,
            "requestBody": _body({"application/json": body}),
            "responses": {**ok, **_errors(400, 404, 413, 429, 503, 504)}}


def _triton_paths() -> dict[str, Any]:
    """Triton's extensions beside the V2 core: repository, shared memory, trace and log settings."""
    obj = {"type": "object"}
    load_body = {"type": "object", "properties": {"parameters": {"type": "object", "properties": {
        "config": {"type": "string", "description": "Triton model-config JSON, applied or refused"}}}}}
    admin = _errors(400, 401, 403, 404, 503)  # 503: --model-control-mode none|poll refuses (Triton's error)
    region = [_param("kind", "path", {"enum": ["system", "cuda"]}, required=True),
              _param("region", "path", {"type": "string"}, required=True)]
    paths: dict[str, Any] = {
        "/v2/repository/index": {
            "post": {"summary": "Model repository index ({\"ready\": true} keeps READY models)",
                     "requestBody": _body({"application/json": {
                         "type": "object", "properties": {"ready": {"type": "boolean"}}}}, required=False),
                     "responses": {**_ok({"type": "array"}), **_errors(400, 500)}},
            "get": {"summary": "Model repository index", "responses": {**_ok({"type": "array"}), **_errors(500)}}},
        "/v2/repository/models/{model}/load": {"post": {
            "summary": "Load or reload a model, optionally with a config override (explicit model control)",
            "parameters": _model_params(False),
            "requestBody": _body({"application/json": load_body}, required=False),
            "responses": {**_ok(obj), **admin}}},
        "/v2/repository/models/{model}/unload": {"post": {
            "summary": "Unload a model (explicit model control; admin when authentication is on)",
            "parameters": _model_params(False), "responses": {**_ok(obj), **admin}}},
        "/v2/{kind}sharedmemory/status": {"get": {
            "summary": "Registered shared-memory regions (none: headroom takes tensors in the request)",
            "parameters": region[:1], "responses": {**_ok({"type": "array"}), **_errors(400)}}},
        "/v2/{kind}sharedmemory/region/{region}/register": {"post": {
            "summary": "Register a region: refused (400), shared memory is not supported",
            "parameters": region, "responses": {**_ok(obj), **_errors(400)}}},
        "/v2/{kind}sharedmemory/region/{region}/unregister": {"post": {
            "summary": "Unregister a region", "parameters": region, "responses": {**_ok(obj), **_errors(400)}}},
        "/v2/logging": {"get": {"summary": "Log settings", "responses": _ok(obj)},
                        "post": {"summary": "Update log settings", "responses": {**_ok(obj), **_errors(400)}}},
        "/v2/trace/setting": {"get": {"summary": "Trace settings", "responses": _ok(obj)},
                              "post": {"summary": "Update trace settings (only to the current values)",
                                       "responses": {**_ok(obj), **_errors(400)}}},
    }
    return paths


def openapi_document() -> dict[str, Any]:
    """The document; built on demand (cheap) so it never drifts from the version string."""
    flag = {"type": "object"}
    paths: dict[str, Any] = {
        "/v2": {"get": {"summary": "Server metadata", "responses": _ok({"type": "object", "properties": {
            "name": {"type": "string"}, "version": {"type": "string"},
            "extensions": {"type": "array", "items": {"type": "string"}}}})}},
        "/v2/health/live": {"get": {"summary": "Liveness", "responses": _ok(flag)}},
        "/v2/health/ready": {"get": {"summary": "Readiness",
                                     "responses": {**_ok(flag), "503": {"description": "not ready"}}}},
        **_model_paths("/v2/models/{model}", False),
        **_model_paths("/v2/models/{model}/versions/{version}", True),
        "/v1/models": {"get": {"summary": "OpenAI-compatible model list", "responses": _ok(flag)}},
        "/v1/embeddings": {"post": {
            "summary": "OpenAI-compatible embeddings",
            "requestBody": _body({"application/json": {
                "type": "object", "required": ["input"], "properties": {
                    "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
                    "model": {"type": "string"}, "encoding_format": {"enum": ["float", "base64"]},
                    "dimensions": {"type": "integer", "minimum": 1}, "user": {"type": "string"}},
                "additionalProperties": False}}),
            "responses": {**_ok(flag), **_errors(400, 404, 413, 503, 504, openai=True)}}},
        "/v2/models/stats": {"get": {"summary": "Statistics of every model",
                                     "responses": _ok({"type": "object"})}},
        **_triton_paths(),
        "/metrics": {"get": {"summary": "Prometheus metrics",
                             "responses": {"200": {"description": "text exposition format"}}}},
    }
    return {"openapi": "3.1.0", "info": {"title": "headroom", "version": __version__},
            "paths": paths}
