"""config.yaml -> Triton's model-config schema, and Triton `config` overrides applied or refused."""

from __future__ import annotations

import pytest

from headroom.core.errors import InvalidRequest
from headroom.models.config import ModelConfig, parse_model_config
from headroom.protocol.triton_config import apply_config_override, triton_model_config, triton_model_config_proto


def _config(**extra: object) -> ModelConfig:
    raw = {"backend": "python", "max_batch_size": 8, "inputs": [{"name": "a", "datatype": "BYTES", "shape": [-1]}],
           "outputs": [{"name": "b", "datatype": "FP16", "shape": [3]}],
           "dynamic_batching": {"max_queue_delay_ms": 2.5, "preferred_batch_sizes": [4, 8]}, **extra}
    return parse_model_config(raw, "m")


def test_schema_maps_types_units_and_instances() -> None:
    out = triton_model_config(_config(instances=3))
    assert out["input"][0]["data_type"] == "TYPE_STRING" and out["output"][0]["data_type"] == "TYPE_FP16"
    assert out["input"][0]["dims"] == [-1] and out["output"][0]["dims"] == [3]
    assert out["dynamic_batching"]["max_queue_delay_microseconds"] == 2500
    assert out["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert out["instance_group"][0]["count"] == 3
    assert out["version_policy"] == {"latest": {"num_versions": 1}}
    proto = triton_model_config_proto(_config())
    assert proto.max_batch_size == 8 and proto.dynamic_batching.max_queue_delay_microseconds == 2500


def test_no_batching_means_no_dynamic_batching() -> None:
    assert "dynamic_batching" not in triton_model_config(_config(max_batch_size=0, dynamic_batching=None))


def test_a_fetched_config_sent_back_with_changes_is_applied() -> None:
    cfg = _config()
    override = triton_model_config(cfg)
    override["max_batch_size"] = 16
    override["dynamic_batching"]["preferred_batch_size"] = [16]
    override["dynamic_batching"]["max_queue_delay_microseconds"] = 100
    override["dynamic_batching"]["default_queue_policy"]["max_queue_size"] = 9
    override["instance_group"] = [{"kind": "KIND_CPU", "count": 2}, {"count": 1}]
    override["version_policy"] = {"specific": {"versions": [1, 3]}}
    out = apply_config_override(cfg, override)
    assert out.max_batch_size == 16 and out.batching.preferred_batch_sizes == (16,)
    assert out.batching.max_queue_delay_ms == 0.1 and out.batching.max_queue_size == 9
    assert out.instances == 3 and out.version_policy.versions == (1, 3)
    assert apply_config_override(cfg, triton_model_config(cfg)) == cfg  # the unchanged config changes nothing


@pytest.mark.parametrize(("override", "needle"), [
    ({"backend": "tensorrt"}, "'backend' cannot be changed"),
    ({"max_batch_sise": 8}, "'max_batch_sise'"),
    ({"name": "other"}, "differs from the model"),
    ({"max_batch_size": 0}, "cannot switch between batching"),
    ({"max_batch_size": 2}, "exceeds max_batch_size"),
    ({"dynamic_batching": {"preserve_ordering": True}}, "dynamic_batching.preserve_ordering"),
    ({"instance_group": [{"kind": "KIND_GPU", "count": 1}]}, "KIND_GPU"),
    ({"instance_group": [{"count": 0}]}, "count must be an integer >= 1"),
    ({"input": []}, "'input' cannot be changed"),
    ("not an object", "JSON object"),
])
def test_what_cannot_apply_is_refused_by_name(override: object, needle: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        apply_config_override(_config(), override)
    assert needle in info.value.message
