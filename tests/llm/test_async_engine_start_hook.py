"""AsyncLLMEngine fires a request's start hook (headroom.core.start_signal) once, on its first output; a request
that fails before any output never fires it (a tied copy that failed must not cancel its twin)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from headroom.core import start_signal
from headroom.core.clock import FakeClock
from headroom.core.errors import InvalidRequest
from headroom.llm.async_engine import AsyncLLMEngine
from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.request import SamplingParams


async def test_the_hook_fires_once_on_the_first_output(fake_runner: Callable[..., Any]) -> None:
    engine = LLMEngine(fake_runner(64, vocab_size=50), EngineConfig(block_size_tokens=4), max_model_len=256,
                       clock=FakeClock())
    async_engine = AsyncLLMEngine(engine)
    async_engine.start()
    fired: list[int] = []  # outputs seen when the hook fired
    seen = 0
    token = start_signal.bind(lambda: fired.append(seen))
    try:
        stream = await async_engine.generate("r", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=5,
                                                                            ignore_eos=True))
        assert fired == []  # admitted, not yet executed
        async for _ in stream:
            seen += 1
        assert seen >= 1 and fired == [0]  # once, before the first output was handed on
        assert start_signal.take() is None  # taken by the engine: a second stage would not fire it again
    finally:
        start_signal.reset(token)
        await async_engine.stop()


async def test_a_request_refused_at_admission_never_fires_it(fake_runner: Callable[..., Any]) -> None:
    engine = LLMEngine(fake_runner(64, vocab_size=50), EngineConfig(block_size_tokens=4), max_model_len=16,
                       clock=FakeClock())
    async_engine = AsyncLLMEngine(engine)
    async_engine.start()
    fired: list[bool] = []
    token = start_signal.bind(lambda: fired.append(True))
    try:
        with pytest.raises(InvalidRequest):
            await async_engine.generate("long", list(range(1, 40)), SamplingParams(max_tokens=4))
    finally:
        start_signal.reset(token)
        await async_engine.stop()
    assert fired == []
