"""Input limits as pure checks: headers, content length, JSON shape, model names, LLM knobs, slow bodies."""

from __future__ import annotations

import json

import pytest

from headroom.core.errors import InvalidRequest, PayloadTooLarge
from headroom.gateway.errors import HeadersTooLarge
from headroom.gateway.limits import (
    InputLimits,
    body_deadline_s,
    check_content_length,
    check_headers,
    check_json_shape,
    check_model_name,
    check_model_path,
    check_openai_body,
    is_llm_path,
)


def test_header_count_and_size() -> None:
    limits = InputLimits(max_header_count=3, max_header_bytes=20)
    check_headers([(b"a", b"b")] * 3, limits)
    with pytest.raises(HeadersTooLarge):
        check_headers([(b"a", b"b")] * 4, limits)
    with pytest.raises(HeadersTooLarge):
        check_headers([(b"cookie", b"x" * 30)], limits)


def test_content_length() -> None:
    limits = InputLimits(max_body_bytes=10)
    assert check_content_length(None, limits) is None
    assert check_content_length(b"10", limits) == 10
    with pytest.raises(PayloadTooLarge):
        check_content_length(b"11", limits)
    with pytest.raises(InvalidRequest):
        check_content_length(b"-1", limits)


def test_json_depth_counts_only_structure_outside_strings() -> None:
    limits = InputLimits(max_json_depth=3)
    check_json_shape(b'{"a": [[1]], "s": "[[[[[[[[\\"[[[["}', limits)
    with pytest.raises(InvalidRequest, match="depth 4"):
        check_json_shape(b'{"a": [[[1]]]}', limits)
    doc = {"a": [{"b": 1}]}  # depth 3
    check_json_shape(json.dumps(doc).encode(), limits)


def test_json_string_length() -> None:
    limits = InputLimits(max_json_string_bytes=8)
    check_json_shape(b'{"k": "12345678"}', limits)
    with pytest.raises(InvalidRequest, match="9 bytes"):
        check_json_shape(b'{"k": "123456789"}', limits)
    check_json_shape(b'{"k": "12345\\"7"}', limits)  # the escape counts two bytes: 8 in all


def test_json_scan_skips_big_bodies_and_disabled_limits() -> None:
    deep = b"[" * 100 + b"]" * 100
    check_json_shape(deep, InputLimits(max_json_depth=3, json_scan_max_bytes=50))
    check_json_shape(deep, InputLimits(max_json_depth=0, max_json_string_bytes=0))


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "..\\x", "a\x00", "x..y", "../etc"])
def test_bad_model_names(name: str) -> None:
    with pytest.raises(InvalidRequest):
        check_model_name(name, "test")


@pytest.mark.parametrize("name", ["echo", "minilm", "resnet-50", "my_model.v2", "smollm2"])
def test_good_model_names(name: str) -> None:
    check_model_name(name, "test")


@pytest.mark.parametrize(
    "path",
    [
        b"/v2/models/%2e%2e/infer",
        b"/v2/models/%2E%2E%2Fx/infer",
        b"/v2/models/%252e%252e/ready",
        b"/v2/repository/models/a%5Cb/load",
        b"/v2/models/..",
        b"/x/%2e%2e/y",
    ],
)
def test_bad_model_paths(path: bytes) -> None:
    with pytest.raises(InvalidRequest):
        check_model_path(path)


def test_good_model_paths() -> None:
    for path in (
        b"/v2/models/echo/infer",
        b"/v2/models/echo/versions/1/ready",
        b"/v1/embeddings",
        b"/metrics",
    ):
        check_model_path(path)


def test_openai_llm_knobs_and_token_estimate() -> None:
    limits = InputLimits(max_tokens=100, max_n=2, max_prompt_chars=50)
    body = {"model": "smollm2", "prompt": "x" * 40, "max_tokens": 100, "n": 2}
    assert check_openai_body("/v1/completions", json.dumps(body).encode(), limits) == 40 // 4 + 1 + 200
    chat = {"messages": [{"role": "user", "content": "y" * 8}], "max_completion_tokens": 10}
    assert check_openai_body("/v1/chat/completions", json.dumps(chat).encode(), limits) == 3 + 10
    for bad in ({"max_tokens": 101}, {"n": 3}, {"prompt": "z" * 51}, {"model": "../x"}):
        with pytest.raises(InvalidRequest):
            check_openai_body("/v1/completions", json.dumps(bad).encode(), limits)
    assert check_openai_body("/v1/completions", b"not json", limits) == 0
    assert check_openai_body("/v1/embeddings", b'{"input": ["abcd", "efgh"]}', limits) == 3


def test_body_deadline_policy() -> None:
    limits = InputLimits(body_timeout_s=10.0, min_body_rate_bytes_per_s=100.0, body_grace_s=2.0)
    assert body_deadline_s(limits, 0.0, 0) == 2.0  # nothing yet: the grace period
    assert body_deadline_s(limits, 0.0, 300) == 5.0  # 300 bytes buy 3 more seconds
    assert body_deadline_s(limits, 0.0, 10_000) == 10.0  # but never past the total timeout
    assert body_deadline_s(InputLimits(body_timeout_s=0, min_body_rate_bytes_per_s=0), 0.0, 0) == float("inf")


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        InputLimits(max_body_bytes=-1)
    with pytest.raises(ValueError):
        InputLimits(body_timeout_s=-1)


def test_triton_generate_counts_as_an_llm_request() -> None:
    limits = InputLimits(max_tokens=100, max_prompt_chars=50)
    body = {"text_input": "x" * 40, "parameters": {"max_tokens": 20}}
    assert is_llm_path("/v2/models/smollm2/generate") and is_llm_path("/v2/models/m/versions/1/generate_stream")
    assert not is_llm_path("/v2/models/smollm2/infer") and is_llm_path("/v1/chat/completions")
    assert check_openai_body("/v2/models/smollm2/generate", json.dumps(body).encode(), limits) == 11 + 20
    for bad in ({"text_input": "z" * 51}, {"text_input": "a", "max_tokens": 101},
                {"text_input": "a", "parameters": {"max_tokens": 101}}):
        with pytest.raises(InvalidRequest):
            check_openai_body("/v2/models/smollm2/generate_stream", json.dumps(bad).encode(), limits)
