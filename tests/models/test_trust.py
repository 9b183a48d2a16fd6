"""The `--trusted-backends` allowlist: which model code a server may load, and the refusal's message."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from headroom.models.artifacts import ModelLoadError
from headroom.models.repository import ModelRepository
from headroom.models.trust import DEFAULT_TRUSTED, parse_trusted, required_kinds

PY_MODEL = """
class Echo:
    def predict(self, inputs):
        return {"y": inputs["x"]}
"""


def _model(root: Path, name: str, extra: str = "", code: str | None = PY_MODEL, backend: str = "python") -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.yaml").write_text(textwrap.dedent(f"""
        backend: {backend}
        inputs: [{{name: x, datatype: FP32, shape: [2]}}]
        outputs: [{{name: y, datatype: FP32, shape: [2]}}]
        """) + extra)
    if code is not None:
        (root / name / "1" / "model.py").write_text(code)


def test_parse_names_every_kind_and_refuses_unknown_ones() -> None:
    assert parse_trusted("onnxruntime, torch,llm") == DEFAULT_TRUSTED
    assert parse_trusted("") == frozenset()
    with pytest.raises(ValueError, match="unknown tensorflow; choose from onnxruntime, torch, llm, python, pickle"):
        parse_trusted("onnxruntime,tensorflow")


def test_a_python_model_is_refused_by_default_with_how_to_allow_it(tmp_path: Path) -> None:
    _model(tmp_path, "echo")
    with pytest.raises(ModelLoadError) as info:
        ModelRepository(tmp_path, DEFAULT_TRUSTED).scan()
    message = str(info.value)
    assert "echo" in message and "imports and runs a model.py from the model repository" in message
    assert "--trusted-backends onnxruntime,torch,llm,python" in message
    (loaded,) = ModelRepository(tmp_path, parse_trusted("onnxruntime,torch,llm,python")).load()
    assert loaded.model.predict({"x": __import__("numpy").ones((1, 2), "float32")})["y"].shape == (1, 2)


def test_allow_pickle_needs_pickle_trusted_too(tmp_path: Path) -> None:
    _model(tmp_path, "legacy", "parameters: {allow_pickle: true, module: m:Net, weights: w.pt}\n", code=None,
           backend="torch")
    with pytest.raises(ModelLoadError, match=r"allow_pickle: true.*--trusted-backends onnxruntime,torch,llm,pickle"):
        ModelRepository(tmp_path, DEFAULT_TRUSTED).scan()
    assert ModelRepository(tmp_path, DEFAULT_TRUSTED | {"pickle"}).scan().models[0].name == "legacy"


def test_headroom_shipped_python_classes_need_no_python_trust(tmp_path: Path) -> None:
    _model(tmp_path, "noop", "parameters: {model_class: 'headroom.models.builtin.noop:NoopModel'}\n", code=None)
    (entry,) = ModelRepository(tmp_path, DEFAULT_TRUSTED).scan().models
    assert required_kinds(entry.config) == ()
    _model(tmp_path, "other", "parameters: {model_class: 'evil.mod:Model'}\n", code=None)
    assert required_kinds(ModelRepository(tmp_path).scan(["other"]).models[0].config) == ("python",)


def test_a_repository_without_an_allowlist_trusts_everything(tmp_path: Path) -> None:
    _model(tmp_path, "echo")
    assert [e.name for e in ModelRepository(tmp_path).scan().models] == ["echo"]
