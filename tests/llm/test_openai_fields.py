"""Every OpenAI field honoured or refused, through the real server (uvicorn on 127.0.0.1) and the `openai` SDK:
each refused field gets its 400, out-of-range values name the field, `logit_bias` steers generation, the
context overflow carries `code: context_length_exceeded`, and a fuzz of every field never gets a 5xx."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headroom.llm.validation import INT64_MAX, REFUSED
from tests.llm.test_http import _Server

MESSAGES: Any = [{"role": "user", "content": "Say hello."}]


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return dict(body)


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_each_refused_field_gets_a_400_naming_it(client: openai.OpenAI, field: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="smollm2", messages=MESSAGES, max_tokens=1, extra_body={field: {"type": "json_object"}}
        )
    body = _error(err.value)
    assert body["param"] == field and body["code"] == "unsupported_parameter"
    assert body["type"] == "invalid_request_error"


def test_tools_are_refused_by_the_sdk_arguments_for_a_template_without_tools(client: openai.OpenAI) -> None:
    """(response_format is honoured: tests/llm/test_structured_output.py.)"""
    tool: Any = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match="does not support tools") as err:
        client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1, tools=[tool])
    assert _error(err.value)["param"] == "tools"


def test_unknown_field_and_out_of_range_values_are_named(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="smollm2", prompt="hi", max_tokens=1, extra_body={"temprature": 0})
    assert _error(err.value)["param"] == "temprature" and _error(err.value)["code"] == "unknown_parameter"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1, seed=2**63)
    assert _error(err.value)["param"] == "seed" and "integer in [" in _error(err.value)["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="smollm2", messages=MESSAGES, max_tokens=1, temperature=0.7,
            extra_body={"repetition_penalty": 1e-300},
        )
    assert _error(err.value)["param"] == "repetition_penalty"
    for seed in (INT64_MAX, -(2**63)):  # the range's ends, sampled, with n > 1 (seed + i per choice)
        ok = client.chat.completions.create(
            model="smollm2", messages=MESSAGES, max_tokens=1, seed=seed, n=3, temperature=1.0
        )
        assert [c.finish_reason for c in ok.choices] == ["length"] * 3


def test_context_overflow_has_openai_code(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="smollm2", prompt="hello", max_tokens=100_000)
    assert _error(err.value)["code"] == "context_length_exceeded"


def test_logit_bias_forces_a_token(live: tuple[_Server, openai.OpenAI]) -> None:
    server, client = live
    tok = server.service.serving.tokenizer
    assert tok is not None
    target = tok.encode(" banana", add_special_tokens=False)[0]
    out = client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=3, temperature=0,
        logit_bias={str(target): 100},
    )
    assert out.choices[0].text == tok.decode([target] * 3)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="smollm2", prompt="x", max_tokens=1, logit_bias={"10000000": 1})
    assert _error(err.value)["param"] == "logit_bias"


_NUMBER = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2, 0.5, 1e-300, -1e-300, 1e300]),
)
_ANY = st.one_of(_NUMBER, st.booleans(), st.text(max_size=5), st.none(), st.lists(st.integers(-5, 5), max_size=3))
_FIELDS = {
    name: st.one_of(_NUMBER, _ANY)
    for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "n", "seed", "top_logprobs", "priority")
}
_FIELDS["logprobs"] = st.one_of(st.booleans(), _ANY)
_FIELDS["stop"] = st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=5), _ANY)
_FIELDS["logit_bias"] = st.one_of(
    st.dictionaries(st.one_of(st.integers(-2, 60_000).map(str), st.text(max_size=3)), _NUMBER, max_size=3), _ANY
)
_FIELDS["stop_token_ids"] = st.one_of(st.lists(st.integers(-2, 60_000), max_size=3), _ANY)
_FIELDS["max_tokens"] = st.one_of(st.integers(-2, 2), _ANY)
_SCHEMA = st.dictionaries(st.sampled_from(["type", "minimum", "maxLength", "enum", "properties", "pattern", "$ref"]),
                          st.one_of(_ANY, st.sampled_from(["object", "string", "integer", "#/x", "(("])), max_size=3)
_FIELDS["response_format"] = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])}, optional={
        "json_schema": st.one_of(st.fixed_dictionaries({"name": st.text(max_size=4)},
                                                       optional={"schema": st.one_of(_SCHEMA, _ANY), "strict": _ANY}),
                                 _ANY)}),
    _ANY,
)
_FIELDS["tools"] = _ANY
_FIELDS["tool_choice"] = st.one_of(st.sampled_from(["auto", "none", "required"]), _ANY)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.fixed_dictionaries({}, optional=_FIELDS), chat=st.booleans())
def test_fuzzed_fields_get_200_or_a_400_naming_the_field(
    client: openai.OpenAI, body: dict[str, Any], chat: bool
) -> None:
    body = {**body, "max_tokens": body.get("max_tokens", 1)}
    if isinstance(body["max_tokens"], int) and body["max_tokens"] > 2:
        body["max_tokens"] = 2
    try:
        if chat:
            status = client.chat.completions.with_raw_response.create(
                model="smollm2", messages=MESSAGES, extra_body=body
            ).http_response.status_code
        else:
            status = client.completions.with_raw_response.create(
                model="smollm2", prompt="Hi", extra_body=body
            ).http_response.status_code
        assert status == 200
    except openai.BadRequestError as exc:
        err = _error(exc)
        assert err["message"] and err["type"] == "invalid_request_error"
        assert err["param"] is None or err["param"].split(".")[0] in body, err


def test_non_finite_numbers_are_400(live: tuple[_Server, openai.OpenAI]) -> None:
    server = live[0]
    """Python's JSON parser reads NaN and Infinity (the SDK cannot send them): they are out of every range."""
    for literal in ("NaN", "Infinity", "-Infinity"):
        body = '{"model": "smollm2", "prompt": "x", "max_tokens": 1, "temperature": ' + literal + "}"
        resp = httpx.post(f"http://127.0.0.1:{server.port}/v1/completions", content=body,
                          headers={"content-type": "application/json"}, timeout=30)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "temperature"


def test_n_choices_all_arrive(client: openai.OpenAI) -> None:
    """Greedy siblings finish in the same engine step; each must reach the response (the request used to hang)."""
    out = client.with_options(timeout=60).completions.create(
        model="smollm2", prompt="Say hello.", max_tokens=3, n=3, temperature=0
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert len({c.text for c in out.choices}) == 1
