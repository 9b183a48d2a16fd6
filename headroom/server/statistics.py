"""Per-version inference statistics in Triton's schema (the V2 statistics extension, HTTP and gRPC).

One `TritonStatistics` per served version, fed by the data plane (per request) and the batcher's observer
(per executed batch). Mapping of headroom's stages to Triton's names (all durations in nanoseconds):

    success         end-to-end time of requests answered with a result
    fail            end-to-end time of requests answered with an error (after resolving to the version)
    queue           batch-queue wait (StageTimings.queue_ms)
    compute_input   per-request preprocessing (StageTimings.preprocess_ms)
    compute_infer   the batched predict call (StageTimings.compute_ms; each request counts its batch's)
    compute_output  per-request postprocessing (StageTimings.postprocess_ms)
    batch_stats     per executed batch size: count and summed predict time (compute_infer); compute_input
                    and compute_output there sum the per-request stages of the requests that ran in
                    batches of that size (headroom pre/postprocesses per request, not per batch)
    last_inference  wall-clock milliseconds since the epoch of the last successful request
    response_stats  per response index (a string key), Triton's InferResponseStatistics: a tensor model
                    answers each request with exactly one response, so everything is under "0" (as Triton
                    reports a non-decoupled model): compute_infer and compute_output as above, success =
                    their sum (Triton: "the sum of infer and output durations"); fail, empty_response and
                    cancel stay 0 for tensor models: headroom's failures (refused, queue full, timed out,
                    model error) are counted in inference_stats.fail by end-to-end time only, without the
                    per-stage durations a response statistic needs

An LLM (`LLMStatistics`, fed by its OpenAIServing's observer with each request's `LLMUsage`, whatever the
route: OpenAI, generate, gRPC) maps the engine's per-request timings: queue = admitted -> first scheduled,
compute_input = parse + tokenize, compute_infer = prefill + decode, compute_output = the rest of the
request's time (detokenizing, sending). Each finished request counts as one inference and one execution
(batch size 1: the engine batches per step, not per request, as Triton's decoupled LLM backends report);
a request refused, failed or aborted (client gone, past its deadline) counts in `fail`.

An LLM's response_stats are per request, all under "0", not one key per streamed chunk as Triton's
decoupled backends report: the engine hands over one `LLMUsage` per request with no per-chunk timings, and
per-chunk keys would grow with max_tokens. A finished request is one successful response (compute_infer =
prefill + decode, compute_output = the rest, as above); a failed one ("error") is a failed response
(compute_infer's time so far); an aborted one (client gone, past its deadline) is a `cancel` (count only:
the cleanup is not timed). A refused request never reached the engine and has no response.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from headroom.core.types import StageTimings
from headroom.gateway.usage import LLMUsage


@dataclass(slots=True)
class Duration:
    """A Triton StatisticDuration: how many, and their summed nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += max(0, round(seconds * 1e9))

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class _ResponseStats:
    """Triton's InferResponseStatistics: one response index's durations."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)
    cancel: Duration = field(default_factory=Duration)

    def to_json(self) -> dict[str, dict[str, int]]:
        return {"compute_infer": self.compute_infer.to_json(), "compute_output": self.compute_output.to_json(),
                "success": self.success.to_json(), "fail": self.fail.to_json(),
                "empty_response": self.empty_response.to_json(), "cancel": self.cancel.to_json()}


@dataclass(slots=True)
class _BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class TritonStatistics:
    """Counters for one model version; mutated only from the event loop."""

    def __init__(self) -> None:
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.inference_count = 0  # items executed (a batch of n counts n)
        self.execution_count = 0  # batches executed
        self.last_inference_ms = 0
        self._batches: dict[int, _BatchStats] = {}
        self._responses: dict[int, _ResponseStats] = {}  # response index -> its statistics

    def response(self, index: int = 0) -> _ResponseStats:
        """The statistics of each request's `index`-th response (Triton's response_stats key)."""
        return self._responses.setdefault(index, _ResponseStats())

    def on_batch(self, batch_size: int, compute_s: float) -> None:
        """One executed batch of `batch_size` items (from the batcher's observer)."""
        self.execution_count += 1
        self.inference_count += batch_size
        self._batches.setdefault(batch_size, _BatchStats()).compute_infer.add(compute_s)

    def on_success(self, timings: StageTimings, batch_size: int, wall_ms: int) -> None:
        """A request answered with a result; `wall_ms` is the epoch time in milliseconds."""
        self.success.add(timings.total_ms / 1e3)
        self.queue.add(timings.queue_ms / 1e3)
        self.compute_input.add(timings.preprocess_ms / 1e3)
        self.compute_infer.add(timings.compute_ms / 1e3)
        self.compute_output.add(timings.postprocess_ms / 1e3)
        self.last_inference_ms = wall_ms
        first = self.response(0)  # one response per request (non-decoupled)
        first.compute_infer.add(timings.compute_ms / 1e3)
        first.compute_output.add(timings.postprocess_ms / 1e3)
        first.success.add((timings.compute_ms + timings.postprocess_ms) / 1e3)
        if batch_size > 0:
            stats = self._batches.setdefault(batch_size, _BatchStats())
            stats.compute_input.add(timings.preprocess_ms / 1e3)
            stats.compute_output.add(timings.postprocess_ms / 1e3)

    def on_failure(self, duration_s: float) -> None:
        self.fail.add(duration_s)

    def to_json(self, name: str, version: str) -> dict[str, object]:
        """Triton's ModelStatistics object (the HTTP JSON; gRPC parses the same dict)."""
        return {
            "name": name, "version": version, "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count, "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.to_json(), "fail": self.fail.to_json(), "queue": self.queue.to_json(),
                "compute_input": self.compute_input.to_json(), "compute_infer": self.compute_infer.to_json(),
                "compute_output": self.compute_output.to_json(),
                "cache_hit": Duration().to_json(), "cache_miss": Duration().to_json(),
            },
            "batch_stats": [
                {"batch_size": size, "compute_input": b.compute_input.to_json(),
                 "compute_infer": b.compute_infer.to_json(), "compute_output": b.compute_output.to_json()}
                for size, b in sorted(self._batches.items())
            ],
            "memory_usage": [],
            "response_stats": {str(index): r.to_json() for index, r in sorted(self._responses.items())},
        }


class LLMStatistics:
    """Triton statistics of one LLM: an OpenAIServing `RequestObserver` (headroom.llm.openai_usage)."""

    def __init__(self) -> None:
        self.stats = TritonStatistics()

    def on_usage(self, usage: LLMUsage) -> None:
        if usage.finish_reason in ("error", "abort"):
            self.stats.on_failure(usage.total_ms / 1e3)
            response = self.stats.response(0)
            if usage.finish_reason == "abort":
                response.cancel.add(0.0)
            else:
                response.fail.add((usage.prefill_ms + usage.decode_ms) / 1e3)
            return
        compute_ms = usage.prefill_ms + usage.decode_ms
        rest_ms = usage.total_ms - usage.preprocess_ms - usage.queue_ms - compute_ms
        timings = StageTimings(queue_ms=usage.queue_ms, batch_wait_ms=usage.queue_ms,
                               preprocess_ms=usage.preprocess_ms, compute_ms=compute_ms,
                               postprocess_ms=max(0.0, rest_ms), total_ms=usage.total_ms)
        self.stats.on_batch(1, compute_ms / 1e3)
        self.stats.on_success(timings, 1, time.time_ns() // 1_000_000)

    def on_refused(self, duration_s: float) -> None:
        self.stats.on_failure(duration_s)


__all__ = ["Duration", "LLMStatistics", "TritonStatistics"]
