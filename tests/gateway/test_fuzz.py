"""Property-based fuzzing of the decoders and the gateway checks: InvalidRequest or success, nothing else."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from headroom.core.clock import MonotonicClock
from headroom.core.errors import InvalidRequest
from headroom.core.types import V2_TO_NUMPY
from headroom.gateway.app import GatewaySetup, wrap_app
from headroom.gateway.limits import InputLimits, check_json_shape, check_model_path, check_openai_body
from headroom.protocol.v2_http import decode_infer_request
from headroom.server.dataplane import DataPlane
from headroom.server.http_app import HttpApi, HttpLimits, build_http_app
from headroom.server.metrics import ServerMetrics

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
datatypes = st.sampled_from([*V2_TO_NUMPY, "FP8", "", "int"]) | st.text(max_size=4)
shapes = st.lists(st.integers(-2, 5), max_size=3) | json_values
tensor = st.fixed_dictionaries(
    {"name": st.text(max_size=3) | json_values, "datatype": datatypes, "shape": shapes},
    optional={
        "data": json_values
        | st.lists(st.floats(allow_nan=True) | st.integers(-300, 300) | st.text(max_size=3), max_size=12),
        "parameters": st.dictionaries(
            st.sampled_from(["binary_data_size", "classification", "binary_data", "shared_memory_region"]),
            json_values | st.integers(-2, 40),
            max_size=2,
        ),
    },
)
v2_body = st.fixed_dictionaries(
    {"inputs": st.lists(tensor, max_size=3) | json_values},
    optional={
        "id": json_values,
        "outputs": st.lists(
            st.fixed_dictionaries(
                {"name": st.text(max_size=3)},
                optional={
                    "parameters": st.dictionaries(
                        st.sampled_from(["binary_data", "classification"]), json_values
                    )
                },
            ),
            max_size=2,
        )
        | json_values,
        "parameters": st.dictionaries(
            st.sampled_from(["priority", "timeout", "binary_data_output", "x"]),
            json_values | st.integers(-5, 10**7),
            max_size=3,
        ),
    },
)


@FUZZ
@given(body=v2_body, tail=st.binary(max_size=40), use_binary=st.booleans())
def test_v2_json_decoder_only_raises_invalid_request(
    body: dict[str, Any], tail: bytes, use_binary: bool
) -> None:
    header = json.dumps(body).encode()
    payload, header_length = (header + tail, len(header)) if use_binary else (header, None)
    with contextlib.suppress(InvalidRequest):
        decode_infer_request(payload, header_length, "m", "", "id")


@FUZZ
@given(raw=st.binary(max_size=200), header_length=st.none() | st.integers(-3, 250))
def test_v2_decoder_on_arbitrary_bytes(raw: bytes, header_length: int | None) -> None:
    with contextlib.suppress(InvalidRequest):
        decode_infer_request(raw, header_length, "m", "", "id")


@FUZZ
@given(raw=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_gateway_checks_only_raise_invalid_request(raw: bytes) -> None:
    limits = InputLimits(
        max_json_depth=4, max_json_string_bytes=16, max_tokens=50, max_n=2, max_prompt_chars=30
    )
    for check in (
        lambda: check_json_shape(raw, limits),
        lambda: check_openai_body("/v1/completions", raw, limits),
        lambda: check_openai_body("/v1/embeddings", raw, limits),
        lambda: check_model_path(raw),
    ):
        with contextlib.suppress(InvalidRequest):
            check()


@pytest.fixture(scope="module")
def http_client() -> Iterator[TestClient]:
    """The server's HTTP app (no models loaded) behind the gateway, in process."""
    registry = CollectorRegistry()
    api = HttpApi(
        DataPlane(ServerMetrics(registry), MonotonicClock()), registry, HttpLimits(max_body_bytes=4096)
    )
    app = wrap_app(build_http_app(api), GatewaySetup())
    with TestClient(app, raise_server_exceptions=True) as client:
        yield client


openai_body = st.fixed_dictionaries(
    {},
    optional={
        "input": json_values | st.lists(st.text(max_size=10), max_size=3),
        "model": json_values | st.just("minilm"),
        "encoding_format": st.sampled_from(["float", "base64", "x"]) | json_values,
    },
)


@FUZZ
@given(body=openai_body | json_values, raw=st.none() | st.binary(max_size=64))
def test_openai_embeddings_body_is_never_a_server_error(
    http_client: TestClient, body: Any, raw: bytes | None
) -> None:
    content = raw if raw is not None else json.dumps(body).encode()
    r = http_client.post("/v1/embeddings", content=content, headers={"content-type": "application/json"})
    assert r.status_code in (400, 404, 413), (r.status_code, r.text)
    assert "error" in r.json()


@FUZZ
@given(body=v2_body)
def test_v2_infer_over_http_is_never_a_server_error(http_client: TestClient, body: dict[str, Any]) -> None:
    r = http_client.post("/v2/models/echo/infer", content=json.dumps(body).encode())
    assert r.status_code in (400, 404, 413), (r.status_code, r.text)
