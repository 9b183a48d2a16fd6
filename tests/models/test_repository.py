"""The repository: scanning, version policies, the python backend, errors that say what to fix."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from headroom.models.artifacts import ModelLoadError
from headroom.models.repository import ModelRepository
from headroom.models.warmup import run_pipeline
from tests.models.conftest import ModelWriter

ECHO_CONFIG = """
backend: python
max_batch_size: 8
inputs: [{name: x, datatype: FP32, shape: [3]}]
outputs: [{name: y, datatype: FP32, shape: [3]}]
warmup: {batch_sizes: [1, 4]}
"""

ECHO_MODEL = """
import numpy as np

class Doubler:
    def load(self, context):
        self.factor = float(context.config.parameters.get("factor", 2.0))
        self.version = context.version_dir.name

    def predict(self, inputs):
        return {"y": inputs["x"] * self.factor}
"""


def test_new_directory_with_a_python_class_is_served_without_code_change(write_model: ModelWriter) -> None:
    write_model("doubler", ECHO_CONFIG + "parameters: {factor: 3.0}\n", {"model.py": ECHO_MODEL})
    repo = ModelRepository(write_model.root)
    (loaded,) = repo.load()
    assert (loaded.name, loaded.version) == ("doubler", "1")
    out = run_pipeline(loaded.model, {"x": np.array([[1.0, 2.0, 3.0]], np.float32)})
    np.testing.assert_array_equal(out["y"], [[3.0, 6.0, 9.0]])
    assert [s.name for s in loaded.cold_start] == ["read_weights", "build_session", "warmup"]
    assert loaded.warmup_batch_sizes == (1, 4)
    # each warmup batch is timed: the batcher's first service-time estimate (never 0)
    assert len(loaded.warmup_batch_s) == 2 and all(s > 0 for s in loaded.warmup_batch_s)
    assert loaded.warmup_batches == ((4, loaded.warmup_batch_s[1]),)  # the first, cold run is left out
    loaded.unload()


def test_python_model_hooks_preprocess_and_postprocess(write_model: ModelWriter) -> None:
    source = (
        ECHO_MODEL
        + """
    def preprocess(self, inputs, parameters):
        return {"x": inputs["x"] + 1}

    def postprocess(self, outputs, parameters):
        return {"y": outputs["y"] - 1}
"""
    )
    write_model("hooks", ECHO_CONFIG, {"model.py": source})
    (loaded,) = ModelRepository(write_model.root).load()
    out = run_pipeline(loaded.model, {"x": np.zeros((2, 3), np.float32)})
    np.testing.assert_array_equal(out["y"], np.ones((2, 3)))


def test_latest_version_is_the_default_and_all_or_specific_can_be_asked(write_model: ModelWriter) -> None:
    for version in (1, 3, 2):
        write_model("m", ECHO_CONFIG, {"model.py": ECHO_MODEL}, version=version)
    repo = ModelRepository(write_model.root)
    entry = repo.scan().models[0]
    assert entry.available_versions == (1, 2, 3) and entry.versions == (3,)
    assert [m.version for m in repo.load()] == ["3"]
    write_model("m", ECHO_CONFIG + "version_policy: {all: {}}\n")
    assert repo.scan().models[0].versions == (1, 2, 3)
    write_model("m", ECHO_CONFIG + "version_policy: {specific: [1, 3]}\n")
    loaded = repo.load()
    assert [m.version for m in loaded] == ["1", "3"]
    assert [m.model.predict({"x": np.ones((1, 3), np.float32)})["y"][0, 0] for m in loaded] == [2.0, 2.0]


def test_llm_configs_are_listed_apart_and_not_loaded(write_model: ModelWriter) -> None:
    write_model("echo", ECHO_CONFIG, {"model.py": ECHO_MODEL})
    llm = "backend: llm\ninputs: [{name: text_input, datatype: BYTES, shape: [1]}]\n"
    llm += "outputs: [{name: text_output, datatype: BYTES, shape: [1]}]\n"
    (write_model.root / "chat").mkdir()
    (write_model.root / "chat" / "config.yaml").write_text(llm)
    repo = ModelRepository(write_model.root)
    index = repo.scan()
    assert [m.name for m in index.models] == ["echo"]
    assert [m.name for m in index.llm_models] == ["chat"]
    assert [m.name for m in repo.load(index)] == ["echo"]


def test_async_load_runs_in_threads_and_returns_every_model(write_model: ModelWriter) -> None:
    write_model("a", ECHO_CONFIG, {"model.py": ECHO_MODEL})
    write_model("b", ECHO_CONFIG, {"model.py": ECHO_MODEL})
    loaded = asyncio.run(ModelRepository(write_model.root).load_async())
    assert sorted(m.name for m in loaded) == ["a", "b"]


def test_project_repository_scans_cleanly(project_models: Path) -> None:
    index = ModelRepository(project_models).scan()
    names = {m.name for m in index.models}
    assert {"digits", "minilm"} <= names and "noop" not in names  # noop is a benchmark fixture
    assert all(m.config.backend != "llm" for m in index.models)


def test_noop_example_returns_its_input(project_models: Path) -> None:
    repo = ModelRepository(project_models.parent / "benchmarks" / "models")
    (noop,) = repo.load(repo.scan(["noop"]))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run_pipeline(noop.model, {"input": x})["output"], x)


@pytest.mark.parametrize(
    ("config", "files", "message"),
    [
        ("backend: tensorflow\n" + ECHO_CONFIG.split("\n", 2)[2], {}, r"config.yaml.backend: 'tensorflow'"),
        (ECHO_CONFIG.replace("FP32, shape: [3]}]\nout", "FLOAT, shape: [3]}]\nout"), {}, r"inputs\[0\].datatype"),
        (ECHO_CONFIG + "version_policy: {newest: 1}\n", {}, r"version_policy"),
        ("backend: python\n  bad: [yaml", {}, "not valid YAML"),
        (ECHO_CONFIG, {}, r"model.py does not exist"),
        (ECHO_CONFIG, {"model.py": "class A:\n    pass\n"}, r"exactly one class with a predict\(\) method"),
        (ECHO_CONFIG, {"model.py": "import not_a_module_anywhere\n"}, r"model.py: importing it failed"),
        (
            ECHO_CONFIG,
            {"model.py": "class M:\n    def predict(self, inputs):\n        return {'z': inputs['x']}\n"},
            r"declares \['y'\]",
        ),
        (
            ECHO_CONFIG,
            {
                "model.py": "class M:\n    def load(self):\n        raise RuntimeError('no gpu')\n"
                "    def predict(self, inputs):\n        return inputs\n"
            },
            r"M.load\(\) failed: RuntimeError: no gpu",
        ),
    ],
)
def test_config_and_model_errors_name_the_file_and_the_fix(
    write_model: ModelWriter, config: str, files: dict[str, str], message: str
) -> None:
    write_model("broken", config, files)
    with pytest.raises(ValueError, match=message) as info:
        repo = ModelRepository(write_model.root)
        repo.load(repo.scan())
    assert "broken" in str(info.value)


def test_missing_version_directory_says_where_to_put_files(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text(ECHO_CONFIG)
    with pytest.raises(ModelLoadError, match=r"numbered subdirectory such as .*m/1"):
        ModelRepository(tmp_path).scan()


def test_missing_repository_tells_how_to_create_it(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="headroom build-models"):
        ModelRepository(tmp_path / "nope").scan()


def test_unknown_model_name_is_reported(write_model: ModelWriter) -> None:
    write_model("a", ECHO_CONFIG, {"model.py": ECHO_MODEL})
    with pytest.raises(ModelLoadError, match=r"no model directory named \['zzz'\]"):
        ModelRepository(write_model.root).scan(["zzz"])


def test_unloading_an_old_copy_keeps_the_new_copys_module_importable(write_model: ModelWriter) -> None:
    # pickle (and multiprocessing, typing, dataclasses) find a class's module through sys.modules
    source = "import pickle\n\nclass Thing:\n    pass\n\nclass M:\n    def predict(self, inputs):\n"
    source += "        pickle.dumps(Thing())\n        return {'y': inputs['x']}\n"
    write_model("m", ECHO_CONFIG, {"model.py": source})
    repo = ModelRepository(write_model.root)
    old, new = repo.load()[0], repo.load()[0]  # a reload of the same version
    old.unload()
    out = run_pipeline(new.model, {"x": np.ones((1, 3), np.float32)})
    np.testing.assert_array_equal(out["y"], np.ones((1, 3)))
