"""OpenAI's strict-mode rules for a JSON schema (`json_schema.strict: true`, a function tool's `strict: true`).

A strict schema is enforced like any other (headroom constrains every JSON schema it is sent); `strict: true`
additionally refuses a schema that OpenAI's Structured Outputs would refuse, so a schema that works here in
strict mode works there too. The rules (OpenAI's "Supported schemas"):

- the root is an object schema (`"type": "object"`), not `anyOf`;
- every object schema has `"additionalProperties": false` and lists every key of `properties` in `required`
  (an optional field is a required one whose type allows `null`);
- only these keywords: `type`, `properties`, `required`, `additionalProperties`, `items`, `enum`, `const`,
  `anyOf`, `$ref` (local: `#` or `#/$defs/...`), `$defs` / `definitions`, `description`, `title`; for strings
  `pattern` and `format` (date-time, time, date, duration, email, hostname, ipv4, ipv6, uuid); for numbers
  `multipleOf`, `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`; for arrays `minItems`, `maxItems`
  (so no `allOf`, `oneOf`, `not`, `if`, `minLength`, `patternProperties`, `uniqueItems`, `default` ...);
- `type` is one of string, number, integer, boolean, object, array, null (or a list of them);
- at most 10 levels of nested objects, 5000 properties and 1000 enum values in all.

`check_strict` raises a FieldError whose `param` is the JSON path of the offending node (e.g.
`response_format.json_schema.schema.properties.address`) and whose message names the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headroom.protocol.openai_errors import FieldError

KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "$ref", "$defs",
    "definitions", "description", "title", "pattern", "format", "multipleOf", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems",
})
TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"})
MAX_NESTING = 10
MAX_PROPERTIES = 5000
MAX_ENUM_VALUES = 1000


@dataclass(slots=True)
class _Totals:
    properties: int = 0
    enum_values: int = 0


def check_strict(schema: dict[str, Any], param: str) -> None:
    """FieldError (400) naming the JSON path and the rule when `schema` breaks a strict-mode rule."""
    if "anyOf" in schema and "type" not in schema:
        raise _broken(param, "the root of a strict schema is an object schema, not anyOf")
    if schema.get("type") != "object":
        raise _broken(param, f"the root of a strict schema must have \"type\": \"object\", got "
                             f"{schema.get('type')!r}")
    _check(schema, param, 1, _Totals())


def _check(node: object, path: str, depth: int, totals: _Totals) -> None:
    if not isinstance(node, dict):
        raise _broken(path, "a schema must be an object")
    unsupported = sorted(set(node) - KEYWORDS)
    if unsupported:
        raise _broken(f"{path}.{unsupported[0]}", f"'{unsupported[0]}' is not supported in strict mode (supported "
                                                  f"keywords: {', '.join(sorted(KEYWORDS))})")
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith(("#/$defs/", "#/definitions/"))):
            raise _broken(f"{path}.$ref", "a strict schema's $ref is local: '#' or '#/$defs/<name>'")
    types = _types(node, path)
    if "format" in node and node["format"] not in FORMATS:
        raise _broken(f"{path}.format", f"format {node['format']!r} is not supported in strict mode (supported: "
                                        f"{', '.join(sorted(FORMATS))})")
    if "enum" in node:
        if not isinstance(node["enum"], list) or not node["enum"]:
            raise _broken(f"{path}.enum", "enum must be a non-empty list")
        totals.enum_values += len(node["enum"])
        if totals.enum_values > MAX_ENUM_VALUES:
            raise _broken(f"{path}.enum", f"a strict schema has at most {MAX_ENUM_VALUES} enum values in all")
    if "object" in types or "properties" in node:
        _check_object(node, path, depth, totals)
    if "items" in node:
        _check(node["items"], f"{path}.items", depth, totals)
    if "anyOf" in node:
        options = node["anyOf"]
        if not isinstance(options, list) or not options:
            raise _broken(f"{path}.anyOf", "anyOf must be a non-empty list of schemas")
        for i, option in enumerate(options):
            _check(option, f"{path}.anyOf.{i}", depth, totals)
    for key in ("$defs", "definitions"):
        defs = node.get(key)
        if defs is None:
            continue
        if not isinstance(defs, dict):
            raise _broken(f"{path}.{key}", f"{key} must be an object of named schemas")
        for name, sub in defs.items():
            _check(sub, f"{path}.{key}.{name}", 1, totals)


def _check_object(node: dict[str, Any], path: str, depth: int, totals: _Totals) -> None:
    if depth > MAX_NESTING:
        raise _broken(path, f"a strict schema nests objects at most {MAX_NESTING} levels deep")
    if node.get("additionalProperties") is not False:
        raise _broken(path, "every object in a strict schema must set \"additionalProperties\": false")
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        raise _broken(f"{path}.properties", "properties must be an object of schemas")
    required = node.get("required", [])
    if not isinstance(required, list):
        raise _broken(f"{path}.required", "required must be a list of property names")
    missing = [key for key in properties if key not in required]
    if missing:
        raise _broken(f"{path}.required", f"strict mode requires every property in required; missing "
                                          f"{missing[0]!r} (make an optional field nullable: \"type\": [..., "
                                          "\"null\"])")
    totals.properties += len(properties)
    if totals.properties > MAX_PROPERTIES:
        raise _broken(path, f"a strict schema has at most {MAX_PROPERTIES} properties in all")
    for key, sub in properties.items():
        _check(sub, f"{path}.properties.{key}", depth + 1, totals)


def _types(node: dict[str, Any], path: str) -> set[str]:
    if "type" not in node:
        return set()
    value = node["type"]
    types = value if isinstance(value, list) else [value]
    bad = [t for t in types if t not in TYPES]
    if bad or not types:
        raise _broken(f"{path}.type", f"type {bad[0] if bad else value!r} is not one of {', '.join(sorted(TYPES))}")
    return set(types)


def _broken(path: str, rule: str) -> FieldError:
    return FieldError(path, f"{path}: {rule} (strict: true applies OpenAI's strict-mode rules; send strict: "
                            "false to use any JSON schema)")


__all__ = ["check_strict"]
