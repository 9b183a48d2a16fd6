"""A failure that belongs to one sequence finishes that request alone; the step and every other sequence go on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from headroom.core.clock import FakeClock
from headroom.core.errors import HeadroomError, InvalidRequest
from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.request import FinishReason, SamplingParams, SequenceOutput
from headroom.llm.runner import ModelBatch
from headroom.llm.sampler import SamplingError
from headroom.llm.tokenizer import IncrementalDetokenizer

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
VOCAB = 50


def _engine(runner: Any) -> LLMEngine:
    return LLMEngine(runner, EngineConfig(block_size_tokens=4), max_model_len=128, clock=FakeClock())


def _poisoning(fake_runner: Callable[..., Any], bad: str, value: float) -> Any:
    """A FakeRunner whose logits rows for sequence `bad` are all `value` (NaN, inf) from its first step."""
    runner = fake_runner(64, vocab_size=VOCAB)
    execute = runner.execute

    def poisoned(batch: ModelBatch) -> np.ndarray:
        logits: np.ndarray = execute(batch)
        row = 0
        for it in batch.items:
            if it.needs_logits:
                if it.request_id.split("#")[0] == bad:
                    logits[row : row + it.num_logits] = value
                row += it.num_logits
        return logits

    runner.execute = poisoned
    return runner


def _run(engine: LLMEngine) -> dict[str, SequenceOutput]:
    last: dict[str, SequenceOutput] = {}
    for _ in range(100):
        if not engine.has_unfinished:
            break
        for out in engine.step():
            last[out.request_id] = out
    assert not engine.has_unfinished and engine.kv.num_free_blocks == engine.kv.num_blocks
    return last


def _alone(fake_runner: Callable[..., Any], prompt: list[int], params: SamplingParams) -> tuple[int, ...]:
    engine = _engine(fake_runner(64, vocab_size=VOCAB))
    engine.add_request("good", prompt, params)
    return _run(engine)["good"].token_ids


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_non_finite_model_output_fails_that_sequence_alone(
    fake_runner: Callable[..., Any], value: float, temperature: float
) -> None:
    params = SamplingParams(temperature=temperature, max_tokens=6, ignore_eos=True, seed=3)
    engine = _engine(_poisoning(fake_runner, "bad", value))
    engine.add_request("good", [1, 2, 3], params)
    engine.add_request("bad", [4, 5, 6], params)
    outs = _run(engine)
    assert outs["bad"].finish_reason is FinishReason.ERROR
    assert isinstance(outs["bad"].error, SamplingError) and outs["bad"].error.http_status == 500
    assert outs["good"].finish_reason is FinishReason.LENGTH and outs["good"].error is None
    assert outs["good"].token_ids == _alone(fake_runner, [1, 2, 3], params)  # untouched by its neighbour


def test_parameters_that_make_probabilities_non_finite_are_a_400(fake_runner: Callable[..., Any]) -> None:
    """Out-of-range values are refused up front (headroom.llm.validation); this is the second line of defence:
    in-range parameters that still overflow (huge finite logits / the smallest allowed penalty -> inf)."""
    engine = _engine(_poisoning(fake_runner, "hostile", 1e37))
    prompt = list(range(1, VOCAB))  # every token is penalised: 1e37 / 0.01 -> inf in fp32
    hostile = SamplingParams(temperature=0.7, repetition_penalty=0.01, max_tokens=4)
    engine.add_request("hostile", prompt, hostile)
    engine.add_request("good", [1, 2, 3], GREEDY)
    outs = _run(engine)
    assert isinstance(outs["hostile"].error, InvalidRequest)
    assert "repetition_penalty" in str(outs["hostile"].error)
    assert outs["good"].token_ids == _alone(fake_runner, [1, 2, 3], GREEDY)
    engine.add_request("after", [1, 2, 3], GREEDY)  # the engine goes on
    assert _run(engine)["after"].finish_reason is FinishReason.LENGTH


def test_a_failed_sequence_aborts_its_siblings_and_frees_their_blocks(fake_runner: Callable[..., Any]) -> None:
    engine = _engine(_poisoning(fake_runner, "bad", float("nan")))
    engine.add_request("bad", [4, 5, 6], SamplingParams(n=3, temperature=0.7, max_tokens=5, seed=1))
    engine.add_request("good", [1, 2, 3], GREEDY)
    outs = _run(engine)
    reasons = sorted(outs[f"bad#{i}"].finish_reason.value for i in range(3))  # type: ignore[union-attr]
    assert reasons.count("error") >= 1 and set(reasons) <= {"error", "abort"}
    assert not engine.has_request("bad") and outs["good"].error is None


class _BrokenDetokenizer(IncrementalDetokenizer):
    def update(self, output_ids: Any) -> str:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")


def test_a_detokenizer_error_fails_that_sequence_alone(fake_runner: Callable[..., Any]) -> None:
    engine = _engine(fake_runner(64, vocab_size=VOCAB))
    engine.add_request("good", [1, 2, 3], GREEDY)
    engine.add_request("bad", [4, 5, 6], GREEDY)
    engine.scheduler.requests["bad"].extra["detok"] = _BrokenDetokenizer(None)  # type: ignore[arg-type]
    outs = _run(engine)
    err = outs["bad"].error
    assert isinstance(err, HeadroomError) and err.http_status == 500 and "invalid start byte" in str(err)
    assert outs["good"].token_ids == _alone(fake_runner, [1, 2, 3], GREEDY)


def test_gauges_are_published_on_abort_without_a_step(fake_runner: Callable[..., Any]) -> None:
    seen: list[tuple[int, int, float]] = []

    class Gauges:
        def on_step(self, stats: Any) -> None:
            seen.append((stats.num_running, stats.num_waiting, stats.kv_cache_usage))

        def on_token(self, req: Any, now_s: float, first: bool) -> None:
            pass

        def on_finish(self, req: Any, now_s: float) -> None:
            pass


        def on_rejected(self, reason: str) -> None:

            pass

        def on_gauges(self, num_running: int, num_waiting: int, kv_cache_usage: float) -> None:
            seen.append((num_running, num_waiting, kv_cache_usage))

    engine = LLMEngine(fake_runner(64, vocab_size=VOCAB), EngineConfig(block_size_tokens=4), max_model_len=128,
                       clock=FakeClock(), observer=Gauges())
    engine.add_request("a", [1, 2, 3, 4, 5], GREEDY)
    engine.add_request("b", [1, 2, 3], GREEDY)
    engine.step()
    assert seen[-1][0] == 2 and seen[-1][2] > 0
    engine.abort("a")
    assert seen[-1][0] == 1
    engine.abort("b")
    assert seen[-1] == (0, 0, 0.0)
