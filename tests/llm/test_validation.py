"""The one place that range-checks LLM request fields: every field's range, refused and unknown fields."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headroom.llm.openai_protocol import ChatRequest, CompletionRequest
from headroom.llm.request import Request, SamplingParams
from headroom.llm.sampler import sample
from headroom.llm.validation import (
    INT64_MAX,
    INT64_MIN,
    RANGES,
    REFUSED,
    VENDOR_EXTENSIONS,
    FieldError,
    check_body,
    logit_bias,
)

CHAT = frozenset(ChatRequest.model_fields)
COMPLETION = frozenset(CompletionRequest.model_fields)
MSG = {"messages": [{"role": "user", "content": "hi"}]}


def _chat(**fields: object) -> dict[str, object]:
    return check_body({**MSG, **fields}, "chat", CHAT, 100)


@pytest.mark.parametrize(
    ("field", "bad", "says"),
    [
        ("temperature", 2.5, "[0, 2]"),
        ("temperature", -0.1, "[0, 2]"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_k", -2, "[-1, "),
        ("min_p", 1.5, "[0, 1]"),
        ("repetition_penalty", 1e-300, "[0.01, 10]"),
        ("presence_penalty", 3, "[-2, 2]"),
        ("frequency_penalty", -2.01, "[-2, 2]"),
        ("max_tokens", 0, "an integer in [1, "),
        ("n", 17, "an integer in [1, 16]"),
        ("seed", 2**63, f"[{INT64_MIN}, {INT64_MAX}]"),
        ("seed", -(2**63) - 1, f"[{INT64_MIN}, {INT64_MAX}]"),
        ("top_logprobs", 21, "[0, 20]"),
        ("priority", 2**64, "an integer"),
    ],
)
def test_out_of_range_names_the_field_and_its_range(field: str, bad: object, says: str) -> None:
    with pytest.raises(FieldError) as err:
        _chat(**{field: bad})
    assert err.value.param == field and err.value.http_status == 400
    assert field in err.value.message and says in err.value.message


def test_every_range_admits_its_own_bounds_and_refuses_non_finite_and_wrong_types() -> None:
    for field, rng in RANGES.items():
        if field == "logit_bias" or (field == "logprobs"):
            continue
        extra = {"logprobs": True} if field == "top_logprobs" else {}
        for edge in (rng.high, rng.low) if not rng.low_open else (rng.high,):
            value = int(edge) if rng.integer else float(edge)
            _chat(**{field: value}, **extra)
        bad_values: list[object] = ["1", True, [1]]
        bad_values += [1.5] if rng.integer else [math.nan, math.inf]
        for bad in bad_values:
            with pytest.raises(FieldError) as err:
                _chat(**{field: bad})
            assert err.value.param == field


def test_completion_logprobs_is_a_count_and_chat_logprobs_a_flag() -> None:
    check_body({"prompt": "x", "logprobs": 5}, "completion", COMPLETION, 100)
    with pytest.raises(FieldError, match=r"logprobs must be an integer in \[0, 20\]"):
        check_body({"prompt": "x", "logprobs": 21}, "completion", COMPLETION, 100)
    _chat(logprobs=True, top_logprobs=3)
    with pytest.raises(FieldError, match="logprobs must be true or false"):
        _chat(logprobs=3)


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_refused_openai_fields_are_400_never_ignored(field: str) -> None:
    with pytest.raises(FieldError) as err:
        _chat(**{field: {"type": "json_object"}})
    assert err.value.param == field and err.value.code == "unsupported_parameter"


def test_deprecated_function_fields_point_to_tools_and_structured_fields_pass_to_their_checker() -> None:
    for field in ("functions", "function_call"):
        with pytest.raises(FieldError, match="deprecated by OpenAI and not supported; use tools"):
            _chat(**{field: "auto"})
    for field in ("response_format", "tools", "tool_choice", "parallel_tool_calls"):  # structured_output checks them
        assert field not in REFUSED


def test_unknown_field_is_named_and_null_means_not_sent() -> None:
    with pytest.raises(FieldError) as err:
        _chat(temprature=0.5)
    assert err.value.param == "temprature" and err.value.code == "unknown_parameter"
    assert "temperature" in err.value.message  # the accepted list helps spot the typo
    assert _chat(temperature=None, tools=None, seed=None) == MSG


def test_vendor_extensions_are_fields_of_both_request_models() -> None:
    for name in VENDOR_EXTENSIONS:
        assert name in CHAT and name in COMPLETION


def test_stop_stream_options_and_stop_token_ids() -> None:
    _chat(stop="x", stream=True, stream_options={"include_usage": True}, stop_token_ids=[0, 99])
    for fields, param in (
        ({"stop": ""}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"stop": ["a"] * 17}, "stop"),
        ({"stream": True, "stream_options": {"include_usag": True}}, "stream_options.include_usag"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({"stop_token_ids": [100]}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stream": 1}, "stream"),
        ({"user": 5}, "user"),
    ):
        with pytest.raises(FieldError) as err:
            _chat(**fields)
        assert err.value.param == param


def test_fields_that_need_another_field() -> None:
    for fields, param in (
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ):
        with pytest.raises(FieldError) as err:
            _chat(**fields)
        assert err.value.param == param
    _chat(stream=True, stream_options={"include_usage": False}, logprobs=True, top_logprobs=2)
    check_body({"prompt": "x", "echo": False}, "completion", COMPLETION, 100)
    with pytest.raises(FieldError) as err:
        check_body({"prompt": "x", "echo": True}, "completion", COMPLETION, 100)
    assert err.value.param == "echo" and err.value.code == "unsupported_parameter"


def test_logit_bias_is_checked_against_the_vocabulary() -> None:
    assert logit_bias({"5": 100, "2": -100.0}, 100) == ((2, -100.0), (5, 100.0))
    for bad in ({"100": 1}, {"-1": 1}, {"x": 1}, {"5": 100.5}, {"5": "1"}, [1, 2]):
        with pytest.raises(FieldError) as err:
            _chat(logit_bias=bad)
        assert err.value.param == "logit_bias"


def test_sampling_params_use_the_same_ranges() -> None:
    SamplingParams(temperature=2.0, seed=INT64_MAX).validate()
    with pytest.raises(FieldError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=1e-300).validate()
    with pytest.raises(FieldError, match="logit_bias"):
        SamplingParams(logit_bias=((1, 101.0),)).validate()


def test_a_tiny_temperature_decodes_greedily() -> None:
    assert SamplingParams(temperature=1e-300).greedy
    assert not SamplingParams(temperature=1e-4).greedy


def _req(params: SamplingParams) -> Request:
    gen = np.random.default_rng(0)
    return Request("r", [1, 2], params, arrival_s=0.0, seq_no=0, generator=gen)


def test_a_plus_100_logit_bias_forces_the_token_and_minus_100_bans_it() -> None:
    logits = np.zeros((2, 50), dtype=np.float32)
    logits[:, 7] = 20.0  # the model's clear favourite
    forced = SamplingParams(temperature=0.0, logit_bias=((33, 100.0),))
    sampled = SamplingParams(temperature=1.0, logit_bias=((33, 100.0),))
    picks = sample(logits, [_req(forced), _req(sampled)])
    assert [tok for tok, _ in picks] == [33, 33]
    banned = SamplingParams(temperature=0.0, logit_bias=((7, -100.0),))
    assert sample(logits[:1], [_req(banned)])[0][0] != 7
