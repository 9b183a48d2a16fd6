"""LLM sizing: KV-cache bytes, concurrent sequences, the TPOT floor, prefill time, tokens/hour, cost per
million tokens and joules per token (the textbook's Llama-3-8B case study and napkin math 1.5).

Case study inputs: Llama 3 8B (8.03e9 parameters, 32 layers, 8 KV heads of 128, d_model 4096) in 4-bit AWQ
weights on an H100 SXM5 (80 GiB HBM3, 3.35 TB/s, 989.4 TFLOP/s dense BF16). Results: 0.131 MB of FP16 KV
per token, a 1.2 ms TPOT floor (1.97 ms on an A100's 2.04 TB/s), a 41.9 ms prefill of 1,000 tokens at 40 %
efficiency, ~469 sequences of 1,256 tokens in a 72 GiB KV budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SECONDS_PER_HOUR = 3600.0
GIB = 2**30


def _positive(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_element: float = 2.0) -> float:
    """``2 (K and V) * layers * kv_heads * head_dim * bytes``: 131,072 B for Llama 3 8B in FP16."""
    for name, v in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    _positive("bytes_per_element", bytes_per_element)
    return 2.0 * num_layers * num_kv_heads * head_dim * bytes_per_element


def weight_bytes(num_params: float, bits_per_param: float) -> float:
    """Resident weight bytes: ``params * bits / 8`` (8.03e9 at 4 bits is 4.015 GB)."""
    _positive("num_params", num_params)
    _positive("bits_per_param", bits_per_param)
    return num_params * bits_per_param / 8.0


def kv_bytes(batch_size: int, context_tokens: int, per_token_bytes: float) -> float:
    """Total KV cache for `batch_size` sequences of `context_tokens` each."""
    return batch_size * context_tokens * per_token_bytes


def concurrent_sequences(kv_budget_bytes: float, tokens_per_sequence: int, per_token_bytes: float) -> int:
    """Sequences whose whole context fits in the KV budget at once (floor)."""
    _positive("kv_budget_bytes", kv_budget_bytes)
    if tokens_per_sequence < 1:
        raise ValueError(f"tokens_per_sequence must be >= 1, got {tokens_per_sequence}")
    return math.floor(kv_budget_bytes / (tokens_per_sequence * per_token_bytes) + 1e-9)


def max_context_tokens(kv_budget_bytes: float, batch_size: int, per_token_bytes: float) -> float:
    """The longest context each of `batch_size` sequences may hold in the budget (figure 7: ~4.3k tokens)."""
    _positive("kv_budget_bytes", kv_budget_bytes)
    return kv_budget_bytes / (batch_size * per_token_bytes)


def tpot_floor_s(bytes_streamed: float, bandwidth_bytes_per_s: float) -> float:
    """Equation 18: a batch-1 decode step streams every weight once, ``T_token >= bytes / bandwidth``."""
    _positive("bytes_streamed", bytes_streamed)
    _positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    return bytes_streamed / bandwidth_bytes_per_s


def prefill_flops(num_params: float, prompt_tokens: int, num_layers: int = 0, d_model: int = 0) -> float:
    """``2 * params * n`` for the dense layers plus ``4 * layers * n^2 * d_model`` for attention scores and
    values (pass layers = 0 to leave attention out)."""
    _positive("num_params", num_params)
    if prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be >= 1, got {prompt_tokens}")
    return 2.0 * num_params * prompt_tokens + 4.0 * num_layers * prompt_tokens**2 * d_model


def prefill_time_s(flops: float, peak_flops_per_s: float, efficiency: float) -> float:
    """Compute-bound prefill: ``FLOPs / (peak * efficiency)``."""
    _positive("peak_flops_per_s", peak_flops_per_s)
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    return flops / (peak_flops_per_s * efficiency)


def tokens_per_hour(tokens_per_s: float) -> float:
    """Token throughput over an hour."""
    return tokens_per_s * SECONDS_PER_HOUR


def cost_per_million_tokens(hourly_cost: float, tokens_per_hour_value: float) -> float:
    """``hourly cost / tokens per hour * 1e6`` ($3/h at 45.2 M tokens/h is $0.066)."""
    _positive("tokens_per_hour", tokens_per_hour_value)
    if hourly_cost < 0:
        raise ValueError(f"hourly_cost must be >= 0, got {hourly_cost}")
    return hourly_cost / tokens_per_hour_value * 1e6


def joules_per_token(power_w: float, tokens_per_s: float) -> float:
    """Energy per token: ``watts / tokens per second`` (1,000 W at 912 tok/s is 1.0965 J/token)."""
    _positive("power_w", power_w)
    _positive("tokens_per_s", tokens_per_s)
    return power_w / tokens_per_s


@dataclass(frozen=True, slots=True)
class LlmSizing:
    """The case-study chain for one model on one accelerator."""

    weight_bytes: float  # resident weights
    kv_bytes_per_token: float  # per token of context, all layers
    memory_left_bytes: float  # HBM minus weights (KV cache plus runtime workspace)
    kv_budget_bytes: float  # the part reserved for KV
    kv_tokens: float  # kv_budget / kv_bytes_per_token
    concurrent_sequences: int  # whole sequences of prompt + output tokens that fit
    tpot_floor_s: float  # weights / bandwidth
    prefill_s: float  # prompt FLOPs / (peak * efficiency): the model side of TTFT
    decode_s: float  # output tokens * (TPOT floor + per-token overhead)
    request_s: float  # prefill + decode for one request at batch 1
    tokens_per_hour: float  # at the given sustained request rate (or the prefill-bound rate)
    cost_per_million_tokens: float  # hourly cost / tokens per hour
    joules_per_token: float  # power / tokens per second


@dataclass(frozen=True, slots=True)
class LlmSpec:
    """Inputs of `size_llm`; defaults are the textbook's Llama-3-8B-on-H100 case study."""

    num_params: float = 8.03e9  # parameters
    bits_per_param: float = 4.0  # weight precision (AWQ 4-bit)
    num_layers: int = 32  # transformer layers
    num_kv_heads: int = 8  # KV heads (grouped-query attention)
    head_dim: int = 128  # per-head width
    d_model: int = 4096  # hidden size (attention FLOPs)
    kv_bytes_per_element: float = 2.0  # FP16 KV cache
    hbm_bytes: float = 80.0 * GIB  # accelerator memory
    kv_budget_bytes: float = 72.0 * GIB  # memory reserved for KV cache
    bandwidth_bytes_per_s: float = 3.35e12  # HBM bandwidth
    peak_flops_per_s: float = 989.4e12  # dense BF16 peak
    compute_efficiency: float = 0.4  # achieved share of the peak in prefill
    prompt_tokens: int = 1000  # tokens in
    output_tokens: int = 256  # tokens out
    tpot_overhead_s: float = 0.0  # per-token runtime dispatch above the bandwidth floor
    hourly_cost: float = 3.0  # dollars per accelerator-hour
    power_w: float = 1000.0  # accelerator plus host share, watts
    request_rate_per_s: float = 0.0  # sustained requests/s; 0 = the prefill-bound ceiling 1 / prefill_s


def size_llm(spec: LlmSpec) -> LlmSizing:
    """Run the case-study chain for `spec`."""
    w = weight_bytes(spec.num_params, spec.bits_per_param)
    per_tok = kv_bytes_per_token(spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.kv_bytes_per_element)
    left = spec.hbm_bytes - w
    if left <= 0:
        raise ValueError(f"weights ({w / 1e9:.1f} GB) do not fit in {spec.hbm_bytes / 1e9:.1f} GB; quantise "
                         "harder or shard the model")
    budget = min(spec.kv_budget_bytes, left)
    seq_tokens = spec.prompt_tokens + spec.output_tokens
    tpot = tpot_floor_s(w, spec.bandwidth_bytes_per_s)
    prefill = prefill_time_s(prefill_flops(spec.num_params, spec.prompt_tokens, spec.num_layers, spec.d_model),
                             spec.peak_flops_per_s, spec.compute_efficiency)
    decode = spec.output_tokens * (tpot + spec.tpot_overhead_s)
    rate = spec.request_rate_per_s if spec.request_rate_per_s > 0 else 1.0 / prefill
    tok_s = rate * seq_tokens
    tph = tokens_per_hour(tok_s)
    return LlmSizing(weight_bytes=w, kv_bytes_per_token=per_tok, memory_left_bytes=left, kv_budget_bytes=budget,
                     kv_tokens=budget / per_tok, concurrent_sequences=concurrent_sequences(budget, seq_tokens, per_tok),
                     tpot_floor_s=tpot, prefill_s=prefill, decode_s=decode, request_s=prefill + decode,
                     tokens_per_hour=tph, cost_per_million_tokens=cost_per_million_tokens(spec.hourly_cost, tph),
                     joules_per_token=joules_per_token(spec.power_w, tok_s))
