"""The client-timeout header, parsed the same way on every route."""

from __future__ import annotations

import pytest

from headroom.core.deadline import client_timeout_ms, parse_timeout_ms, shorter
from headroom.core.errors import InvalidRequest


def test_header_values() -> None:
    assert parse_timeout_ms(None) is None
    assert parse_timeout_ms("250") == 250.0 and parse_timeout_ms("0.5") == 0.5
    assert client_timeout_ms({"x-request-timeout-ms": "80"}) == 80.0
    assert client_timeout_ms({"X-Request-Timeout-Ms": "90"}) == 90.0
    assert client_timeout_ms({}) is None


@pytest.mark.parametrize("raw", ["", "soon", "0", "-1", "nan", "inf", "-inf", "1e400"])
def test_bad_header_values_are_400s(raw: str) -> None:
    with pytest.raises(InvalidRequest, match="X-Request-Timeout-Ms must be a number of milliseconds > 0"):
        parse_timeout_ms(raw)


def test_shorter() -> None:
    assert shorter(None, None) is None
    assert shorter(5.0, None) == 5.0 and shorter(None, 7.0) == 7.0 and shorter(5.0, 7.0) == 5.0
