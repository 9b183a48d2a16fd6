"""Prompt sets for run_llm_serving_bench.py: seeded chat requests of a target token length, FRESH for every
(concurrency level, round), so no server finds a prompt's blocks from an earlier level or round in its prefix
cache (only the chat template's system prefix is shared, by every server alike)."""

from __future__ import annotations

import json
import zlib
from functools import cache
from pathlib import Path

import numpy as np

from headroom.llm.native_weights import load_native
from headroom.llm.offline import DEFAULT_MODEL
from headroom.llm.tokenizer import Tokenizer
from headroom.loadgen.workloads import WorkloadSpec, make_workload


@cache
def _tokenizer() -> Tokenizer:
    return Tokenizer(load_native(DEFAULT_MODEL).tokenizer)  # no fp32 weights needed for the tokenizer


def level_seed(seed: int, label: str, rnd: int) -> int:
    """A distinct, reproducible seed per (level, round)."""
    return (seed * 1_000_003 + rnd * 10_007 + zlib.crc32(label.encode())) % 2**32


def make_prompts(path: Path, count: int, target_tokens: int, max_tokens: int, seed: int) -> dict[str, float]:
    """A seeded JSONL of chat requests (greedy, ignore_eos) whose chat-templated prompt is ~target_tokens tokens
    (counted with the model's tokenizer); returns the prompt length stats."""
    tok = _tokenizer()
    spec = WorkloadSpec(kind="chat", num_samples=count, input_len_mean=target_tokens, input_len_std=0)
    samples = make_workload(spec, np.random.default_rng(seed))
    lengths, lines = [], []
    for s in samples:
        words = s.text.split()
        while len(words) < 2 * target_tokens:  # long prompts: repeat the sample's own words to reach the length
            words = words + words

        def n_tokens(k: int, words: list[str] = words) -> int:
            text = " ".join(words[:k])
            return len(tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]), False))

        lo, hi = 1, len(words)  # the largest word count whose prompt stays within target_tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if n_tokens(mid) <= target_tokens else (lo, mid - 1)
        lengths.append(n_tokens(lo))
        # The whole body, so every server gets temperature 0 (OpenAI's default is 1, llama-server's 0.8).
        message = {"role": "user", "content": " ".join(words[:lo])}
        body = {"messages": [message], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        lines.append(json.dumps({"body": body}))
    path.write_text("\n".join(lines) + "\n")
    return {
        "prompt_tokens_mean": float(np.mean(lengths)),
        "prompt_tokens_min": float(min(lengths)),
        "prompt_tokens_max": float(max(lengths)),
    }
