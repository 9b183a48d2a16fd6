"""The native default's weights: a GGUF's tensors in the file's own formats, memory-mapped, nothing converted.

`load_native(spec)` maps the file (`headroom.llm.gguf_file`) and returns every decoder matrix as a
`QTensor` (Q4_0 / Q4_1 / Q8_0 / F16 / F32 rows, `headroom.llm.quant_blocks`) under its Hugging Face name,
plus the norms (and biases) as fp32 vectors. The data are views of the file's pages (shared with any other
process mapping it, paid for as they are touched), except llama's q/k matrices: their rows are
reverse-permuted from llama.cpp's interleaved-RoPE order to the rotate-half order the kernels use, which
moves whole rows (= whole blocks), so it is a row gather into a small private copy (~8 MB for SmolLM2, 2% of
the file), never a dequantisation. A tied `lm_head` is the embedding's `QTensor` itself.

The first load of a GGUF still writes its config and tokenizer into the cache (`weights.gguf_cache`); no
weight is ever written to disk for this mode.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from headroom.llm.config import DecoderConfig
from headroom.llm.gguf_file import GGUFFile, GGUFTensor, read_gguf
from headroom.llm.quant_blocks import QTensor
from headroom.llm.weights import (
    TokenizerFiles,
    gguf_cache,
    gguf_decoder_config,
    hf_name,
    read_cached_config,
    resolve_model_path,
    row_order,
)


@dataclass(frozen=True, slots=True)
class NativeCheckpoint:
    """A GGUF ready for the native kernels: architecture, block-format matrices, fp32 vectors, tokenizer."""

    config: DecoderConfig  # the architecture
    matrices: dict[str, QTensor]  # HF name -> weight matrix in its GGUF format (lm_head present, tied or not)
    vectors: dict[str, np.ndarray]  # HF name -> fp32 vector (norm weights, q/k/v biases)
    tokenizer: TokenizerFiles  # tokenizer files and chat metadata
    source: Path  # the GGUF file
    stages_s: dict[str, float] = field(default_factory=dict)  # cold-start stage -> seconds
    cache_dir: Path | None = None  # the GGUF's cache (config, tokenizer, quality results)

    @property
    def weight_format(self) -> str:
        """What `headroom models list` and `/v1/models` show, e.g. "gguf:Q4_1+Q8_0" (see `weight_format`)."""
        return weight_format(self.matrices)


def weight_format(matrices: dict[str, QTensor]) -> str:
    """"gguf:" + the matrices' formats, the most common first (SmolLM2: Q4_1 linears, a Q8_0 embedding)."""
    counts = Counter(q.fmt for q in {id(q): q for q in matrices.values()}.values())
    return "gguf:" + "+".join(fmt for fmt, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def load_native(spec: str, cache_root: Path | None = None) -> NativeCheckpoint:
    """Map a `.gguf` file (a path or `package:NAME/FILE`) for the native kernels."""
    path = resolve_model_path(spec)
    if path.is_dir() or path.suffix != ".gguf":
        raise ValueError(
            f"{spec}: weight_dtype native runs GGUF files only (Q4_0/Q4_1/Q8_0/F16/F32); "
            "for a Hugging Face directory use weight_dtype: fp32"
        )
    stages: dict[str, float] = {}
    cache = gguf_cache(path, cache_root, stages)
    config, tokenizer = read_cached_config(cache, stages)
    start = time.monotonic()
    gguf = read_gguf(path)
    stages["map_gguf"] = time.monotonic() - start
    start = time.monotonic()
    matrices, vectors = native_tensors(gguf, config)
    stages["native_weights"] = time.monotonic() - start
    return NativeCheckpoint(config, matrices, vectors, tokenizer, path, stages, cache)


def native_tensors(gguf: GGUFFile, config: DecoderConfig) -> tuple[dict[str, QTensor], dict[str, np.ndarray]]:
    """Every decoder tensor of `gguf` under its HF name: matrices as `QTensor`s, vectors as fp32."""
    if gguf_decoder_config(gguf) != config:
        raise ValueError(f"{gguf.path}: the cached config differs from the file's; delete the cache directory")
    arch = str(gguf.get("general.architecture"))
    matrices: dict[str, QTensor] = {}
    vectors: dict[str, np.ndarray] = {}
    for t in gguf.tensors.values():
        name = hf_name(t.name)
        if name is None:
            continue
        order = row_order(t.name, config, arch)
        if len(t.shape) == 1:
            vec = np.asarray(t.data, dtype=np.float32)
            vectors[name] = vec[order] if order is not None else vec
        else:
            matrices[name] = _qtensor(t, order)
    matrices.setdefault("lm_head.weight", matrices["model.embed_tokens.weight"])
    return matrices, vectors


def _qtensor(t: GGUFTensor, order: np.ndarray | None) -> QTensor:
    """A GGUF matrix as a QTensor over the mapped bytes (rows gathered into a copy when `order` is given)."""
    rows, cols = t.shape
    raw = t.data.reshape(rows, -1).view(np.uint8)  # F32/F16 values as their bytes; block rows unchanged
    if order is not None:
        raw = raw[order]
    return QTensor(t.fmt, rows, cols, raw)
