"""Contracts between the load generator's parts: what a client sends, what it gets back, what is recorded.

A `WorkItem` is one request's payload, already encoded for a protocol. A `ClientReply` is what a protocol
client observed (timestamps on the injected clock). The dispatcher turns both into a `RequestRecord`, whose
latencies are measured from the INTENDED send time in open-loop mode (no coordinated omission).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One request, ready for a protocol client."""

    index: int  # position in the workload (wraps around when the schedule is longer than the dataset)
    body: object  # JSON-able dict for HTTP protocols, bytes for `image`, numpy arrays for v2-grpc
    input_tokens: int = 0  # prompt length in tokens (LLM workloads; 0 when unknown or not applicable)
    max_output_tokens: int = 0  # requested output length in tokens (LLM workloads; 0 when not applicable)


@dataclass(frozen=True, slots=True)
class ClientReply:
    """What a protocol client observed for one request; times are seconds on the dispatcher's clock."""

    ok: bool  # the request succeeded (2xx and a well-formed body)
    status: str  # "200", "503", ... for HTTP; a gRPC code name; or "timeout" / "connect_error" / "error"
    sent_s: float  # when the request actually left (clock seconds)
    end_s: float  # when the last byte of the reply arrived (clock seconds)
    chunk_times_s: tuple[float, ...] = ()  # arrival time of each content chunk (streaming only)
    output_tokens: int = 0  # tokens generated (usage field, else one per content chunk); 0 if not LLM
    input_tokens: int = 0  # prompt tokens reported by the server's usage field (0 when absent)
    server_timing_ms: tuple[tuple[str, float], ...] = ()  # (stage, milliseconds) parsed from Server-Timing
    error: str = ""  # short error text when not ok


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request as the report sees it; offsets are seconds from the run's start."""

    index: int  # send order (0-based)
    intended_s: float  # when the schedule wanted it sent
    sent_s: float  # when it actually left (>= intended_s; the gap is the generator's own lag)
    end_s: float  # when the reply finished
    ok: bool  # succeeded
    status: str  # HTTP status, gRPC code name, or a client-side failure label
    latency_s: float  # end-to-end latency: end - intended (open loop) or end - sent (closed loop)
    ttft_s: float | None = None  # time to first content chunk from the same start as latency_s (streaming)
    tpot_s: float | None = None  # (e2e - ttft) / (output_tokens - 1) per vLLM; None when output <= 1
    itl_s: tuple[float, ...] = ()  # gaps between consecutive content chunks (streaming)
    output_tokens: int = 0  # generated tokens
    input_tokens: int = 0  # prompt tokens
    server_timing_ms: tuple[tuple[str, float], ...] = field(default_factory=tuple)  # parsed Server-Timing
    error: str = ""  # error text when not ok


@dataclass(frozen=True, slots=True)
class Slo:
    """Service-level objectives a request must meet to count toward goodput; 0 disables a bound."""

    p99_ms: float = 0.0  # bound on the run's p99 end-to-end latency (the Server scenario's validity rule)
    e2e_ms: float = 0.0  # per-request bound on end-to-end latency
    ttft_ms: float = 0.0  # per-request bound on time to first token
    tpot_ms: float = 0.0  # per-request bound on time per output token

    def request_meets(self, record: RequestRecord) -> bool:
        """True when `record` succeeded and meets every per-request bound (vLLM/DistServe goodput rule)."""
        if not record.ok:
            return False
        e2e_bound_ms = self.e2e_ms or self.p99_ms
        if e2e_bound_ms and record.latency_s * 1000.0 > e2e_bound_ms:
            return False
        if self.ttft_ms and record.ttft_s is not None and record.ttft_s * 1000.0 > self.ttft_ms:
            return False
        tpot_s = record.tpot_s if record.tpot_s is not None else 0.0
        return not (self.tpot_ms and tpot_s * 1000.0 > self.tpot_ms)
