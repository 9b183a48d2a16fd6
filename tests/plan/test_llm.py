"""LLM sizing: the Llama-3-8B case study, napkin math 1.5 and the KV-cache figures."""

from __future__ import annotations

import pytest

from headroom.plan import llm

GIB = 2**30


def test_llama3_8b_case_study() -> None:
    s = llm.size_llm(llm.LlmSpec())
    assert s.kv_bytes_per_token == 131072  # 0.131 MB
    assert s.weight_bytes == pytest.approx(4.015e9)
    assert s.memory_left_bytes / 1e9 == pytest.approx(81.9, abs=0.05)
    assert s.tpot_floor_s * 1e3 == pytest.approx(1.2, abs=0.005)
    assert s.prefill_s * 1e3 == pytest.approx(41.9, abs=0.05)
    assert s.kv_tokens / 1e6 == pytest.approx(0.6, abs=0.05)
    assert s.concurrent_sequences == 469


def test_decode_time_with_dispatch_overhead() -> None:
    # The modelled TPOT of 1.57 ms over 256 tokens is 0.40 s.
    s = llm.size_llm(llm.LlmSpec(tpot_overhead_s=0.00157 - 4.015e9 / 3.35e12))
    assert s.decode_s == pytest.approx(0.40, abs=0.005)


def test_a100_tpot_floor_and_fp16_self_check() -> None:
    assert llm.tpot_floor_s(4.015e9, 2.04e12) * 1e3 == pytest.approx(1.97, abs=0.005)
    assert llm.tpot_floor_s(16e9, 2000e9) * 1e3 == pytest.approx(8.0)


def test_unit_economics() -> None:
    # $3/h at 45.2 M tokens/h is $0.066 per million tokens (10 req/s of 1,256 tokens is 45.2 M tokens/h).
    tph = llm.tokens_per_hour(10 * 1256)
    assert tph / 1e6 == pytest.approx(45.2, abs=0.05)
    assert llm.cost_per_million_tokens(3.0, tph) == pytest.approx(0.066, abs=0.0005)
    s = llm.size_llm(llm.LlmSpec(request_rate_per_s=10))
    assert s.cost_per_million_tokens == pytest.approx(0.066, abs=0.0005)


def test_napkin_math_1_5_energy() -> None:
    j = llm.joules_per_token(700 + 300, 114 * 8)
    assert j == pytest.approx(1.0965, abs=0.00005)
    assert j * 500 == pytest.approx(548.2, abs=0.05)
    # At 10 % utilisation: ~300 W GPU + 300 W host over a tenth of the tokens -> 6.6 J/token.
    assert llm.joules_per_token(600, 912 * 0.1) == pytest.approx(6.6, abs=0.05)


def test_70b_kv_figures() -> None:
    per_tok = llm.kv_bytes_per_token(80, 8, 128)  # 0.33 MB per token
    assert per_tok / 1e6 == pytest.approx(0.33, abs=0.005)
    assert llm.kv_bytes(32, 8000, per_tok) / 1e9 == pytest.approx(84, abs=5)  # "about 80 GB"
    assert llm.max_context_tokens(45e9, 32, per_tok) / 1e3 == pytest.approx(4.3, abs=0.05)


def test_errors() -> None:
    with pytest.raises(ValueError, match="quantise"):
        llm.size_llm(llm.LlmSpec(bits_per_param=16, num_params=70e9))
    with pytest.raises(ValueError, match="efficiency"):
        llm.prefill_time_s(1e12, 1e15, 1.5)
