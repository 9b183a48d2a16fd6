"""A Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over a paged KV cache.

Tensor names follow Hugging Face (`model.layers.0.self_attn.q_proj.weight`, ...), so HF checkpoints and our
converted GGUF load with `load_state_dict`. One forward takes a *flat* batch of new tokens from many
sequences (prefill chunks and decodes mixed); attention gathers each sequence's context from the cache and
runs one padded `scaled_dot_product_attention` per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from headroom.llm.config import DecoderConfig


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """How the flat batch of new tokens maps onto sequences and cache slots for one forward."""

    slot_mapping: torch.Tensor  # [T] long: cache slot each new token's K/V is written to
    query_index: torch.Tensor  # [B, Q] long: flat token index of each sequence's i-th new token (0 = pad)
    token_to_padded: torch.Tensor  # [T] long: position of each flat token in the [B*Q] padded layout
    key_blocks: torch.Tensor  # [B, NB] long: each sequence's block table (0 = pad); keys K = NB * block size
    mask: torch.Tensor  # [B, 1, Q, K] bool: True where a query may attend a key (causal + padding)
    block_size_tokens: int  # tokens per cache block


class Linear(nn.Module):
    """`nn.Linear` without the random init (weights always come from a checkpoint; init is slow on meta)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    """`nn.Embedding` without the random init."""

    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in fp32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary(nn.Module):
    """Rotary position embedding (rotate-half layout), cos/sin tables precomputed for the context."""

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, H, D]; positions: [T]."""
        cos = cast(torch.Tensor, self.cos)[positions].unsqueeze(1).to(x.dtype)
        sin = cast(torch.Tensor, self.sin)[positions].unsqueeze(1).to(x.dtype)
        out: torch.Tensor = x * cos + _rotate_half(x) * sin
        return out


class Attention(nn.Module):
    """Grouped-query attention writing to and reading from one layer's paged cache."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        hd = cfg.head_dim_resolved
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = hd
        self.q_proj = Linear(cfg.hidden_size, self.num_heads * hd, bias=cfg.attention_bias)
        self.k_proj = Linear(cfg.hidden_size, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = Linear(cfg.hidden_size, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = Linear(self.num_heads * hd, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: Rotary,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        t = x.shape[0]
        q = rotary(self.q_proj(x).view(t, self.num_heads, self.head_dim), positions)
        k = rotary(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim), positions)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        k_cache.index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))
        v_cache.index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))
        b, nq = meta.query_index.shape
        qp = q[meta.query_index].transpose(1, 2)  # [B, H, Q, D]
        # gather whole blocks (contiguous rows), then view them as each sequence's padded context
        bs, keys = meta.block_size_tokens, meta.key_blocks.shape[1] * meta.block_size_tokens
        paged = (-1, bs, self.num_kv_heads, self.head_dim)
        kp = k_cache.view(paged)[meta.key_blocks].view(b, keys, self.num_kv_heads, self.head_dim)
        vp = v_cache.view(paged)[meta.key_blocks].view(b, keys, self.num_kv_heads, self.head_dim)
        kp = kp.transpose(1, 2).to(q.dtype)  # [B, Hkv, K, D]
        vp = vp.transpose(1, 2).to(q.dtype)
        out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=meta.mask, enable_gqa=True)
        out = out.transpose(1, 2).reshape(b * nq, self.num_heads * self.head_dim)[meta.token_to_padded]
        result: torch.Tensor = self.o_proj(out)
        return result


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    """Pre-norm attention + pre-norm MLP, both residual."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderBody(nn.Module):
    """Embeddings, layers, final norm (HF's `model.` prefix)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderForCausalLM(nn.Module):
    """The whole decoder; `forward` returns logits only at `logits_indices`."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.model = DecoderBody(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.head_dim_resolved, cfg.max_position_embeddings, cfg.rope_theta)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids)
        for mod, (k_cache, v_cache) in zip(self.model.layers, kv_caches, strict=True):
            layer = cast(DecoderLayer, mod)
            h = h + layer.self_attn(layer.input_layernorm(h), positions, self.rotary, k_cache, v_cache, meta)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h = self.model.norm(h[logits_indices])
        logits: torch.Tensor = self.lm_head(h).float()
        return logits


def build_model(
    cfg: DecoderConfig, state_dict: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype
) -> DecoderForCausalLM:
    """Instantiate without random init, then adopt the (memory-mapped) tensors; RoPE tables stay fp32."""
    model = DecoderForCausalLM(cfg)  # uninitialised (torch.empty) parameters: cheap, replaced below
    sd = dict(state_dict)
    if cfg.tie_word_embeddings or "lm_head.weight" not in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    wanted = set(model.state_dict())
    missing = wanted - set(sd)
    if missing:
        raise ValueError(f"checkpoint lacks tensors: {sorted(missing)[:5]} ... ({len(missing)} missing)")
    sd = {k: v for k, v in sd.items() if k in wanted}
    model.load_state_dict(sd, assign=True, strict=True)
    model = model.to(device=device, dtype=dtype)
    model.rotary = Rotary(cfg.head_dim_resolved, cfg.max_position_embeddings, cfg.rope_theta).to(device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()
