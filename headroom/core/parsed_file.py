"""Read a file and parse its text, with errors that name the file and say what to do about it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

Parsed = TypeVar("Parsed")
SyntaxErrorT = TypeVar("SyntaxErrorT", bound=Exception)


def parse_file(
    path: Path,
    parse: Callable[[str], Parsed],
    syntax_error: type[SyntaxErrorT],
    missing: str,
    invalid: Callable[[SyntaxErrorT], str],
) -> Parsed:
    """`parse(path's text)`; ValueError(`missing`) when there is no such file, ValueError(`invalid(exc)`) when
    `parse` raises `syntax_error`."""
    try:
        return parse(path.read_text())
    except FileNotFoundError:
        raise ValueError(missing) from None
    except syntax_error as exc:
        raise ValueError(invalid(exc)) from None
