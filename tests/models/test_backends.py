"""onnxruntime and torch backends on the digits artifacts; the pickle guard; model_class checks."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from headroom.models.artifacts import ModelLoadError
from headroom.models.backends.torch_backend import TorchModel
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


# --- runtime: section (headroom.models.runtime): engine choice and knobs -----------------------------------------

DIGITS_TORCH_PARAMS = (
    "parameters: {model_class: 'headroom.models.builtin.runtime_variants:DigitsTorchModel', "
    "module: 'headroom.models.builtin.digits_net:DigitsNet', weights: model.safetensors}\n"
)


@pytest.mark.parametrize(
    ("backend", "runtime", "message"),
    [
        ("torch", "{mode: jit}", r"runtime.mode: 'jit' is not one of eager, compile"),
        ("torch", "{compile_backend: tvm}", r"compile_backend: 'tvm' is not one of"),
        ("torch", "{compile_dynamic: 'yes'}", r"compile_dynamic: expected true or false"),
        ("torch", "{precision: fp16}", r"precision: 'fp16' is not one of fp32, bf16"),
        ("torch", "{graph_optimization_level: all}", r"only apply to the onnxruntime backend.*'torch'"),
        ("onnxruntime", "{mode: compile}", r"only apply to the torch backend.*'onnxruntime'"),
        ("onnxruntime", "{graph_optimization_level: max}", r"'max' is not one of disable, basic, extended, all"),
        ("onnxruntime", "{intra_op_threads: -2}", r"intra_op_threads: expected an integer >= 0"),
        ("onnxruntime", "{execution_provider: cuda}", r"execution_provider: expected an onnxruntime provider"),
        ("onnxruntime", "{optimized_model_cache: 1}", r"optimized_model_cache: expected true or false"),
        ("onnxruntime", "{turbo: true}", r"unknown keys \['turbo'\]"),
        ("onnxruntime", "{intra_op_thread: 2}", r"unknown keys \['intra_op_thread'\]; did you mean 'intra_op_threads'"),
        ("onnxruntime", "[compile]", r"runtime: must be a mapping"),
    ],
)
def test_runtime_section_errors_name_the_key(write_model: ModelWriter, backend: str, runtime: str,
                                             message: str) -> None:
    write_model("bad", f"backend: {backend}\n" + IO + f"runtime: {runtime}\n")
    with pytest.raises(ValueError, match=message):
        ModelRepository(write_model.root).scan(["bad"])


def test_unavailable_execution_provider_lists_the_available_ones(
    digits_repo: Path, write_model: ModelWriter
) -> None:
    config = "backend: onnxruntime\n" + IO + "runtime: {execution_provider: TensorrtExecutionProvider}\n"
    copy_artifact(digits_repo, write_model, "m", config, "model.onnx")
    with pytest.raises(ModelLoadError, match=r"'TensorrtExecutionProvider' is not available.*CPUExecutionProvider"):
        load_one(write_model.root, "m")


def test_onnx_runtime_knobs_give_the_same_outputs(
    digits_repo: Path, write_model: ModelWriter, onnx_probabilities: np.ndarray
) -> None:
    runtime = "runtime: {graph_optimization_level: disable, intra_op_threads: 1, inter_op_threads: 2}\n"
    copy_artifact(digits_repo, write_model, "knobs", "backend: onnxruntime\n" + IO + runtime, "model.onnx")
    out = load_one(write_model.root, "knobs").model.predict({"input": BATCH})
    np.testing.assert_allclose(out["probabilities"], onnx_probabilities, atol=1e-5)


def test_optimized_graph_is_cached_then_reused(
    digits_repo: Path, write_model: ModelWriter, onnx_probabilities: np.ndarray, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    runtime = f"runtime: {{optimized_model_cache: true, cache_dir: '{cache}'}}\n"
    copy_artifact(digits_repo, write_model, "opt", "backend: onnxruntime\n" + IO + runtime, "model.onnx")
    first = load_one(write_model.root, "opt")
    assert first.model.optimized_graph_cache == "miss (written)"  # type: ignore[attr-defined]
    (saved,) = (cache / "runtimes" / "onnx").glob("opt-*.onnx")
    assert saved.stat().st_size > 0 and not list(saved.parent.glob(".*partial"))
    second = load_one(write_model.root, "opt")
    assert second.model.optimized_graph_cache == "hit"  # type: ignore[attr-defined]
    for loaded in (first, second):
        out = loaded.model.predict({"input": BATCH})
        np.testing.assert_allclose(out["probabilities"], onnx_probabilities, atol=1e-5)
    # a different optimization level is a different graph: its own cache entry
    copy_artifact(digits_repo, write_model, "opt", "backend: onnxruntime\n" + IO
                  + runtime.replace("{", "{graph_optimization_level: basic, "), "model.onnx")
    assert load_one(write_model.root, "opt").model.optimized_graph_cache == "miss (written)"  # type: ignore[attr-defined]
    assert len(list((cache / "runtimes" / "onnx").glob("opt-*.onnx"))) == 2


def test_digits_under_torch_runtime_classifies_like_onnx(digits_repo: Path, write_model: ModelWriter) -> None:
    from sklearn.datasets import load_digits

    from headroom.models.warmup import run_pipeline

    copy_artifact(digits_repo, write_model, "digits_torch", "backend: torch\n" + IO + DIGITS_TORCH_PARAMS,
                  "model.safetensors")
    images = load_digits().images[:16, None].astype(np.float32)  # raw 0..16 intensities: the transform runs
    onnx = load_one(digits_repo, "digits")
    torch_model = load_one(write_model.root, "digits_torch")
    expected = run_pipeline(onnx.model, {"input": images})["probabilities"]
    got = run_pipeline(torch_model.model, {"input": images})["probabilities"]
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_digits_served_in_bf16_keeps_its_held_out_accuracy(digits_repo: Path, write_model: ModelWriter) -> None:
    """`runtime: {precision: bf16}`: weights and inputs in bfloat16, probabilities back as float32; the
    accuracy on held-out digits stays within the gate's 1% of fp32 while the outputs are not bit-identical."""
    from headroom.models.builtin.digits_build import DigitsTrainingConfig, held_out_split
    from headroom.models.warmup import run_pipeline

    for name, runtime in (("fp32", ""), ("bf16", "runtime: {precision: bf16}\n")):
        copy_artifact(digits_repo, write_model, name, "backend: torch\n" + IO + runtime + DIGITS_TORCH_PARAMS,
                      "model.safetensors")
    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    probs = {name: run_pipeline(load_one(write_model.root, name).model, {"input": x_test[:, None]})["probabilities"]
             for name in ("fp32", "bf16")}
    assert probs["bf16"].dtype == np.float32
    assert not np.array_equal(probs["bf16"], probs["fp32"])  # it really ran in bfloat16
    accuracy = {name: float((p.argmax(axis=1) == y_test).mean()) for name, p in probs.items()}
    assert accuracy["fp32"] >= 0.95 and accuracy["bf16"] >= accuracy["fp32"] - 0.01, accuracy


def test_torch_compile_gives_eager_outputs_and_compiles_at_load(
    digits_repo: Path, write_model: ModelWriter, onnx_probabilities: np.ndarray, tmp_path: Path
) -> None:
    # the dynamo front end with the `eager` backend: the whole compile path, without inductor's C++ build
    runtime = f"runtime: {{mode: compile, compile_backend: eager, cache_dir: '{tmp_path}'}}\n"
    copy_artifact(digits_repo, write_model, "compiled", "backend: torch\n" + IO + runtime + DIGITS_TORCH_PARAMS,
                  "model.safetensors")
    loaded = load_one(write_model.root, "compiled")
    stages = [s.name for s in loaded.cold_start]
    assert stages.index("build_session") < stages.index("compile") < stages.index("warmup")
    assert isinstance(loaded.model, TorchModel) and loaded.model.module is not None
    assert type(loaded.model.module).__name__ == "OptimizedModule"
    for size in (1, 3, 5):  # batch sizes it was not warmed up with reuse the dynamic graph
        out = loaded.model.predict({"input": BATCH[:size]})
        np.testing.assert_allclose(out["probabilities"], onnx_probabilities[:size], atol=1e-5)


def test_compile_is_refused_for_a_class_that_would_ignore_it(write_model: ModelWriter) -> None:
    config = "backend: torch\n" + IO + "runtime: {mode: compile}\n"
    config += "parameters: {model_class: 'headroom.models.builtin.minilm:MiniLMModel'}\n"
    write_model("m", config)
    with pytest.raises(ModelLoadError, match=r"overrides load\(\) without applying `runtime:`.*MiniLMTorchModel"):
        load_one(write_model.root, "m")


def test_minilm_torch_runtime_matches_onnx(minilm_repo: Path) -> None:
    from headroom.models.warmup import run_pipeline

    config = (minilm_repo / "minilm_torch" / "config.yaml").read_text()
    root = minilm_repo.parent / "minilm_runtime_repo"
    (root / "minilm_rt" / "1").mkdir(parents=True, exist_ok=True)
    (root / "minilm_rt" / "config.yaml").write_text(
        config.replace("minilm:MiniLMModel", "runtime_variants:MiniLMTorchModel") + "runtime: {intra_op_threads: 1}\n"
    )
    text = {"text": np.array([[b"a short sentence"], [b"and another, somewhat longer, sentence here"]],
                             dtype=object)}
    got = run_pipeline(load_one(root, "minilm_rt").model, text)["embedding"]
    expected = run_pipeline(load_one(minilm_repo, "minilm").model, text)["embedding"]
    np.testing.assert_allclose(got, expected, atol=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_inductor_compile_caches_artifacts_for_a_restart(digits_repo: Path, write_model: ModelWriter,
                                                         tmp_path: Path) -> None:
    """Real inductor (C++ build): the first load writes the artifacts, a fresh process reads them."""
    import json
    import subprocess
    import sys

    runtime = f"runtime: {{mode: compile, cache_dir: '{tmp_path / 'cache'}'}}\n"
    copy_artifact(digits_repo, write_model, "ind", "backend: torch\n" + IO + runtime + DIGITS_TORCH_PARAMS,
                  "model.safetensors")
    script = (
        "import sys, json; from pathlib import Path; import numpy as np\n"
        "from headroom.models.repository import ModelRepository\n"
        "repo = ModelRepository(Path(sys.argv[1])); (m,) = repo.load(repo.scan(['ind']))\n"
        "x = np.linspace(-1, 2, 5 * 64, dtype=np.float32).reshape(5, 1, 8, 8)\n"
        "print(json.dumps({'cache': m.model.compile_cache, 'out': m.model.predict({'input': x})"
        "['probabilities'].tolist()}))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    runs = []
    for i in (1, 2):  # each "restart" gets an empty inductor scratch dir: only headroom's cache carries over
        env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / f"inductor-{i}")
        done = subprocess.run([sys.executable, "-c", script, str(write_model.root)], capture_output=True, text=True,
                              env=env, timeout=600, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0]["cache"] == "miss (written)" and runs[1]["cache"] == "hit"
    assert list((tmp_path / "cache" / "runtimes" / "torch").glob("ind-*.bin"))
    copy_artifact(digits_repo, write_model, "eager", "backend: torch\n" + IO + DIGITS_TORCH_PARAMS, "model.safetensors")
    x = np.linspace(-1, 2, 5 * 64, dtype=np.float32).reshape(5, 1, 8, 8)
    eager = load_one(write_model.root, "eager").model.predict({"input": x})["probabilities"]
    for run in runs:  # compiled (fresh and from the cache) == eager
        np.testing.assert_allclose(run["out"], eager, atol=1e-5)
