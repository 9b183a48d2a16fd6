"""`headroom batch` body: runs a repository model over an .npz dataset into a SQLite store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import typer
from typer.testing import CliRunner

from headroom.lifecycle.batch_cli import batch
from headroom.lifecycle.offline import PredictionLookup, PredictionStore
from headroom.models.builtin.digits_build import DigitsTrainingConfig, held_out_split

app = typer.Typer()
app.command()(batch)


def _text(output: str) -> str:
    """Rich wraps long lines to the terminal width; compare with whitespace collapsed."""
    return " ".join(output.split())


def test_batch_writes_a_store_the_lookup_can_answer_from(digits_repo: Path, tmp_path: Path) -> None:
    _, _, x_test, _ = held_out_split(DigitsTrainingConfig())
    images = x_test[:70, None].astype(np.float32)
    np.savez(tmp_path / "data.npz", input=images)
    out = tmp_path / "p.sqlite"
    args = ["digits", "--dataset", str(tmp_path / "data.npz"), "--output", str(out)]
    result = CliRunner().invoke(app, [*args, "--model-repository", str(digits_repo)])
    assert result.exit_code == 0, result.output
    assert "70 items computed in 3 batches of up to 32" in _text(result.output)
    again = CliRunner().invoke(app, [*args, "--model-repository", str(digits_repo)])
    assert "0 items computed" in _text(again.output) and "70 already stored" in _text(again.output)
    store = PredictionStore(out)
    assert store.count("digits") == 70
    assert PredictionLookup(store, "digits", "1").lookup({"input": images[5:6]}) is not None


def test_batch_explains_a_dataset_with_the_wrong_names(digits_repo: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "data.npz", pixels=np.zeros((2, 1, 8, 8), np.float32))
    args = ["digits", "--dataset", str(tmp_path / "data.npz"), "--model-repository", str(digits_repo)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "name them alike" in _text(result.output)
