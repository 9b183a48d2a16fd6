"""The build record of a built-in model's version directory: `build.json`, installed last, marks it built.

A build writes its artifacts into a staging directory next to the version directory, then `install` moves
them in with `build.json` last, so a version directory holding a `build.json` whose fingerprint matches the
current code and inputs is complete (`is_current`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

RECORD_NAME = "build.json"


def read_record(version_dir: Path) -> dict[str, Any] | None:
    """The version's build record, or None when it is missing, unreadable or not a JSON object."""
    try:
        recorded = json.loads((version_dir / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None


def is_current(version_dir: Path, artifacts: Sequence[str], fingerprint: Callable[[], str]) -> bool:
    """True when every artifact exists and the record carries `fingerprint()` (called only then)."""
    if not all((version_dir / name).is_file() for name in artifacts):
        return False
    recorded = read_record(version_dir)
    return recorded is not None and recorded.get("fingerprint") == fingerprint()


def install(staging: Path, version_dir: Path, artifacts: Sequence[str], record: Mapping[str, Any]) -> None:
    """Write `record` as build.json into `staging`, then move `artifacts` into `version_dir` in order.

    `artifacts` must end with build.json: it is what marks the version as built.
    """
    if not artifacts or artifacts[-1] != RECORD_NAME:
        raise ValueError(f"artifacts must end with {RECORD_NAME}: {list(artifacts)}")
    (staging / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n")
    for name in artifacts:
        os.replace(staging / name, version_dir / name)
