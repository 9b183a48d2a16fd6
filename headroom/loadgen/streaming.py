"""Streaming LLM latencies exactly as vLLM's `bench serve` defines them (pure functions).

    TTFT  = first content chunk - start
    ITL   = gaps between consecutive content chunks (pooled over chunks; a chunk may hold several tokens)
    E2EL  = end of stream - start
    TPOT  = (E2EL - TTFT) / (output_tokens - 1), per request; undefined (None) when output_tokens <= 1

`start` is the request's intended send time in open-loop runs (so queueing in the generator is never hidden)
and its actual send time in closed-loop runs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamLatencies:
    """The per-request streaming latencies in seconds."""

    ttft_s: float | None  # time to first content chunk; None when no content chunk arrived
    tpot_s: float | None  # time per output token after the first; None when output_tokens <= 1
    itl_s: tuple[float, ...]  # inter-chunk gaps, len = chunks - 1
    e2e_s: float  # start to end of stream


def stream_latencies(
    start_s: float, chunk_times_s: tuple[float, ...], end_s: float, output_tokens: int
) -> StreamLatencies:
    """Compute TTFT, TPOT, ITL and E2EL from chunk arrival times (all on one clock)."""
    if end_s < start_s:
        raise ValueError(f"stream ended ({end_s}) before it started ({start_s})")
    if any(later < earlier for earlier, later in itertools.pairwise(chunk_times_s)):
        raise ValueError("chunk times must be non-decreasing")
    e2e_s = end_s - start_s
    if not chunk_times_s:
        return StreamLatencies(ttft_s=None, tpot_s=None, itl_s=(), e2e_s=e2e_s)
    ttft_s = chunk_times_s[0] - start_s
    itl_s = tuple(b - a for a, b in itertools.pairwise(chunk_times_s))
    tpot_s = (e2e_s - ttft_s) / (output_tokens - 1) if output_tokens > 1 else None
    return StreamLatencies(ttft_s=ttft_s, tpot_s=tpot_s, itl_s=itl_s, e2e_s=e2e_s)
