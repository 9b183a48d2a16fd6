"""Shared fixtures: a model repository with a built digits model (trained once per session)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from headroom.models.artifacts import resolve_artifact
from headroom.models.builtin import minilm_build
from headroom.models.builtin.digits_build import ARTIFACTS, DigitsTrainingConfig, build_digits, is_built
from headroom.models.builtin.minilm import DEFAULT_WEIGHTS

PROJECT_MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="session")
def project_models() -> Path:
    """The project's own model repository (models/ at the repository root)."""
    return PROJECT_MODELS


@pytest.fixture(scope="session")
def digits_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository holding only `digits`: artifacts copied from models/ when current, else trained here."""
    root = tmp_path_factory.mktemp("repo")
    (root / "digits").mkdir()
    shutil.copy(PROJECT_MODELS / "digits" / "config.yaml", root / "digits" / "config.yaml")
    version_dir = root / "digits" / "1"
    built = PROJECT_MODELS / "digits" / "1"
    if is_built(built):
        version_dir.mkdir()
        for name in ARTIFACTS:
            shutil.copy(built / name, version_dir / name)
    else:
        build_digits(version_dir, DigitsTrainingConfig())
    return root


@pytest.fixture(scope="session")
def minilm_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with `minilm` (onnxruntime, the shipped config) and `minilm_torch` (the torch backend).

    The ONNX export is linked from models/ when current, else exported here.
    """
    root = tmp_path_factory.mktemp("minilm_repo")
    weights = resolve_artifact(DEFAULT_WEIGHTS, root, "minilm")
    config = (PROJECT_MODELS / "minilm" / "config.yaml").read_text()
    (root / "minilm" / "1").mkdir(parents=True)
    (root / "minilm" / "config.yaml").write_text(config)
    built = PROJECT_MODELS / "minilm" / "1"
    if minilm_build.is_built(built, weights):
        for name in minilm_build.ARTIFACTS:
            (root / "minilm" / "1" / name).symlink_to(built / name)
    else:
        minilm_build.build_minilm_onnx(root / "minilm" / "1", weights)
    torch_config = config.replace("backend: onnxruntime", "backend: torch").replace(
        "minilm:MiniLMOnnxModel", "minilm:MiniLMModel"
    )
    (root / "minilm_torch" / "1").mkdir(parents=True)
    (root / "minilm_torch" / "config.yaml").write_text(torch_config)
    return root


class ModelWriter:
    """Writes `<root>/<name>/config.yaml` and `<root>/<name>/<version>/<file>` from strings."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, name: str, config: str, files: dict[str, str] | None = None, version: int = 1) -> Path:
        directory = self.root / name
        (directory / str(version)).mkdir(parents=True, exist_ok=True)
        (directory / "config.yaml").write_text(config)
        for filename, text in (files or {}).items():
            (directory / str(version) / filename).write_text(text)
        return directory


@pytest.fixture
def write_model(tmp_path: Path) -> ModelWriter:
    """`write_model(name, config_yaml, {file: text}, version)` in a fresh repository at `tmp_path`."""
    return ModelWriter(tmp_path)
