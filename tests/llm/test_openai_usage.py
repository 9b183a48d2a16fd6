"""The serving's RequestObserver (the LLM's Triton statistics) and the engine's idleness (reload drains):
every request ends in exactly one observation, over the tiny chat decoder's real engine."""

from __future__ import annotations

import asyncio
from typing import Any

from headroom.gateway.usage import LLMUsage
from headroom.llm.serving import OpenAIServing
from headroom.server.statistics import LLMStatistics


class Recorder:
    """A RequestObserver that keeps what it saw (and feeds the real statistics)."""

    def __init__(self) -> None:
        self.usages: list[LLMUsage] = []
        self.refused: list[float] = []
        self.stats = LLMStatistics()

    def on_usage(self, usage: LLMUsage) -> None:
        self.usages.append(usage)
        self.stats.on_usage(usage)

    def on_refused(self, duration_s: float) -> None:
        self.refused.append(duration_s)
        self.stats.on_refused(duration_s)


async def test_each_request_is_observed_once(tiny_serving: OpenAIServing) -> None:
    recorder = Recorder()
    tiny_serving.observer = recorder
    seen: list[LLMUsage] = []
    ok = await tiny_serving.create_completion({"prompt": "hello", "max_tokens": 3, "temperature": 0}, seen.append)
    assert ok.status == 200 and len(recorder.usages) == 1 and seen == recorder.usages  # the caller's too
    stream = await tiny_serving.create_completion({"prompt": "hello", "max_tokens": 3, "stream": True})
    assert stream.stream is not None
    async for _ in stream.stream:
        pass
    bad = await tiny_serving.create_completion({"prompt": "hello", "temperature": 9})
    assert bad.status == 400 and len(recorder.refused) == 1
    assert [u.finish_reason for u in recorder.usages] == ["length", "length"]
    stats = recorder.stats.stats.to_json("tiny", "")
    assert stats["inference_count"] == stats["execution_count"] == 2
    inference: Any = stats["inference_stats"]
    assert inference["success"]["count"] == 2 and inference["fail"]["count"] == 1
    assert inference["compute_infer"]["ns"] > 0 and stats["batch_stats"][0]["batch_size"] == 1  # type: ignore[index]


async def test_the_engine_is_idle_only_without_requests(tiny_serving: OpenAIServing) -> None:
    engine = tiny_serving.engine
    assert engine is not None and engine.idle()
    # no max_tokens + ignore_eos: it runs to the context limit, far longer than this check takes
    reply = await tiny_serving.create_completion({"prompt": "hello", "ignore_eos": True, "stream": True})
    assert reply.stream is not None and not engine.idle()  # admitted: it is in the engine
    stream: Any = reply.stream
    assert (await anext(stream)).startswith("data: ")
    await stream.aclose()  # the client left: the request is aborted
    deadline = asyncio.get_running_loop().time() + 60
    while not engine.idle() and asyncio.get_running_loop().time() < deadline:  # the engine thread takes the abort
        await asyncio.sleep(0.001)
    assert engine.idle()
