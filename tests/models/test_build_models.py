"""`headroom build-models` on a repository whose artifacts are current: skipped, and says so."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from headroom.cli.main import app


def test_build_models_skips_current_artifacts_and_reports_accuracy(
    digits_repo: Path, minilm_repo: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "models"
    shutil.copytree(digits_repo / "digits", repo / "digits")
    shutil.copytree(minilm_repo / "minilm", repo / "minilm", symlinks=True)
    before = (repo / "digits" / "1" / "model.onnx").stat().st_mtime_ns
    result = CliRunner().invoke(app, ["build-models", "--model-repository", str(repo)])
    assert result.exit_code == 0, result.output
    assert "up to date, skipped" in result.output
    assert "held-out accuracy 9" in result.output
    assert "minilm: weights from" in result.output
    assert result.output.count("up to date, skipped") == 2
    assert (repo / "digits" / "1" / "model.onnx").stat().st_mtime_ns == before
