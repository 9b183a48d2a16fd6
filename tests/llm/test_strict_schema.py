"""OpenAI's strict-mode rules (headroom.llm.strict_schema): each rule refuses with the JSON path and the rule; a
schema that keeps them all (nested objects, nullable fields, anyOf, $defs with recursion) passes."""

from __future__ import annotations

from typing import Any

import pytest

from headroom.llm.strict_schema import check_strict
from headroom.protocol.openai_errors import FieldError

P = "response_format.json_schema.schema"


def _obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


GOOD: dict[str, Any] = {
    **_obj(
        name={"type": "string", "pattern": "^[A-Z][a-z]+$", "description": "a name"},
        age={"type": ["integer", "null"], "minimum": 0, "exclusiveMaximum": 150},
        when={"type": "string", "format": "date-time"},
        tags={"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
        pet={"anyOf": [_obj(kind={"const": "cat"}), {"type": "null"}]},
        tree={"$ref": "#/$defs/node"},
    ),
    "$defs": {"node": _obj(value={"type": "number", "multipleOf": 0.5},
                           children={"type": "array", "items": {"$ref": "#/$defs/node"}})},
    "title": "person",
}


def test_a_schema_that_keeps_every_rule_passes() -> None:
    check_strict(GOOD, P)
    check_strict(_obj(), P)  # an object with no properties


@pytest.mark.parametrize(
    ("schema", "param", "rule"),
    [
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, P,
         '"additionalProperties": false'),
        ({**_obj(a={"type": "string"}), "additionalProperties": True}, P, '"additionalProperties": false'),
        ({**_obj(a={"type": "string"}, b={"type": "string"}), "required": ["a"]}, f"{P}.required", "missing 'b'"),
        (_obj(inner={"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}),
         f"{P}.properties.inner", '"additionalProperties": false'),
        (_obj(a={"type": "string", "minLength": 1}), f"{P}.properties.a.minLength", "'minLength' is not supported"),
        (_obj(a={"allOf": [{"type": "string"}]}), f"{P}.properties.a.allOf", "'allOf' is not supported"),
        (_obj(a={"type": "string", "default": "x"}), f"{P}.properties.a.default", "'default' is not supported"),
        (_obj(a={"type": "string", "format": "uri"}), f"{P}.properties.a.format", "format 'uri'"),
        (_obj(a={"type": "text"}), f"{P}.properties.a.type", "type 'text'"),
        (_obj(a={"$ref": "https://example.com/s.json"}), f"{P}.properties.a.$ref", "local"),
        (_obj(a={"type": "array", "items": [{"type": "string"}]}), f"{P}.properties.a.items", "must be an object"),
        ({"anyOf": [_obj()]}, P, "not anyOf"),
        ({"type": "array", "items": {"type": "string"}}, P, "root"),
        ({**_obj(), "$defs": {"d": {"type": "object", "properties": {}}}}, f"{P}.$defs.d",
         '"additionalProperties": false'),
        (_obj(a={"enum": list(range(1001))}), f"{P}.properties.a.enum", "at most 1000 enum values"),
    ],
)
def test_each_broken_rule_is_a_400_naming_the_path_and_the_rule(schema: dict[str, Any], param: str,
                                                                 rule: str) -> None:
    with pytest.raises(FieldError) as err:
        check_strict(schema, P)
    assert err.value.param == param and rule in err.value.message, (err.value.param, err.value.message)
    assert "strict" in err.value.message


def test_nesting_is_bounded_at_ten_levels() -> None:
    schema = _obj(leaf={"type": "string"})
    for _ in range(9):
        schema = _obj(inner=schema)
    check_strict(schema, P)  # 10 levels
    with pytest.raises(FieldError, match="at most 10 levels"):
        check_strict(_obj(inner=schema), P)
