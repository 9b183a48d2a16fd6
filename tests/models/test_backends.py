"""onnxruntime and torch backends on the digits artifacts; the pickle guard; model_class checks."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from headroom.models.artifacts import ModelLoadError
from headroom.models.builtin.digits_net import DigitsNet
from headroom.models.repository import LoadedModel, ModelRepository
from tests.models.conftest import ModelWriter

IO = """
max_batch_size: 16
inputs: [{name: input, datatype: FP32, shape: [1, 8, 8]}]
outputs: [{name: probabilities, datatype: FP32, shape: [10]}]
warmup: {batch_sizes: [1, 16]}
"""
BATCH = np.random.default_rng(0).uniform(-1, 2, size=(5, 1, 8, 8)).astype(np.float32)


def load_one(root: Path, name: str) -> LoadedModel:
    repo = ModelRepository(root)
    (loaded,) = repo.load(repo.scan([name]))
    return loaded


def copy_artifact(digits_repo: Path, write_model: ModelWriter, name: str, config: str, artifact: str) -> Path:
    directory = write_model(name, config)
    shutil.copy(digits_repo / "digits" / "1" / artifact, directory / "1" / artifact)
    return directory


@pytest.fixture
def onnx_probabilities(digits_repo: Path, write_model: ModelWriter) -> np.ndarray:
    copy_artifact(digits_repo, write_model, "plain", "backend: onnxruntime\n" + IO, "model.onnx")
    return np.asarray(load_one(write_model.root, "plain").model.predict({"input": BATCH})["probabilities"])


def test_onnx_backend_maps_by_name_with_thread_and_optimisation_settings(
    digits_repo: Path, write_model: ModelWriter
) -> None:
    params = "parameters: {intra_op_threads: 1, inter_op_threads: 1, graph_optimization_level: basic, "
    params += "allow_spinning: false}\n"
    copy_artifact(digits_repo, write_model, "plain", "backend: onnxruntime\n" + IO + params, "model.onnx")
    out = load_one(write_model.root, "plain").model.predict({"input": BATCH})
    assert out["probabilities"].shape == (5, 10)
    np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, atol=1e-5)


def test_onnx_name_mismatch_says_which_names_the_graph_has(digits_repo: Path, write_model: ModelWriter) -> None:
    config = "backend: onnxruntime\n" + IO.replace("name: input", "name: pixels")
    copy_artifact(digits_repo, write_model, "renamed", config, "model.onnx")
    with pytest.raises(ModelLoadError, match=r"graph's inputs are \['input'\].*declares \['pixels'\]"):
        load_one(write_model.root, "renamed")


def test_onnx_bad_setting_is_named(digits_repo: Path, write_model: ModelWriter) -> None:
    config = "backend: onnxruntime\n" + IO + "parameters: {graph_optimization_level: turbo}\n"
    copy_artifact(digits_repo, write_model, "m", config, "model.onnx")
    with pytest.raises(ModelLoadError, match="graph_optimization_level: 'turbo'"):
        load_one(write_model.root, "m")


def test_torch_backend_with_safetensors_matches_onnx(
    digits_repo: Path, write_model: ModelWriter, onnx_probabilities: np.ndarray
) -> None:
    config = "backend: torch\n" + IO + "parameters: {module: 'headroom.models.builtin.digits_net:DigitsNet'}\n"
    copy_artifact(digits_repo, write_model, "eager", config, "model.safetensors")
    out = load_one(write_model.root, "eager").model.predict({"input": BATCH})
    np.testing.assert_allclose(out["probabilities"], onnx_probabilities, atol=1e-5)


def test_torchscript_file_is_served(
    digits_repo: Path, write_model: ModelWriter, onnx_probabilities: np.ndarray
) -> None:
    net = DigitsNet()
    net.load_state_dict(load_file(str(digits_repo / "digits" / "1" / "model.safetensors")))
    directory = write_model("scripted", "backend: torch\n" + IO + "parameters: {torchscript: model.ts}\n")
    torch.jit.save(torch.jit.script(net.eval()), str(directory / "1" / "model.ts"))
    out = load_one(write_model.root, "scripted").model.predict({"input": BATCH})
    np.testing.assert_allclose(out["probabilities"], onnx_probabilities, atol=1e-5)


def pickled_state(digits_repo: Path, directory: Path) -> None:
    state = load_file(str(digits_repo / "digits" / "1" / "model.safetensors"))
    torch.save(state, str(directory / "1" / "model.pt"))


def test_pickle_weights_are_refused_by_default(digits_repo: Path, write_model: ModelWriter) -> None:
    params = "parameters: {module: 'headroom.models.builtin.digits_net:DigitsNet', weights: model.pt}\n"
    directory = write_model("pickled", "backend: torch\n" + IO + params)
    pickled_state(digits_repo, directory)
    with pytest.raises(ModelLoadError, match=r"model.pt is a pickle file.*allow_pickle: true"):
        load_one(write_model.root, "pickled")


def test_pickle_weights_load_when_allowed(
    digits_repo: Path, write_model: ModelWriter, onnx_probabilities: np.ndarray
) -> None:
    params = "parameters: {module: 'headroom.models.builtin.digits_net:DigitsNet', weights: model.pt, "
    params += "allow_pickle: true}\n"
    directory = write_model("pickled", "backend: torch\n" + IO + params)
    pickled_state(digits_repo, directory)
    out = load_one(write_model.root, "pickled").model.predict({"input": BATCH})
    np.testing.assert_allclose(out["probabilities"], onnx_probabilities, atol=1e-5)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("{}", r"needs `parameters: \{module:"),
        ("{module: 'headroom.models.builtin.digits_net'}", r"must look like 'package.module:ClassName'"),
        ("{module: 'headroom.models.builtin.digits_net:Nope'}", r"has no attribute 'Nope'"),
        ("{module: 'numpy:ndarray'}", r"is not a torch.nn.Module class"),
        ("{module: 'headroom.models.builtin.digits_net:DigitsNet', weights: missing.safetensors}", "does not exist"),
        ("{module: 'headroom.models.builtin.digits_net:DigitsNet', num_threads: -1}", r"num_threads: expected"),
        ("{model_class: 'headroom.models.builtin.digits:DigitsModel'}", r"must be a subclass of TorchModel"),
    ],
)
def test_torch_config_errors_say_what_to_fix(write_model: ModelWriter, params: str, message: str) -> None:
    write_model("bad", "backend: torch\n" + IO + f"parameters: {params}\n")
    with pytest.raises(ModelLoadError, match=message):
        load_one(write_model.root, "bad")
