"""A model's config.yaml in Triton's model-configuration schema, and a Triton config override applied to it.

`triton_model_config(cfg)` is what `GET /v2/models/{m}/config` and gRPC `ModelConfig` return (Triton's JSON
config: `name`, `platform`, `backend`, `max_batch_size`, `input`/`output` with `data_type: TYPE_FP32` and
`dims`, `dynamic_batching {preferred_batch_size, max_queue_delay_microseconds, default_queue_policy}`,
`instance_group`, `version_policy`, `parameters`; an LLM is `decoupled` with its optional ModelInfer inputs).
Unit conversions are exact: milliseconds ×1000.

`apply_config_override(cfg, override)` is the `config` parameter of a repository load. Triton's override is
a whole config; here each top-level key is either one headroom can apply (`max_batch_size`,
`dynamic_batching`'s delay / preferred sizes / priority levels / queue policy, `instance_group` counts,
`version_policy`) or must equal what `triton_model_config` reports for it (so a config fetched with
`get_model_config` can be sent back with a change). Anything else is refused with InvalidRequest naming the
key: an override is applied or refused, never ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from headroom.core.errors import InvalidRequest
from headroom.models.config import ModelConfig, VersionPolicy
from headroom.protocol.generated import headroom_model_config_pb2 as mc

#: V2 datatype -> Triton's DataType enum name (BYTES is TYPE_STRING in Triton's config).
TRITON_TYPES: Mapping[str, str] = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64", "BF16": "TYPE_BF16",
    "BYTES": "TYPE_STRING",
}


#: the LLM's optional inputs on ModelInfer (headroom.llm.grpc_generate), besides `text_input`.
LLM_OPTIONAL_INPUTS = (("sampling_parameters", "BYTES"), ("stream", "BOOL"), ("max_tokens", "INT32"))


def _tensor_input(name: str, datatype: str, dims: list[int], optional: bool) -> dict[str, Any]:
    return {"name": name, "data_type": TRITON_TYPES[datatype], "format": "FORMAT_NONE", "dims": dims,
            "is_shape_tensor": False, "allow_ragged_batch": False, "optional": optional}


def _parameter(value: object) -> dict[str, str]:
    text = value if isinstance(value, str) else ",".join(map(str, value)) if isinstance(value, list | tuple) else (
        str(value).lower() if isinstance(value, bool) else str(value))
    return {"string_value": text}


def _version_policy(policy: VersionPolicy) -> dict[str, object]:
    if policy.kind == "all":
        return {"all": {}}
    if policy.kind == "specific":
        return {"specific": {"versions": list(policy.versions)}}
    return {"latest": {"num_versions": policy.num_versions}}


def triton_model_config(cfg: ModelConfig) -> dict[str, Any]:
    """The model's configuration in Triton's JSON schema (what tritonclient's get_model_config returns)."""
    b = cfg.batching
    out: dict[str, Any] = {
        "name": cfg.name,
        "platform": cfg.platform,
        "backend": cfg.backend,
        "version_policy": _version_policy(cfg.version_policy),
        "max_batch_size": cfg.max_batch_size,
        "input": [_tensor_input(t.name, t.datatype, list(t.shape), False) for t in cfg.inputs],
        "output": [{"name": t.name, "data_type": TRITON_TYPES[t.datatype], "dims": list(t.shape),
                    "label_filename": "", "is_shape_tensor": False} for t in cfg.outputs],
        "instance_group": [{"name": f"{cfg.name}_0", "kind": "KIND_CPU", "count": cfg.instances, "gpus": [],
                            "profile": [], "passive": False, "host_policy": ""}],
        "parameters": {k: _parameter(v) for k, v in sorted(cfg.parameters.items())},
        "model_warmup": [],
    }
    if cfg.backend == "llm":  # streamed as Triton's decoupled models (one response per token chunk)
        out["model_transaction_policy"] = {"decoupled": True}
        out["input"] += [_tensor_input(name, datatype, [1], True) for name, datatype in LLM_OPTIONAL_INPUTS
                         if all(t.name != name for t in cfg.inputs)]
    if cfg.max_batch_size > 0:
        out["dynamic_batching"] = {
            "preferred_batch_size": list(b.preferred_batch_sizes),
            "max_queue_delay_microseconds": round(b.max_queue_delay_ms * 1000),
            "preserve_ordering": False,
            "priority_levels": b.priority_levels if b.priority_levels > 1 else 0,
            "default_priority_level": b.priority_levels if b.priority_levels > 1 else 0,
            "default_queue_policy": {"timeout_action": "REJECT", "allow_timeout_override": True,
                                     "default_timeout_microseconds": round(b.default_timeout_ms * 1000),
                                     "max_queue_size": b.max_queue_size},
            "priority_queue_policy": {},
        }
        out["parameters"]["headroom_batching_mode"] = {"string_value": b.mode}
    return out


def triton_model_config_proto(cfg: ModelConfig) -> mc.ModelConfig:
    """The same configuration as the `inference.ModelConfig` protobuf (gRPC ModelConfig)."""
    message = mc.ModelConfig()
    json_format.ParseDict(triton_model_config(cfg), message)
    return message


def _int(value: object, where: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidRequest(f"config override: {where} must be an integer >= {minimum}, got {value!r}")
    return value


def _batching(cfg: ModelConfig, override: object, current: Mapping[str, Any]) -> ModelConfig:
    if not isinstance(override, Mapping):
        raise InvalidRequest("config override: dynamic_batching must be an object")
    b = cfg.batching
    changes: dict[str, Any] = {}
    for key, value in override.items():
        if key == "max_queue_delay_microseconds":
            changes["max_queue_delay_ms"] = _int(value, f"dynamic_batching.{key}", 0) / 1000
        elif key == "preferred_batch_size":
            if not isinstance(value, list):
                raise InvalidRequest("config override: dynamic_batching.preferred_batch_size must be a list")
            sizes = tuple(_int(v, f"dynamic_batching.{key}[]", 1) for v in value)
            if any(s > max(cfg.max_batch_size, 1) for s in sizes):
                raise InvalidRequest(f"config override: preferred_batch_size {list(sizes)} exceeds "
                                     f"max_batch_size {cfg.max_batch_size}")
            changes["preferred_batch_sizes"] = sizes
        elif key == "priority_levels":
            changes["priority_levels"] = max(1, _int(value, f"dynamic_batching.{key}", 0))
        elif key == "default_queue_policy" and isinstance(value, Mapping):
            for sub, v in value.items():
                if sub == "max_queue_size":
                    changes["max_queue_size"] = _int(v, f"dynamic_batching.{key}.{sub}", 1)
                elif sub == "default_timeout_microseconds":
                    changes["default_timeout_ms"] = _int(v, f"dynamic_batching.{key}.{sub}", 1) / 1000
                elif v != current.get(key, {}).get(sub):
                    raise InvalidRequest(f"config override: dynamic_batching.{key}.{sub} cannot be changed "
                                         "in headroom (applied: max_queue_size, default_timeout_microseconds)")
        elif value != current.get(key):
            raise InvalidRequest(
                f"config override: dynamic_batching.{key} cannot be changed in headroom (applied: "
                "preferred_batch_size, max_queue_delay_microseconds, priority_levels, default_queue_policy)")
    return dataclasses.replace(cfg, batching=dataclasses.replace(b, **changes))


def _instances(cfg: ModelConfig, override: object) -> ModelConfig:
    if not isinstance(override, list) or not override:
        raise InvalidRequest("config override: instance_group must be a non-empty list")
    count = 0
    for group in override:
        if not isinstance(group, Mapping):
            raise InvalidRequest("config override: each instance_group entry must be an object")
        if group.get("kind", "KIND_CPU") not in ("KIND_CPU", "KIND_AUTO"):
            raise InvalidRequest(f"config override: instance_group kind {group.get('kind')!r} is not "
                                 "available; headroom runs tensor models on CPU (KIND_CPU)")
        count += _int(group.get("count", 1), "instance_group[].count", 1)
    return dataclasses.replace(cfg, instances=count)


def _policy(cfg: ModelConfig, override: object) -> ModelConfig:
    if not isinstance(override, Mapping) or len(override) != 1:
        raise InvalidRequest("config override: version_policy must be one of {latest}, {all} or {specific}")
    kind, body = next(iter(override.items()))
    body = body if isinstance(body, Mapping) else {}
    if kind == "latest":
        policy = VersionPolicy("latest", _int(body.get("num_versions", 1), "version_policy.latest", 1))
    elif kind == "specific":
        versions = body.get("versions")
        if not isinstance(versions, list) or not versions:
            raise InvalidRequest("config override: version_policy.specific.versions must be a non-empty list")
        policy = VersionPolicy("specific", versions=tuple(_int(v, "version_policy.specific", 0) for v in versions))
    elif kind == "all":
        policy = VersionPolicy("all")
    else:
        raise InvalidRequest(f"config override: unknown version_policy {kind!r}")
    return dataclasses.replace(cfg, version_policy=policy)


def apply_config_override(cfg: ModelConfig, override: object) -> ModelConfig:
    """`cfg` changed as Triton's `config` override asks; InvalidRequest naming any key that cannot apply."""
    if not isinstance(override, Mapping):
        raise InvalidRequest("config override must be a JSON object in Triton's model-config schema")
    current = triton_model_config(cfg)
    if override.get("name", cfg.name) != cfg.name:
        raise InvalidRequest(f"config override: name {override.get('name')!r} differs from the model "
                             f"'{cfg.name}' being loaded")
    out = cfg
    if "max_batch_size" in override:
        size = _int(override["max_batch_size"], "max_batch_size", 0)
        if (size == 0) != (cfg.max_batch_size == 0):
            raise InvalidRequest("config override: max_batch_size cannot switch between batching (> 0) and "
                                 "not batching (0); the model's tensor shapes depend on it")
        out = dataclasses.replace(out, max_batch_size=size)
    for key, value in override.items():
        if key in ("name", "max_batch_size"):
            continue
        if key == "dynamic_batching":
            if out.max_batch_size == 0:
                raise InvalidRequest("config override: dynamic_batching needs max_batch_size > 0")
            out = _batching(out, value, current.get(key, {}))
        elif key == "instance_group":
            out = _instances(out, value)
        elif key == "version_policy":
            out = _policy(out, value)
        elif value != current.get(key):
            raise InvalidRequest(
                f"config override: '{key}' cannot be changed at load in headroom (applied: max_batch_size, "
                "dynamic_batching, instance_group, version_policy; other keys must equal the current config)")
    if any(s > max(out.max_batch_size, 1) for s in out.batching.preferred_batch_sizes):
        raise InvalidRequest(f"config override: preferred_batch_size {list(out.batching.preferred_batch_sizes)} "
                             f"exceeds max_batch_size {out.max_batch_size}")
    return out


__all__ = ["TRITON_TYPES", "apply_config_override", "triton_model_config", "triton_model_config_proto"]
