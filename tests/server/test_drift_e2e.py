"""Lifecycle monitoring in a real server on digits: the input-drift monitor (PSI gauges, one warning on a
shift) and the precision cascade's counters (recomputed items = the INT8 model's low-confidence items)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from headroom.lifecycle.digits_reference import write_drift_reference
from headroom.lifecycle.int8_builtin import quantize_digits
from headroom.lifecycle.quantize import QuantizeConfig
from headroom.models.builtin.digits_build import ARTIFACTS, DigitsTrainingConfig, build_digits, held_out_split, is_built
from headroom.models.builtin.digits_transform import to_model_input
from tests.support.server import RunningServer, run_server

PROJECT_MODELS = Path(__file__).resolve().parents[2] / "models"
TAU = 0.9  # the cascade's confidence threshold
ROWS_PER_REQUEST = 24  # fixed request size, so the served batches equal the ones the expectation is computed on


def _digits_version(dest: Path) -> None:
    built = PROJECT_MODELS / "digits" / "1"
    if is_built(built):
        dest.mkdir(parents=True)
        for name in ARTIFACTS:
            shutil.copy(built / name, dest / name)
    else:
        build_digits(dest, DigitsTrainingConfig())


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("monitor_repo")
    config = yaml.safe_load((PROJECT_MODELS / "digits" / "config.yaml").read_text())
    (root / "digits").mkdir()
    (root / "digits" / "config.yaml").write_text(yaml.safe_dump(config))
    _digits_version(root / "digits" / "1")
    write_drift_reference(root / "digits" / "1")  # what `headroom build-models` ships
    cascade = {**config, "warmup": {"batch_sizes": [1]}, "parameters": {
        **config["parameters"], "model_class": "headroom.lifecycle.cascade:DigitsCascadeModel",
        "fast_model_file": "model.int8.onnx", "accurate_model_file": "model.onnx", "cascade_tau": TAU}}
    (root / "cascade").mkdir()
    (root / "cascade" / "config.yaml").write_text(yaml.safe_dump(cascade))
    shutil.copytree(root / "digits" / "1", root / "cascade" / "1", ignore=shutil.ignore_patterns("drift_*"))
    quantize_digits(root / "cascade" / "1", QuantizeConfig(mode="static"))
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(repo, tmp_path_factory.mktemp("logs"), ["--grpc-port", "-1", "--drift-threshold-psi", "0.2"],
                    ) as running:
        yield running


def _send(url: str, model: str, images: np.ndarray) -> np.ndarray:
    """Serve [N, 8, 8] images in requests of ROWS_PER_REQUEST; returns the probabilities."""
    out = []
    for start in range(0, len(images), ROWS_PER_REQUEST):
        chunk = np.asarray(images[start:start + ROWS_PER_REQUEST], dtype=np.float32)
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [len(chunk), 1, 8, 8],
                            "data": chunk.reshape(-1).tolist()}]}
        response = httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
        out.append(np.asarray(response.json()["outputs"][0]["data"], dtype=np.float32).reshape(len(chunk), 10))
    return np.concatenate(out)


def _metric(url: str, name: str, labels: dict[str, str]) -> float | None:
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def _wait_for_psi(url: str, check: Callable[[float], bool], what: str) -> float:
    """Poll the mean-PSI gauge until `check(value)` holds (the monitor runs off the request path)."""
    deadline = time.monotonic() + 60
    value = None
    while time.monotonic() < deadline:
        value = _metric(url, "headroom_input_drift_psi_mean", {"model": "digits"})
        if value is not None and check(value):
            return value
        time.sleep(0.1)
    raise AssertionError(f"mean PSI never became {what}; last value {value}")


def test_in_distribution_digits_keep_psi_low_and_inverted_ones_raise_it_and_warn_once(
    server: RunningServer,
) -> None:
    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    probs = _send(server.url, "digits", x_test[:240])
    assert (probs.argmax(axis=1) == y_test[:240]).mean() > 0.95  # the monitor does not change answers
    low = _wait_for_psi(server.url, lambda v: True, "exported")
    assert low < 0.2
    per_feature = _metric(server.url, "headroom_input_drift_psi", {"model": "digits", "feature": "mean"})
    assert per_feature is not None and per_feature < 0.2
    assert "input drift on model 'digits'" not in server.log()

    _send(server.url, "digits", 16.0 - x_test[:240])  # inverted: dark ink on a bright background
    high = _wait_for_psi(server.url, lambda v: v > 0.5, "> 0.5")  # half the window inverted: ~0.75
    assert high > 0.5
    assert _metric(server.url, "headroom_input_drift_alerts_total", {"model": "digits"}) == 1.0
    assert server.log().count("input drift on model 'digits'") == 1


def test_cascade_recomputes_exactly_the_low_confidence_items(server: RunningServer, repo: Path) -> None:
    import onnxruntime as ort

    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    labels = {"model": "cascade", "version": "1"}
    before_fast = _metric(server.url, "headroom_cascade_items_total", {**labels, "path": "fast"}) or 0.0
    before_redo = _metric(server.url, "headroom_cascade_items_total", {**labels, "path": "recomputed"}) or 0.0
    probs = _send(server.url, "cascade", x_test)
    assert (probs.argmax(axis=1) == y_test).mean() > 0.95

    int8 = ort.InferenceSession(str(repo / "cascade" / "1" / "model.int8.onnx"), providers=["CPUExecutionProvider"])
    low_confidence = 0
    for start in range(0, len(x_test), ROWS_PER_REQUEST):  # the same batches the server ran
        (fast,) = int8.run(["probabilities"], {"input": to_model_input(x_test[start:start + ROWS_PER_REQUEST])})
        low_confidence += int((fast.max(axis=1) < TAU).sum())
    redo = (_metric(server.url, "headroom_cascade_items_total", {**labels, "path": "recomputed"}) or 0.0) - before_redo
    fast_only = (_metric(server.url, "headroom_cascade_items_total", {**labels, "path": "fast"}) or 0.0) - before_fast
    assert 0 < low_confidence < len(x_test)
    assert redo == low_confidence
    assert fast_only == len(x_test) - low_confidence
    assert _metric(server.url, "headroom_cascade_tau", labels) == pytest.approx(TAU)
