"""`headroom models quality`: the quality gate from the command line (a rich progress bar, the JSON result, the
verdict, exit code 1 on failure), on SmolLM2 with a short slice of the corpus."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from headroom.cli.models import app
from headroom.llm.offline import DEFAULT_MODEL
from headroom.llm.quality import RESULT_FILE
from headroom.llm.weights import LoadedCheckpoint, load_checkpoint

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smollm2() -> LoadedCheckpoint:
    """SmolLM2's default cache with its fp32 reference weights (made once)."""
    return load_checkpoint(DEFAULT_MODEL)


def _repository(tmp_path: Path, smollm2: LoadedCheckpoint) -> tuple[Path, Path]:
    """A model repository whose smollm2 uses a cache under tmp_path, linking the default cache's files."""
    assert smollm2.cache_dir is not None
    cache_root = tmp_path / "cache"
    entry = cache_root / "llm" / smollm2.cache_dir.name
    entry.mkdir(parents=True)
    for f in smollm2.cache_dir.iterdir():
        if f.is_file() and f.name != RESULT_FILE:
            (entry / f.name).symlink_to(f)
    repo = tmp_path / "models"
    shutil.copytree(REPO / "models" / "smollm2", repo / "smollm2")
    cfg = yaml.safe_load((repo / "smollm2" / "config.yaml").read_text())
    cfg["parameters"]["cache_dir"] = str(cache_root)
    (repo / "smollm2" / "config.yaml").write_text(yaml.safe_dump(cfg))
    shutil.copytree(REPO / "benchmarks" / "models" / "noop", repo / "noop")
    return repo, entry


def test_quality_command_measures_prints_and_records(tmp_path: Path, smollm2: LoadedCheckpoint) -> None:
    repo, entry = _repository(tmp_path, smollm2)
    args = ["quality", "smollm2", "--model-repository", str(repo), "--window-tokens", "128", "--max-tokens", "384",
            "--num-threads", "1"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    print(result.output[-1500:])
    assert result.exit_code in (0, 1), result.output  # 1 = the gate failed: still measured and recorded
    recorded = json.loads((entry / RESULT_FILE).read_text())["gguf:Q4_1+Q8_0"]
    assert recorded["scored_tokens"] == 3 * 64 and recorded["window_tokens"] == 128
    assert (result.exit_code == 0) == recorded["passed"]
    assert f"smollm2 gguf:Q4_1+Q8_0: {recorded['verdict']}" in " ".join(result.output.split())


def test_quality_command_refuses_models_that_are_not_llms(tmp_path: Path, smollm2: LoadedCheckpoint) -> None:
    repo, _ = _repository(tmp_path, smollm2)
    result = CliRunner().invoke(app, ["quality", "noop", "--model-repository", str(repo)])
    assert result.exit_code == 2 and "is a python model" in result.output
    missing = CliRunner().invoke(app, ["quality", "nope", "--model-repository", str(repo)])
    assert missing.exit_code == 2
