"""build_record: a version directory counts as built only with every artifact and a matching fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headroom.models.builtin.build_record import install, is_current, read_record

ARTIFACTS = ("model.onnx", "build.json")


def _stage(tmp_path: Path) -> tuple[Path, Path]:
    staging, version_dir = tmp_path / "staging", tmp_path / "1"
    staging.mkdir()
    version_dir.mkdir()
    (staging / "model.onnx").write_bytes(b"onnx")
    return staging, version_dir


def test_install_moves_artifacts_and_marks_current(tmp_path: Path) -> None:
    staging, version_dir = _stage(tmp_path)
    install(staging, version_dir, ARTIFACTS, {"fingerprint": "abc", "accuracy": 0.97})
    assert (version_dir / "model.onnx").read_bytes() == b"onnx"
    assert not (staging / "model.onnx").exists()
    assert read_record(version_dir) == {"fingerprint": "abc", "accuracy": 0.97}
    assert is_current(version_dir, ARTIFACTS, lambda: "abc")
    assert not is_current(version_dir, ARTIFACTS, lambda: "other")


def test_missing_artifact_is_not_current_and_skips_the_fingerprint(tmp_path: Path) -> None:
    staging, version_dir = _stage(tmp_path)
    install(staging, version_dir, ARTIFACTS, {"fingerprint": "abc"})
    (version_dir / "model.onnx").unlink()
    calls: list[int] = []

    def fingerprint() -> str:
        calls.append(1)
        return "abc"

    assert not is_current(version_dir, ARTIFACTS, fingerprint)
    assert calls == []


@pytest.mark.parametrize("content", ["not json", json.dumps(["fingerprint", "abc"])])
def test_unreadable_or_non_object_record_is_none(tmp_path: Path, content: str) -> None:
    (tmp_path / "build.json").write_text(content)
    (tmp_path / "model.onnx").write_bytes(b"onnx")
    assert read_record(tmp_path) is None
    assert not is_current(tmp_path, ARTIFACTS, lambda: "abc")


def test_install_refuses_artifacts_not_ending_with_the_record(tmp_path: Path) -> None:
    staging, version_dir = _stage(tmp_path)
    with pytest.raises(ValueError, match=r"must end with build\.json"):
        install(staging, version_dir, ("build.json", "model.onnx"), {"fingerprint": "abc"})
    assert not (version_dir / "model.onnx").exists()
