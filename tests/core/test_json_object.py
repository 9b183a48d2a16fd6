"""`json_object`: one JSON object or an error of the caller's type that names what was read."""

from __future__ import annotations

import pytest

from headroom.core.errors import InvalidRequest
from headroom.core.json_object import json_object


@pytest.mark.parametrize("raw", [b'{"a": 1}', '{"a": 1}', b' {"a": 1}\n'])
def test_an_object_parses_from_bytes_or_text(raw: bytes | str) -> None:
    assert json_object(raw, "x") == {"a": 1}


@pytest.mark.parametrize("raw", [b"{not json", b"", b"{", "\ud800", b"\xff\xfe", b"NaN", b'{"a": 1} 2'])
def test_not_json_names_what_was_read(raw: bytes | str) -> None:
    with pytest.raises(InvalidRequest, match=r"^input 'p' is not valid JSON: "):
        json_object(raw, "input 'p'", InvalidRequest)


@pytest.mark.parametrize("raw", [b"[1, 2]", b"1", b'"s"', b"null", b"true"])
def test_json_that_is_not_an_object_is_refused_with_the_hint(raw: bytes) -> None:
    with pytest.raises(ValueError, match=r"^data\.jsonl:3 must be a JSON object \(one per line\)$"):
        json_object(raw, "data.jsonl:3", ValueError, " (one per line)")
