"""OpenAI's `POST /v1/embeddings` request and response, free of the transport.

An embedding model is any served model whose config has one BYTES input and an FP32 output named
`embedding` (minilm). Fields: `input` (a string or a non-empty list of strings; token-id inputs are
refused), `model`, `encoding_format` (`float`, or `base64`: little-endian float32 bytes as OpenAI sends
them), `dimensions` (the model's own size, or one of the sizes its config declares under
`parameters.matryoshka_dimensions`, which truncates and re-normalises), `user`. Anything else is a 400
naming the field. `usage` counts the tokens the model embeds (its `count_tokens(texts)`, e.g. minilm's
tokenizer after truncation to `max_seq_length`).

`peek_model` finds the model's name in the raw body without parsing it, so that an overloaded model's 503
is decided before the JSON is parsed and checked (the full parse still decides everything else).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from headroom.models.config import ModelConfig
from headroom.protocol.openai_errors import FieldError

FIELDS = frozenset({"input", "model", "encoding_format", "dimensions", "user"})
DEFAULT_MODEL = "minilm"
# `"model": "<plain name>"` as a JSON key: a `"` escaped inside a string is `\"`, so text quoting a key does not
# match; a name with escapes (or none at all) is left to the parser
_MODEL_KEY = re.compile(rb'(?<!\\)"model"\s*:\s*"([A-Za-z0-9_.:/-]{1,256})"')


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    """A checked /v1/embeddings body."""

    texts: tuple[str, ...]  # one embedding per text, in order
    model: str  # the served model's name
    encoding_format: Literal["float", "base64"]  # how vectors go on the wire
    dimensions: int | None  # requested vector size (None = the model's own)


def peek_model(body: bytes) -> str | None:
    """The `model` the raw body names, found without parsing it (None when not found plainly)."""
    found = _MODEL_KEY.search(body)
    return found.group(1).decode("ascii") if found is not None else None


def parse_request(body: Any) -> EmbeddingsRequest:
    """The checked request, or FieldError (400) naming the field."""
    if not isinstance(body, dict):
        raise FieldError(None, "the request body must be a JSON object", "invalid_type")
    clean = {k: v for k, v in body.items() if v is not None}
    for name in clean:
        if name not in FIELDS:
            raise FieldError(name, f"unknown field {name!r}; /v1/embeddings takes {', '.join(sorted(FIELDS))}",
                             "unknown_parameter")
    texts = clean.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise FieldError("input", "input must be a string or a non-empty list of strings (token ids are not "
                         "accepted)", "invalid_type")
    model = clean.get("model", DEFAULT_MODEL)
    if not isinstance(model, str):
        raise FieldError("model", "model must be a string", "invalid_type")
    encoding = clean.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise FieldError("encoding_format", "encoding_format must be 'float' or 'base64'")
    dims = clean.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise FieldError("dimensions", f"dimensions must be a positive integer, got {dims!r}", "invalid_type")
    if "user" in clean and not isinstance(clean["user"], str):
        raise FieldError("user", "user must be a string", "invalid_type")
    return EmbeddingsRequest(tuple(texts), model, encoding, dims)


def is_embedding_model(config: ModelConfig) -> bool:
    """One BYTES input and an FP32 `embedding` output: what /v1/embeddings can serve."""
    inputs_ok = len(config.inputs) == 1 and config.inputs[0].datatype == "BYTES"
    return inputs_ok and any(o.name == "embedding" and o.datatype == "FP32" for o in config.outputs)


def native_dimensions(config: ModelConfig) -> int:
    """The size of the model's embedding vectors (the last dimension of its `embedding` output)."""
    out = next(o for o in config.outputs if o.name == "embedding")
    return int(out.shape[-1])


def allowed_dimensions(config: ModelConfig) -> tuple[int, ...]:
    """The native size plus any Matryoshka truncations the config declares."""
    declared = config.parameters.get("matryoshka_dimensions", ())
    sizes = [int(d) for d in declared] if isinstance(declared, list | tuple) else []
    return tuple(sorted({native_dimensions(config), *sizes}))


def check_dimensions(config: ModelConfig, dimensions: int | None) -> int | None:
    """None when the model's own size is wanted, else the truncation size; FieldError if not allowed."""
    if dimensions is None or dimensions == native_dimensions(config):
        return None
    allowed = allowed_dimensions(config)
    if dimensions not in allowed:
        raise FieldError(
            "dimensions",
            f"model {config.name!r} makes {native_dimensions(config)}-dimensional embeddings and declares no "
            f"Matryoshka truncation to {dimensions}; dimensions must be one of {list(allowed)}",
        )
    return dimensions


def truncate(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Matryoshka truncation: the first `dimensions` values of each row, re-normalised to unit length."""
    if dimensions is None:
        return vectors
    cut = vectors[:, :dimensions].astype(np.float32)
    norms = np.clip(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12, None)
    result: np.ndarray = (cut / norms).astype(np.float32)
    return result


def count_tokens(model: object, texts: Sequence[str]) -> int:
    """The model's own token count for `texts` (its `count_tokens`), or 0 when it cannot count (or was unloaded
    meanwhile)."""
    count = getattr(model, "count_tokens", None)
    if not callable(count):
        return 0
    try:
        return int(count(texts))
    except RuntimeError:
        return 0


def response_body(req: EmbeddingsRequest, vectors: np.ndarray, num_tokens: int) -> dict[str, object]:
    """OpenAI's embeddings list; float rows stay numpy arrays (orjson writes them compactly)."""
    items: list[Mapping[str, object]] = [
        {"object": "embedding", "index": i, "embedding": vec if req.encoding_format == "float" else to_base64(vec)}
        for i, vec in enumerate(vectors)
    ]
    usage = {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
    return {"object": "list", "data": items, "model": req.model, "usage": usage}


def to_base64(vec: np.ndarray) -> str:
    """OpenAI's base64 encoding: the vector's little-endian float32 bytes."""
    return base64.b64encode(np.ascontiguousarray(vec, dtype="<f4").tobytes()).decode("ascii")


def model_card(config: ModelConfig, created_s: int) -> dict[str, object]:
    """The /v1/models entry of an embedding model; `max_model_len` is its `max_seq_length` if declared."""
    card: dict[str, object] = {"id": config.name, "object": "model", "created": created_s, "owned_by": "headroom"}
    max_len = config.parameters.get("max_seq_length")
    if isinstance(max_len, int):
        card["max_model_len"] = max_len
    card["dimensions"] = list(allowed_dimensions(config))
    return card


def cards(configs: Sequence[ModelConfig], created_s: int) -> list[dict[str, object]]:
    """The /v1/models entries of the embedding models among `configs`."""
    return [model_card(c, created_s) for c in configs if is_embedding_model(c)]
