"""Precision cascade: INT8 first, FP32 for exactly the rows whose confidence is below τ."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from headroom.lifecycle.cascade import CascadeModel, DigitsCascadeModel, recompute_mask, top1_confidence
from headroom.lifecycle.int8_builtin import quantize_digits
from headroom.lifecycle.quantize import QuantizeConfig
from headroom.models.artifacts import ModelLoadError
from headroom.models.base import Arrays, LoadContext, Model
from headroom.models.builtin.digits import DigitsModel, predict_digits
from headroom.models.builtin.digits_build import DigitsTrainingConfig, held_out_split
from headroom.models.config import load_model_config
from headroom.models.repository import ModelRepository


class RecordingModel(Model):
    """Delegates to a real model and keeps every batch it was asked to predict."""

    def __init__(self, inner: Model) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self.batches: list[Arrays] = []

    def predict(self, batch: Arrays) -> Arrays:
        self.batches.append({k: np.array(v) for k, v in batch.items()})
        return self.inner.predict(batch)


@pytest.fixture(scope="module")
def cascade_dir(digits_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A digits repository copy whose version 1 also holds model.int8.onnx (static, gated)."""
    root = tmp_path_factory.mktemp("cascade_repo")
    shutil.copytree(digits_repo / "digits", root / "digits")
    quantize_digits(root / "digits" / "1", QuantizeConfig(mode="static"))
    return root


def _loaded(root: Path, model_file: str) -> DigitsModel:
    config = load_model_config(root / "digits")
    config = dataclasses.replace(config, parameters={**config.parameters, "model_file": model_file})
    model = DigitsModel(config)
    model.load(LoadContext(config, root / "digits" / "1", lambda stage: None))
    return model


def test_recompute_mask_is_confidence_strictly_below_tau() -> None:
    conf = np.array([0.5, 0.95, np.nan, 0.9, 0.89999])
    assert recompute_mask(conf, 0.9).tolist() == [True, False, True, False, True]
    assert not recompute_mask(conf[[0, 1, 3]], 0.0).any()
    with pytest.raises(ValueError, match="tau"):
        recompute_mask(conf, 1.5)


def test_cascade_recomputes_exactly_the_low_confidence_rows(cascade_dir: Path) -> None:
    fast, accurate = _loaded(cascade_dir, "model.int8.onnx"), _loaded(cascade_dir, "model.onnx")
    spy = RecordingModel(accurate)
    cascade = CascadeModel(fast, spy, tau=0.0)
    _, _, x_test, _ = held_out_split(DigitsTrainingConfig())
    batch = cascade.preprocess({"input": x_test[:, None]}, {})
    fast_out = fast.predict(batch)
    conf = top1_confidence()(fast_out)
    tau = float(np.quantile(conf, 0.2))  # about a fifth of the rows are "unsure"
    cascade.tau = tau
    expected = conf < tau
    assert 0 < expected.sum() < len(expected)

    out = cascade.predict(batch)

    (seen,) = spy.batches
    np.testing.assert_array_equal(seen["input"], batch["input"][expected])
    fp32 = accurate.predict(batch)["probabilities"]
    np.testing.assert_array_equal(out["probabilities"][expected], fp32[expected])
    np.testing.assert_array_equal(out["probabilities"][~expected], fast_out["probabilities"][~expected])
    counts = cascade.counts()
    assert (counts.batches, counts.items, counts.recomputed) == (1, len(x_test), int(expected.sum()))
    assert counts.recompute_fraction == pytest.approx(expected.mean())


def test_confident_batches_never_touch_the_accurate_model(cascade_dir: Path) -> None:
    spy = RecordingModel(_loaded(cascade_dir, "model.onnx"))
    cascade = CascadeModel(_loaded(cascade_dir, "model.int8.onnx"), spy, tau=0.0)
    _, _, x_test, _ = held_out_split(DigitsTrainingConfig())
    cascade.predict(cascade.preprocess({"input": x_test[:16, None]}, {}))
    assert spy.batches == [] and cascade.counts().recomputed == 0


def test_digits_cascade_serves_through_the_repository(cascade_dir: Path) -> None:
    config_path = cascade_dir / "digits" / "config.yaml"
    config_path.write_text(
        config_path.read_text().replace(
            "headroom.models.builtin.digits:DigitsModel", "headroom.lifecycle.cascade:DigitsCascadeModel"
        )
        + "  cascade_tau: 0.95\n"
    )
    repo = ModelRepository(cascade_dir)
    (loaded,) = repo.load(repo.scan(["digits"]))
    model = loaded.model
    assert isinstance(model, DigitsCascadeModel) and model.cascade is not None
    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    accuracy = float((predict_digits(loaded, x_test) == y_test).mean())
    assert accuracy >= 0.95
    counts = model.cascade.counts()
    assert counts.items >= len(x_test) and 0 < counts.recomputed < counts.items
    loaded.unload()
    assert model.cascade is None


def test_digits_cascade_refuses_a_bad_tau(cascade_dir: Path) -> None:
    config = load_model_config(cascade_dir / "digits")
    config = dataclasses.replace(config, parameters={**config.parameters, "cascade_tau": 2})
    with pytest.raises(ModelLoadError, match="cascade_tau"):
        DigitsCascadeModel(config).load(LoadContext(config, cascade_dir / "digits" / "1", lambda stage: None))
