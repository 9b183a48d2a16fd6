"""Per-request stage timestamps: the engine's `RequestTimeline` on the final output, and what serving makes
of it (`LLMUsage` for the gateway, `Server-Timing` on non-streamed answers)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from headroom.core.clock import FakeClock
from headroom.core.server_timing import parse_server_timing
from headroom.gateway.usage import LLMUsage
from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.request import RequestTimeline, SamplingParams, SequenceOutput, merge_timelines
from headroom.llm.runner import ModelBatch
from headroom.llm.serving import OpenAIServing

GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


def _ticking_engine(fake_runner: Callable[..., Any], clock: FakeClock, **kw: Any) -> LLMEngine:
    """Every model call takes exactly one second on the fake clock."""
    runner = fake_runner(64)
    inner = runner.execute

    def execute(batch: ModelBatch) -> np.ndarray:
        clock.advance(1.0)
        out: np.ndarray = inner(batch)
        return out

    runner.execute = execute
    return LLMEngine(runner, EngineConfig(block_size_tokens=4, **kw), max_model_len=128, clock=clock)


def _run(engine: LLMEngine) -> list[SequenceOutput]:
    outs: list[SequenceOutput] = []
    while engine.has_unfinished:
        outs.extend(engine.step())
    return outs


def test_stage_ms_adds_up_and_handles_stages_that_never_started() -> None:
    t = RequestTimeline(arrival_s=10.0, first_scheduled_s=12.0, first_token_s=12.5, last_token_s=14.0,
                        finished_s=14.0)
    assert t.stage_ms() == pytest.approx((2000.0, 500.0, 1500.0))
    never_ran = RequestTimeline(10.0, None, None, None, finished_s=11.0)  # aborted while waiting
    assert never_ran.stage_ms() == pytest.approx((1000.0, 0.0, 0.0))
    running = RequestTimeline(10.0, 10.5, 11.0, 13.0, finished_s=None)  # still decoding: up to its last token
    assert running.end_s == 13.0 and sum(running.stage_ms()) == pytest.approx(3000.0)


def test_merge_takes_earliest_starts_and_latest_finish() -> None:
    a = RequestTimeline(1.0, 2.0, 3.0, 5.0, 5.0)
    b = RequestTimeline(1.0, 2.5, 2.8, 7.0, 7.0)
    assert merge_timelines([a, b]) == RequestTimeline(1.0, 2.0, 2.8, 7.0, 7.0)
    assert merge_timelines([a, RequestTimeline(1.0, 2.0, None, None, None)]).finished_s is None
    with pytest.raises(ValueError):
        merge_timelines([])


def test_final_output_carries_queue_prefill_decode(fake_runner: Callable[..., Any]) -> None:
    clock = FakeClock()
    engine = _ticking_engine(fake_runner, clock, max_num_batched_tokens=8)
    engine.add_request("r", list(range(1, 21)), GREEDY)  # 20 prompt tokens: 3 chunked-prefill steps of <= 8
    clock.advance(5.0)  # waits 5 s before the first step
    outs = _run(engine)
    final = outs[-1]
    assert final.finished and final.timeline is not None
    assert final.timeline == RequestTimeline(arrival_s=0.0, first_scheduled_s=5.0, first_token_s=8.0,
                                             last_token_s=10.0, finished_s=10.0)
    assert final.timeline.stage_ms() == pytest.approx((5000.0, 3000.0, 2000.0))
    assert all(o.timeline is not None and o.timeline.finished_s is None for o in outs[:-1])


def test_aborted_request_has_a_finished_timeline(fake_runner: Callable[..., Any]) -> None:
    clock = FakeClock()
    engine = _ticking_engine(fake_runner, clock)
    engine.add_request("r", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    (out,) = engine.abort("r")
    assert out.timeline == RequestTimeline(0.0, 0.0, 1.0, 2.0, 2.0)


# --- serving: the usage report and Server-Timing -------------------------------------------------------


@pytest.fixture
def serving(tiny_serving: Any) -> OpenAIServing:
    s: OpenAIServing = tiny_serving
    return s


async def test_non_streamed_answer_reports_usage_and_server_timing(serving: OpenAIServing) -> None:
    reports: list[LLMUsage] = []
    body = {"prompt": "Hello there", "max_tokens": 4, "temperature": 0, "ignore_eos": True, "n": 2}
    resp = await serving.create_completion(body, reports.append)
    assert resp.status == 200 and resp.body is not None
    (usage,) = reports
    assert usage.completion_tokens == 8 == resp.body["usage"]["completion_tokens"]
    assert usage.prompt_tokens == resp.body["usage"]["prompt_tokens"] and usage.finish_reason == "length"
    stages = usage.preprocess_ms + usage.queue_ms + usage.prefill_ms + usage.decode_ms
    assert usage.prefill_ms > 0 and usage.decode_ms > 0 and stages <= usage.total_ms + 1e-9
    timing = parse_server_timing(resp.headers["Server-Timing"])
    assert set(timing) == {"preprocess", "queue", "prefill", "decode", "other", "total"}
    assert timing["decode"] == pytest.approx(usage.decode_ms, abs=1e-3)
    assert sum(v for k, v in timing.items() if k != "total") == pytest.approx(timing["total"], abs=1.0)


async def test_refusals_report_nothing(serving: OpenAIServing) -> None:
    reports: list[LLMUsage] = []
    resp = await serving.create_completion({"model": "other", "prompt": "x", "max_tokens": 2}, reports.append)
    assert resp.status == 404 and reports == []


async def test_stream_closed_early_reports_what_was_generated(serving: OpenAIServing) -> None:
    reports: list[LLMUsage] = []
    body = {"prompt": "Hi", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    resp = await serving.create_completion(body, reports.append)
    assert resp.stream is not None and not reports
    stream = aiter(resp.stream)
    got = 0
    while got < 3:  # three chunks with text (or more tokens), then the client goes away
        if "text" in await anext(stream):
            got += 1
    await stream.aclose()  # type: ignore[attr-defined]
    (usage,) = reports
    assert usage.finish_reason == "abort" and 1 <= usage.completion_tokens < 200
    await asyncio.sleep(0)


async def test_stream_to_the_end_reports_once(serving: OpenAIServing) -> None:
    reports: list[LLMUsage] = []
    body = {"prompt": "Hi", "max_tokens": 5, "temperature": 0, "ignore_eos": True, "stream": True}
    resp = await serving.create_completion(body, reports.append)
    assert resp.stream is not None
    chunks = [c async for c in resp.stream]
    assert chunks[-1] == "data: [DONE]\n\n"
    assert [(u.completion_tokens, u.finish_reason) for u in reports] == [(5, "length")]
