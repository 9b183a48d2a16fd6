"""Config additions owned by headroom.models: version policies and default warmup inputs."""

from __future__ import annotations

import numpy as np
import pytest

from headroom.models.base import Model
from headroom.models.config import VersionPolicy, parse_model_config

BASE = {
    "backend": "python",
    "max_batch_size": 4,
    "inputs": [
        {"name": "pixels", "datatype": "UINT8", "shape": [2, -1]},
        {"name": "text", "datatype": "BYTES", "shape": [1]},
    ],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}],
}


@pytest.mark.parametrize(
    ("raw", "available", "selected"),
    [
        (None, (1, 2, 5), (5,)),
        ({"latest": 2}, (5, 1, 2), (2, 5)),
        ({"all": {}}, (3, 1), (1, 3)),
        ({"specific": [1, 4]}, (1, 2, 3), (1,)),
    ],
)
def test_version_policies_select_versions(raw: object, available: tuple[int, ...], selected: tuple[int, ...]) -> None:
    config = parse_model_config({**BASE, "version_policy": raw} if raw else BASE, "m")
    assert config.version_policy.select(available) == selected


@pytest.mark.parametrize("raw", [{"latest": 0}, {"specific": []}, {"newest": 1}, {"all": {}, "latest": 1}])
def test_bad_version_policy_names_the_key(raw: object) -> None:
    with pytest.raises(ValueError, match=r"m/config.yaml.version_policy"):
        parse_model_config({**BASE, "version_policy": raw}, "m", "m/config.yaml")


def test_default_policy_is_latest_one() -> None:
    assert parse_model_config(BASE, "m").version_policy == VersionPolicy("latest", 1, ())


def test_default_warmup_inputs_follow_the_declared_specs() -> None:
    model = Model(parse_model_config(BASE, "m"))
    inputs = model.warmup_inputs(3)
    assert inputs["pixels"].shape == (3, 2, 1) and inputs["pixels"].dtype == np.uint8
    assert inputs["text"].shape == (3, 1) and inputs["text"][0, 0] == b"warmup"


def test_non_batching_model_warmup_has_no_batch_dimension() -> None:
    model = Model(parse_model_config({**BASE, "max_batch_size": 0}, "m"))
    assert model.warmup_inputs(1)["pixels"].shape == (2, 1)


@pytest.mark.parametrize(("patch", "needle"), [
    ({"max_batch_sise": 8}, "unknown key 'max_batch_sise'; did you mean 'max_batch_size'?"),
    ({"input": []}, "unknown key 'input'; did you mean 'inputs'?"),
    ({"dynamic_batching": {"max_queue_delay": 2}}, "dynamic_batching: unknown key 'max_queue_delay'; did you mean "
                                                   "'max_queue_delay_ms'?"),
    ({"warmup": {"batch_size": [1]}}, "warmup: unknown key 'batch_size'; did you mean 'batch_sizes'?"),
    ({"outputs": [{"name": "y", "datatype": "FP32", "shape": [1], "dtype": "x"}]}, "outputs[0]: unknown key 'dtype'"),
    ({"zzz": 1}, "unknown key 'zzz' (known: backend,"),
])
def test_unknown_keys_are_refused_with_a_did_you_mean(patch: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_model_config({**BASE, **patch}, "m")
    assert needle in str(info.value)


def test_batch_key_is_the_non_batch_dims_except_ragged_inputs() -> None:
    inputs = [{**BASE["inputs"][0], "allow_ragged_batch": True}, BASE["inputs"][1]]  # type: ignore[index]
    ragged = Model(parse_model_config({**BASE, "inputs": inputs}, "m"))
    strict = Model(parse_model_config(BASE, "m"))
    a = {"pixels": np.zeros((1, 2, 3), np.uint8), "text": np.zeros((1, 1), object)}
    b = {"pixels": np.zeros((3, 2, 5), np.uint8), "text": np.zeros((3, 1), object)}
    assert strict.batch_key(a) != strict.batch_key(b)
    assert strict.batch_key(a) == strict.batch_key({**a, "pixels": np.ones((4, 2, 3), np.uint8)})
    assert ragged.batch_key(a) == ragged.batch_key(b) == (("text", (1,)),)


def test_allow_ragged_batch_must_be_a_bool() -> None:
    inputs = [{**BASE["inputs"][0], "allow_ragged_batch": "yes"}]  # type: ignore[index]
    with pytest.raises(ValueError, match=r"inputs\[0\].allow_ragged_batch: true or false"):
        parse_model_config({**BASE, "inputs": inputs}, "m")
