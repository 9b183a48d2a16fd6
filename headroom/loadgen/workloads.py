"""Seeded synthetic datasets per model type, or a user's JSONL file.

    sentences      short English-like sentences (text classifiers, embedders)
    digits         8x8 sklearn digits: PNG bytes for `image`, FP32 [1, 1, 8, 8] tensors for V2
    chat           chat prompts whose input/output lengths follow a distribution (LLM)
    shared-prefix  conversations that share one long system prefix (prefix caching, LLM)
    jsonl          one JSON object per line: {"text"|"prompt": ..., "max_tokens": ...} or {"body": {...}}

A `Sample` is protocol-neutral; `headroom.loadgen.clients` encodes it for the wire.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from headroom.core.json_object import json_object

WORKLOADS: tuple[str, ...] = ("sentences", "digits", "chat", "shared-prefix", "jsonl")

_WORDS_TEXT = (
    "the a model server batch queue latency request token cache every small fast slow quiet bright river "
    "mountain engineer reads writes measures waits answers many few network memory core thread stream "
    "user system prefers keeps grows falls under over beside within after before simple careful honest "
    "tail mean percentile budget load traffic peak valley morning evening green orange red blue city "
    "garden window"
)
_WORDS = tuple(_WORDS_TEXT.split())


@dataclass(frozen=True, slots=True)
class Sample:
    """One protocol-neutral input."""

    text: str = ""  # prompt or sentence (text workloads)
    pixels: npt.NDArray[np.float32] | None = None  # image as float32 [1, 1, H, W] (digits)
    png: bytes = b""  # the same image encoded as PNG (digits)
    max_output_tokens: int = 0  # requested generation length (LLM workloads)
    input_words: int = 0  # prompt length in words (a proxy for tokens)
    body: dict[str, Any] | None = None  # a complete request body from a JSONL file (sent as is)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Which dataset to generate and how."""

    kind: str = "sentences"  # one of WORKLOADS
    num_samples: int = 256  # distinct samples (the schedule cycles through them)
    input_len_mean: int = 64  # chat: mean prompt length in words
    input_len_std: int = 16  # chat: standard deviation of prompt length in words (normal, clipped at 1)
    output_len_mean: int = 64  # chat / shared-prefix: mean requested output tokens
    output_len_std: int = 0  # chat / shared-prefix: standard deviation of requested output tokens
    prefix_words: int = 512  # shared-prefix: length of the shared system prefix in words
    path: str = ""  # jsonl: the file to read

    def __post_init__(self) -> None:
        if self.kind not in WORKLOADS:
            raise ValueError(f"unknown workload {self.kind!r}; choose one of {', '.join(WORKLOADS)}")
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {self.num_samples}")
        if self.kind == "jsonl" and not self.path:
            raise ValueError("the jsonl workload needs a file: pass --dataset-path FILE.jsonl")


def _words(rng: np.random.Generator, count: int) -> str:
    picks = rng.integers(0, len(_WORDS), size=max(count, 1))
    return " ".join(_WORDS[int(i)] for i in picks)


def sentences(num_samples: int, rng: np.random.Generator) -> list[Sample]:
    """Sentences of 6-24 words, capitalised and ending with a full stop."""
    out = []
    for _ in range(num_samples):
        n = int(rng.integers(6, 25))
        text = _words(rng, n)
        out.append(Sample(text=text[0].upper() + text[1:] + ".", input_words=n))
    return out


def _png_bytes(image_u8: npt.NDArray[np.uint8]) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image_u8, mode="L").save(buf, format="PNG")
    return buf.getvalue()


@functools.cache
def _digit_images() -> npt.NDArray[np.float64]:
    """sklearn's bundled digits, (1797, 8, 8) float64 in 0..16; read once (static data, never mutated)."""
    from sklearn.datasets import load_digits

    images = np.asarray(load_digits().images, dtype=np.float64)
    images.setflags(write=False)
    return images


def digits(num_samples: int, rng: np.random.Generator) -> list[Sample]:
    """sklearn's 8x8 digits (bundled, no download): FP32 [1, 1, 8, 8] in 0..16 and a grayscale PNG."""
    images = _digit_images()
    order = rng.permutation(images.shape[0])
    out = []
    for k in range(num_samples):
        img = images[int(order[k % order.size])]
        pixels = np.asarray(img, dtype=np.float32).reshape(1, 1, 8, 8)
        as_u8 = np.clip(np.rint(img * (255.0 / 16.0)), 0, 255).astype(np.uint8)
        out.append(Sample(pixels=pixels, png=_png_bytes(as_u8)))
    return out


def _lengths(rng: np.random.Generator, mean: int, std: int, size: int) -> npt.NDArray[np.int64]:
    if std <= 0:
        return np.full(size, max(mean, 1), dtype=np.int64)
    return np.maximum(np.rint(rng.normal(mean, std, size=size)), 1).astype(np.int64)


def chat(spec: WorkloadSpec, rng: np.random.Generator) -> list[Sample]:
    """Prompts whose word counts and requested output lengths are normally distributed (clipped at 1)."""
    in_lens = _lengths(rng, spec.input_len_mean, spec.input_len_std, spec.num_samples)
    out_lens = _lengths(rng, spec.output_len_mean, spec.output_len_std, spec.num_samples)
    return [
        Sample(text=_words(rng, int(n)), input_words=int(n), max_output_tokens=int(m))
        for n, m in zip(in_lens, out_lens, strict=True)
    ]


def shared_prefix(spec: WorkloadSpec, rng: np.random.Generator) -> list[Sample]:
    """One long system prefix shared by every prompt, followed by a short distinct question."""
    prefix = "You are a careful assistant. " + _words(rng, spec.prefix_words)
    out_lens = _lengths(rng, spec.output_len_mean, spec.output_len_std, spec.num_samples)
    out = []
    for m in out_lens:
        n = int(rng.integers(8, 33))
        out.append(
            Sample(
                text=prefix + "\n\nQuestion: " + _words(rng, n) + "?",
                input_words=spec.prefix_words + n + 5,
                max_output_tokens=int(m),
            )
        )
    return out


def from_jsonl(path: str | Path) -> list[Sample]:
    """Samples from a JSONL file: each line {"text"|"prompt": str, "max_tokens"?: int} or {"body": {...}}."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"dataset file {file} does not exist")
    out: list[Sample] = []
    for line_number, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        obj = json_object(line, f"{file}:{line_number}", ValueError, " (one sample per line)")
        body = obj.get("body")
        if isinstance(body, dict):
            out.append(Sample(body=body))
            continue
        text = obj.get("text", obj.get("prompt"))
        if not isinstance(text, str):
            raise ValueError(f'{file}:{line_number}: needs "text" or "prompt" (a string) or "body" (an object)')
        max_tokens = obj.get("max_tokens", 0)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ValueError(f"{file}:{line_number}: max_tokens must be an integer >= 0, got {max_tokens!r}")
        out.append(Sample(text=text, max_output_tokens=max_tokens, input_words=len(text.split())))
    if not out:
        raise ValueError(f"dataset file {file} holds no samples")
    return out


def make_workload(spec: WorkloadSpec, rng: np.random.Generator) -> list[Sample]:
    """Build the samples `spec` describes, drawing randomness from `rng`."""
    if spec.kind == "sentences":
        return sentences(spec.num_samples, rng)
    if spec.kind == "digits":
        return digits(spec.num_samples, rng)
    if spec.kind == "chat":
        return chat(spec, rng)
    if spec.kind == "shared-prefix":
        return shared_prefix(spec, rng)
    return from_jsonl(spec.path)


DEFAULT_WORKLOAD_FOR_PROTOCOL: dict[str, str] = {
    "v2-http": "digits",
    "v2-grpc": "digits",
    "image": "digits",
    "openai-chat": "chat",
    "openai-completions": "chat",
    "openai-embeddings": "sentences",
}
