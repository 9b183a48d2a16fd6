"""digits: accuracy through the served ONNX model, transform parity, image bytes, listing-1 responses."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from headroom.core.errors import InvalidRequest
from headroom.models.builtin.digits import DigitsModel, classify_image_bytes, predict_digits
from headroom.models.builtin.digits_build import DigitsTrainingConfig, build_digits, held_out_split
from headroom.models.builtin.digits_transform import decode_image, to_model_input
from headroom.models.classification import ImageClassifier
from headroom.models.repository import LoadedModel, ModelRepository
from headroom.models.warmup import run_pipeline

HeldOut = tuple[np.ndarray, np.ndarray]


@pytest.fixture(scope="module")
def digits(digits_repo: Path) -> LoadedModel:
    repo = ModelRepository(digits_repo)
    (loaded,) = repo.load()
    return loaded


@pytest.fixture(scope="module")
def held_out() -> HeldOut:
    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    return x_test, y_test


def png_of(image_0_16: np.ndarray, *, dark_on_light: bool, scale: int = 4, fmt: str = "PNG") -> bytes:
    """Render an 8x8 0..16 digit as an upscaled 8-bit image, the way a user would upload one."""
    pixels = np.kron(image_0_16, np.ones((scale, scale))) * (255.0 / 16.0)
    if dark_on_light:
        pixels = 255.0 - pixels
    buffer = io.BytesIO()
    Image.fromarray(np.round(pixels).astype(np.uint8), mode="L").save(buffer, format=fmt)
    return buffer.getvalue()


def test_held_out_accuracy_through_the_loaded_onnx_model(digits: LoadedModel, held_out: HeldOut) -> None:
    x_test, y_test = held_out
    accuracy = float((predict_digits(digits, x_test) == y_test).mean())
    assert digits.config.backend == "onnxruntime"
    assert accuracy >= 0.95


def test_build_records_the_accuracy_it_measured(digits_repo: Path) -> None:
    record = json.loads((digits_repo / "digits" / "1" / "build.json").read_text())
    assert record["accuracy"] >= 0.95 and record["num_test"] == 360


def test_rebuild_is_skipped_when_artifacts_match(digits_repo: Path) -> None:
    report = build_digits(digits_repo / "digits" / "1")
    assert report.skipped and report.accuracy >= 0.95


def test_serving_preprocess_is_the_training_transform(digits: LoadedModel, held_out: HeldOut) -> None:
    x_test, _ = held_out
    served = digits.model.preprocess({"input": x_test[:, None, :, :]}, {})["input"]
    np.testing.assert_array_equal(served, to_model_input(x_test))


def test_png_decoding_recovers_the_training_pixels(held_out: HeldOut) -> None:
    x_test, _ = held_out
    for image in x_test[:20]:
        for dark_on_light in (False, True):
            decoded = decode_image(png_of(image, dark_on_light=dark_on_light, scale=1))
            np.testing.assert_allclose(decoded, image, atol=16 / 255)
            np.testing.assert_allclose(to_model_input(decoded[None]), to_model_input(image[None]), atol=0.05)


def test_png_and_jpeg_digits_classify_correctly(digits: LoadedModel, held_out: HeldOut) -> None:
    x_test, y_test = held_out
    model = digits.model
    assert isinstance(model, ImageClassifier)
    for fmt in ("PNG", "JPEG"):
        correct = 0
        for image, label in zip(x_test[:60], y_test[:60], strict=True):
            body = classify_image_bytes(digits, png_of(image, dark_on_light=True, fmt=fmt), top_k=1)
            predictions = body["predictions"]
            assert isinstance(predictions, list)
            correct += predictions[0]["label"] == str(label)
        assert correct / 60 >= 0.95, fmt


def test_image_response_has_listing_one_fields(digits: LoadedModel, held_out: HeldOut) -> None:
    x_test, y_test = held_out
    body = classify_image_bytes(digits, png_of(x_test[0], dark_on_light=False), top_k=3)
    assert set(body) >= {"predictions", "model_version", "inference_time_ms"}
    assert body["model_version"] == "1" and body["model_name"] == "digits" and body["abstained"] is False
    predictions = body["predictions"]
    assert isinstance(predictions, list) and len(predictions) == 3
    confidences = [p["confidence"] for p in predictions]
    assert confidences == sorted(confidences, reverse=True) and 0.0 <= confidences[-1] <= confidences[0] <= 1.0
    assert predictions[0]["label"] == str(y_test[0])


def test_confidence_threshold_can_abstain(digits: LoadedModel) -> None:
    blank = np.zeros((8, 8))
    body = classify_image_bytes(digits, png_of(blank, dark_on_light=False), top_k=10, min_confidence=0.999)
    predictions = body["predictions"]
    assert isinstance(predictions, list)
    assert all(p["confidence"] >= 0.999 for p in predictions)
    assert body["abstained"] is (not predictions)


def test_image_inputs_go_through_the_batched_pipeline(digits: LoadedModel, held_out: HeldOut) -> None:
    x_test, y_test = held_out
    model = digits.model
    assert isinstance(model, DigitsModel)
    items = [model.preprocess(model.image_inputs(png_of(x, dark_on_light=True)), {}) for x in x_test[:5]]
    outputs = model.predict(model.collate(items))
    parts = model.split(outputs, [1] * 5)
    labels = [model.classify(model.postprocess(p, {}), 1, 0.0)[0].label for p in parts]
    assert labels == [str(y) for y in y_test[:5]]


def test_undecodable_bytes_are_a_bad_request(digits: LoadedModel) -> None:
    with pytest.raises(InvalidRequest, match="PNG or JPEG"):
        classify_image_bytes(digits, b"definitely not an image")


def test_wrong_tensor_shape_is_a_bad_request(digits: LoadedModel) -> None:
    with pytest.raises(InvalidRequest, match=r"\[N, 1, 8, 8\]"):
        run_pipeline(digits.model, {"input": np.zeros((2, 1, 4, 4), np.float32)})


def test_cold_start_stages_are_timed(digits: LoadedModel) -> None:
    assert [s.name for s in digits.cold_start] == ["read_weights", "build_session", "warmup"]
    assert all(s.duration_s >= 0 for s in digits.cold_start)
    assert digits.warmup_batch_sizes == (1, 8, 32)


def test_training_is_deterministic() -> None:
    from headroom.models.builtin.digits_build import train

    cfg = DigitsTrainingConfig(epochs=2)
    first, second = train(cfg).state_dict(), train(cfg).state_dict()
    assert first.keys() == second.keys()
    assert all(bool((first[k] == second[k]).all()) for k in first)
