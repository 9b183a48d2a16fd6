"""Shared fixtures: private copies of the built digits and minilm version directories (built here if absent)."""

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
def digits_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with only `digits` (config + version 1), copied from models/ when current, else trained."""
    root = tmp_path_factory.mktemp("lifecycle_repo")
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
def digits_dir(digits_repo: Path) -> Path:
    """digits' version directory (model.onnx, model.safetensors, build.json)."""
    return digits_repo / "digits" / "1"


@pytest.fixture(scope="session")
def minilm_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled all-MiniLM-L6-v2 weights directory (config.json, model.safetensors, tokenizer.json)."""
    return resolve_artifact(DEFAULT_WEIGHTS, tmp_path_factory.getbasetemp(), "minilm")


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory: pytest.TempPathFactory, minilm_weights: Path) -> Path:
    """A version directory with minilm's FP32 model.onnx (linked from models/ when current, else exported)."""
    version_dir = tmp_path_factory.mktemp("minilm") / "1"
    version_dir.mkdir()
    built = PROJECT_MODELS / "minilm" / "1"
    if minilm_build.is_built(built, minilm_weights):
        for name in minilm_build.ARTIFACTS:
            (version_dir / name).symlink_to(built / name)
    else:
        minilm_build.build_minilm_onnx(version_dir, minilm_weights)
    return version_dir
