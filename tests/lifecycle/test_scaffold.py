"""`headroom models add | pull | list` (the typer app in headroom/cli/models.py) on real files."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from headroom.cli.models import app
from headroom.lifecycle.defaults import DEFAULT_CONFIGS
from headroom.lifecycle.scaffold import onnx_signature, parse_tensor_spec
from headroom.models.config import TensorSpec, load_model_config
from headroom.models.repository import ModelRepository
from headroom.models.trust import DEFAULT_TRUSTED
from headroom.models.warmup import run_pipeline

PROJECT_MODELS = Path(__file__).resolve().parents[2] / "models"
BENCH_MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
runner = CliRunner()

ECHO = """
import numpy as np

class Doubler:
    def predict(self, inputs):
        return {"y": inputs["x"] * 2}
"""


def test_tensor_specs_parse_and_say_the_format_when_wrong() -> None:
    assert parse_tensor_spec("x:FP32:3,-1") == TensorSpec("x", "FP32", (3, -1))
    for bad in ("x:FP32", "x:FLOAT:3", "x:FP32:a", "x:FP32:0"):
        with pytest.raises(ValueError, match="x:FP32"):
            parse_tensor_spec(bad)


def test_add_onnx_reads_the_graph_and_the_model_serves(digits_dir: Path, tmp_path: Path) -> None:
    sig = onnx_signature(digits_dir / "model.onnx")
    assert sig.batched
    assert sig.inputs == (TensorSpec("input", "FP32", (1, 8, 8)),)
    assert sig.outputs == (TensorSpec("probabilities", "FP32", (10,)),)
    repo = tmp_path / "repo"
    result = runner.invoke(app, ["add", "cnn", "--onnx", str(digits_dir / "model.onnx"),
                                 "--model-repository", str(repo)])
    assert result.exit_code == 0, result.output
    config = load_model_config(repo / "cnn")
    assert config.backend == "onnxruntime" and config.max_batch_size == 32
    assert (repo / "cnn" / "1" / "model.onnx").read_bytes() == (digits_dir / "model.onnx").read_bytes()
    (loaded,) = ModelRepository(repo).load()
    probs = run_pipeline(loaded.model, {"input": np.zeros((3, 1, 8, 8), dtype=np.float32)})["probabilities"]
    assert probs.shape == (3, 10) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    loaded.unload()

    again = runner.invoke(app, ["add", "cnn", "--onnx", str(digits_dir / "model.onnx"),
                                "--model-repository", str(repo)])
    assert again.exit_code == 2 and "--force" in again.output


def test_add_python_writes_the_declared_tensors_and_refuses_bad_input(tmp_path: Path) -> None:
    source = tmp_path / "doubler.py"
    source.write_text(textwrap.dedent(ECHO))
    repo = tmp_path / "repo"
    result = runner.invoke(app, ["add", "dbl", "--python", f"{source}:Doubler", "--input", "x:FP32:2",
                                 "--output", "y:FP32:2", "--model-repository", str(repo)])
    assert result.exit_code == 0, result.output
    (loaded,) = ModelRepository(repo).load()
    out = run_pipeline(loaded.model, {"x": np.array([[1.0, 2.0]], dtype=np.float32)})
    assert out["y"].tolist() == [[2.0, 4.0]]
    assert loaded.config.parameters["class_name"] == "Doubler"

    missing = runner.invoke(app, ["add", "dbl2", "--python", str(source), "--model-repository", str(repo)])
    assert missing.exit_code == 2 and "--input" in missing.output and not (repo / "dbl2").exists()
    neither = runner.invoke(app, ["add", "x", "--model-repository", str(repo)])
    assert neither.exit_code == 2 and "exactly one of" in neither.output
    wrong_class = runner.invoke(app, ["add", "dbl3", "--python", f"{source}:Nope", "--input", "x:FP32:2",
                                      "--output", "y:FP32:2", "--model-repository", str(repo)])
    assert wrong_class.exit_code == 0  # the class is checked at load time, like every python model:
    with pytest.raises(ValueError, match="Nope"):
        ModelRepository(repo).load(ModelRepository(repo).scan(["dbl3"]))


def test_pull_a_packaged_default_and_a_local_directory_then_list(digits_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    result = runner.invoke(app, ["pull", "noop", "--model-repository", str(repo)])
    assert result.exit_code == 0, result.output
    assert (repo / "noop" / "1").is_dir()  # its class ships with headroom: nothing to build
    served = ModelRepository(repo, trusted=DEFAULT_TRUSTED)  # what `headroom serve` trusts by default
    (noop,) = served.load(served.scan(["noop"]))
    assert noop.model.predict({"input": np.ones((1, 3), np.float32)})["output"].tolist() == [[1.0, 1.0, 1.0]]
    local = runner.invoke(app, ["pull", str(digits_repo / "digits"), "--name", "digits2",
                                "--model-repository", str(repo)])
    assert local.exit_code == 0, local.output
    assert (repo / "digits2" / "1" / "model.onnx").is_file()
    unknown = runner.invoke(app, ["pull", "resnet50", "--model-repository", str(repo)])
    assert unknown.exit_code == 2 and "packaged default" in unknown.output

    (repo / "broken").mkdir()
    (repo / "broken" / "config.yaml").write_text("backend: tensorflow\n")
    listing = runner.invoke(app, ["list", "--model-repository", str(repo)], env={"COLUMNS": "200"})
    assert listing.exit_code == 0, listing.output
    lines = {line.split()[1]: line for line in listing.output.splitlines() if line.startswith("│")}
    assert "invalid" in lines["broken"]
    assert "python" in lines["noop"] and "onnxruntime" in lines["digits2"]


def test_packaged_default_configs_match_the_repository_models() -> None:
    for name, text in DEFAULT_CONFIGS.items():
        repo = BENCH_MODELS if name == "noop" else PROJECT_MODELS  # noop: the overhead probe, not a default
        assert yaml.safe_load(text) == yaml.safe_load((repo / name / "config.yaml").read_text())
