"""Scheduling decisions with a model-free runner: token budget, chunked prefill mixed with decodes,
preemption by recompute, priorities, bounded waiting queue, abort."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from headroom.core.clock import FakeClock
from headroom.core.errors import InvalidRequest, RateLimited
from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.kv_cache import KVCacheManager
from headroom.llm.metrics import LLMMetrics
from headroom.llm.request import Request, SamplingParams
from headroom.llm.runner import ModelBatch
from headroom.llm.scheduler import Scheduler, SchedulerLimits

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


def _engine(fake_runner: Callable[..., Any], num_blocks: int = 64, **kw: Any) -> LLMEngine:
    cfg = EngineConfig(block_size_tokens=4, **kw)
    return LLMEngine(fake_runner(num_blocks), cfg, max_model_len=128, clock=FakeClock())


def _drain(engine: LLMEngine) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    while engine.has_unfinished:
        for o in engine.step():
            out[o.request_id] = list(o.token_ids)
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    return out


def test_token_budget_chunks_prefill_and_mixes_decodes(fake_runner: Callable[..., Any]) -> None:
    engine = _engine(fake_runner, max_num_batched_tokens=8)
    engine.add_request("short", [1, 2, 3], GREEDY)
    engine.step()  # short: 3-token prefill, samples its first token
    engine.add_request("long", list(range(1, 21)), GREEDY)
    runner = engine.runner
    engine.step()
    last = runner.batches[-1].items  # type: ignore[attr-defined]
    assert [(i.request_id, len(i.token_ids), i.needs_logits) for i in last] == [("short", 1, True), ("long", 7, False)]
    engine.step()
    last = runner.batches[-1].items  # type: ignore[attr-defined]
    assert [(i.request_id, i.start_position, len(i.token_ids)) for i in last] == [("short", 4, 1), ("long", 7, 7)]
    _drain(engine)


def test_max_num_seqs_limits_a_step(fake_runner: Callable[..., Any]) -> None:
    engine = _engine(fake_runner, max_num_seqs=2)
    for i in range(3):
        engine.add_request(f"r{i}", [i + 1, 2], GREEDY)
    engine.step()
    assert len(engine.runner.batches[-1].items) == 2  # type: ignore[attr-defined]
    assert len(engine.scheduler.waiting) == 1
    _drain(engine)


def test_outputs_do_not_depend_on_batching_preemption_or_prefix_cache(fake_runner: Callable[..., Any]) -> None:
    prompts = {f"r{i}": [(i * 7 + j) % 40 + 1 for j in range(5 + 3 * i)] for i in range(6)}

    def run(**kw: Any) -> dict[str, list[int]]:
        blocks = kw.pop("num_blocks", 64)
        engine = _engine(fake_runner, num_blocks=blocks, **kw)
        for rid, p in prompts.items():
            engine.add_request(rid, p, SamplingParams(temperature=0.0, max_tokens=10))
        result = _drain(engine)
        if blocks < 64:
            assert engine.scheduler.num_preemptions > 0
        return result

    base = run(enable_prefix_caching=False, max_num_seqs=1)
    assert run() == base
    assert run(max_num_batched_tokens=3) == base
    assert run(num_blocks=9) == base  # far fewer blocks than 6 sequences need: preemption by recompute


def test_preemption_picks_lowest_priority_newest() -> None:
    kv = KVCacheManager(num_blocks=4, block_size_tokens=2, enable_prefix_caching=False)
    sched = Scheduler(SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=64), kv)
    reqs = [
        Request(f"r{i}", [1, 2, 3, 4], GREEDY, arrival_s=0.0, seq_no=i, priority=p) for i, p in enumerate([0, 1, 0])
    ]
    for r in reqs:
        sched.add(r)
    first = sched.schedule()
    assert [s.request_id for s in first.seqs] == ["r0", "r2"]  # priority 0 first; r1 does not fit
    for s in first.seqs:
        r = sched.requests[s.request_id]
        r.num_computed_tokens = 4
        r.token_ids.append(5)  # a sampled token: each now needs a 2nd block at the next step
    second = sched.schedule()
    assert second.preempted == ("r2",)
    assert [s.request_id for s in second.seqs] == ["r0"]
    assert reqs[2].num_computed_tokens == 0 and reqs[2] in sched.waiting


def test_priority_orders_admission(fake_runner: Callable[..., Any]) -> None:
    engine = _engine(fake_runner, max_num_seqs=1)
    engine.add_request("low", [1, 2], GREEDY, priority=5)
    engine.add_request("high", [3, 4], GREEDY, priority=0)
    engine.step()
    assert engine.runner.batches[-1].items[0].request_id == "high"  # type: ignore[attr-defined]
    _drain(engine)


def test_bounded_waiting_queue_rejects_with_retry_after(fake_runner: Callable[..., Any]) -> None:
    engine = _engine(fake_runner, max_waiting_requests=2, retry_after_s=3.0)
    engine.add_request("a", [1], GREEDY)
    engine.add_request("b", [1], GREEDY)
    engine.observer = LLMMetrics(registry := CollectorRegistry(), "m")
    with pytest.raises(RateLimited) as err:
        engine.add_request("c", [1], GREEDY)
    assert err.value.retry_after_s == 3.0
    labels = {"model_name": "m", "reason": "max_num_queued_reqs"}
    assert registry.get_sample_value("vllm:admission_rejections_total", labels) == 1  # vLLM's counter of refusals
    _drain(engine)


def test_context_overflow_is_invalid_request(fake_runner: Callable[..., Any]) -> None:
    engine = _engine(fake_runner)
    with pytest.raises(InvalidRequest, match="maximum context length is 128"):
        engine.add_request("x", [1] * 100, SamplingParams(max_tokens=29))
    engine.add_request("ok", [1] * 100, SamplingParams(temperature=0.0, max_tokens=28))
    assert len(_drain(engine)["ok"]) == 28


def test_abort_frees_blocks_at_once(fake_runner: Callable[..., Any]) -> None:
    engine = _engine(fake_runner)
    engine.add_request("a", list(range(1, 30)), SamplingParams(temperature=0.0, max_tokens=50))
    engine.step()
    assert engine.kv.num_free_blocks < engine.kv.num_blocks
    outs = engine.abort("a")
    assert [o.finish_reason.value for o in outs if o.finish_reason] == ["abort"]
    assert engine.kv.num_free_blocks == engine.kv.num_blocks and not engine.has_unfinished


def test_stop_token_ids_and_max_tokens(fake_runner: Callable[..., Any]) -> None:
    engine = _engine(fake_runner)
    engine.add_request("free", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=8))
    free = _drain(engine)["free"]
    assert len(free) == 8
    engine.add_request("stop", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=(free[3],)))
    assert _drain(engine)["stop"] == free[:4]


def test_prompt_lookup_speculation_is_exact_and_accepts_drafts(fake_runner: Callable[..., Any]) -> None:
    prompts = {f"r{i}": [(i * 5 + j) % 30 + 1 for j in range(7 + i)] for i in range(4)}

    def run(k: int) -> tuple[dict[str, list[int]], LLMEngine]:
        engine = LLMEngine(
            fake_runner(64, period=5),
            EngineConfig(block_size_tokens=4, speculative_ngram_tokens=k),
            max_model_len=128,
            clock=FakeClock(),
        )
        for rid, p in prompts.items():
            engine.add_request(rid, p, SamplingParams(temperature=0.0, max_tokens=23))
        return _drain(engine), engine

    plain, _ = run(0)
    spec, engine = run(4)
    assert spec == plain and all(len(v) == 23 for v in spec.values())
    assert engine.spec_draft_tokens > 0 and engine.spec_accepted_tokens > engine.spec_draft_tokens // 2
    steps_plain = len(run(0)[1].runner.batches)  # type: ignore[attr-defined]
    assert len(engine.runner.batches) < steps_plain  # type: ignore[attr-defined]


def test_swap_preemption_resumes_identically_without_recompute(fake_runner: Callable[..., Any]) -> None:
    prompts = {f"r{i}": [(i * 7 + j) % 40 + 1 for j in range(5 + 3 * i)] for i in range(6)}

    def run(**kw: Any) -> tuple[dict[str, list[int]], LLMEngine]:
        engine = LLMEngine(
            fake_runner(kw.pop("num_blocks", 64)), EngineConfig(block_size_tokens=4, **kw), 128, clock=FakeClock()
        )
        for rid, p in prompts.items():
            engine.add_request(rid, p, SamplingParams(temperature=0.0, max_tokens=10))
        return _drain(engine), engine

    base, _ = run(enable_prefix_caching=False)
    swapped, engine = run(num_blocks=9, enable_prefix_caching=False, swap_space_mb=64 * 1024 / 2**20)
    assert swapped == base
    assert engine.scheduler.num_swaps > 0 and not engine.scheduler.swapped
    # swapped sequences resumed where they stopped: fewer tokens were run than with recompute
    recomputed, recompute_engine = run(num_blocks=9, enable_prefix_caching=False)
    assert recomputed == base
    assert recompute_engine.scheduler.num_preemptions > 0
    assert _tokens_run(engine) < _tokens_run(recompute_engine)


def _tokens_run(engine: LLMEngine) -> int:
    batches: list[ModelBatch] = engine.runner.batches  # type: ignore[attr-defined]
    return sum(len(item.token_ids) for batch in batches for item in batch.items)


def test_higher_priority_arrival_preempts_lower_priority_running(fake_runner: Callable[..., Any]) -> None:
    engine = _engine(fake_runner, max_num_seqs=1)
    engine.add_request("low", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=8), priority=5)
    engine.step()
    engine.step()
    engine.add_request("high", [4, 5], SamplingParams(temperature=0.0, max_tokens=3), priority=0)
    outs = engine.step()
    assert [o.request_id for o in outs] == ["high"] and engine.scheduler.num_preemptions == 1
    result = _drain(engine)
    assert len(result["low"]) == 8 and len(result["high"]) == 3
    alone = _engine(fake_runner)
    alone.add_request("low", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=8), priority=5)
    assert _drain(alone)["low"] == result["low"]  # resumed with identical output


def test_equal_priority_never_preempts_for_admission(fake_runner: Callable[..., Any]) -> None:
    engine = _engine(fake_runner, max_num_seqs=1)
    engine.add_request("first", [1, 2], GREEDY)
    engine.step()
    engine.add_request("second", [3, 4], GREEDY)
    engine.step()
    assert engine.scheduler.num_preemptions == 0 and [r.request_id for r in engine.scheduler.running] == ["first"]
    _drain(engine)
