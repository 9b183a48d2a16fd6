"""A Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over a paged KV cache.

Tensor names follow Hugging Face (`model.layers.0.self_attn.q_proj.weight`, ...), so HF checkpoints and our
converted GGUF load with `load_state_dict`. One forward takes a *flat* batch of new tokens from many
sequences (prefill chunks and decodes mixed); attention gathers each sequence's context from the cache (one
`index_select` of whole blocks per layer) and runs padded attention as one strided `bmm` per KV head.
After loading, `fuse_projections` concatenates q/k/v and gate/up (fewer, larger matmuls; state_dict keys
become `qkv_proj` / `gate_up_proj`).
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
    mask_bias: torch.Tensor  # [B, 1, 1, Q, K] fp32: 0 where a query may attend a key (causal), -inf elsewhere
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
        if x.dtype == torch.float32:  # one fused kernel (same formula as below)
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


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

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin rows for `positions` ([T]) as [T, 1, D]: looked up once per forward, shared by layers."""
        cos = cast(torch.Tensor, self.cos)[positions].unsqueeze(1).to(dtype)
        sin = cast(torch.Tensor, self.sin)[positions].unsqueeze(1).to(dtype)
        return cos, sin

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, H, D]; positions: [T]."""
        cos, sin = self.tables(positions, x.dtype)
        return apply_rotary(x, cos, sin)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D] rotated by the [T, 1, D] tables."""
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
        self.qkv_proj: nn.Module | None = None  # q, k, v fused into one matmul by `fuse_projections`

    def fuse_projections(self) -> None:
        """Concatenate q/k/v into one `qkv_proj` (one matmul per layer); the separate ones are dropped."""
        if self.qkv_proj is not None:
            return
        parts = [self.q_proj, self.k_proj, self.v_proj]
        fused = Linear(parts[0].weight.shape[1], sum(p.weight.shape[0] for p in parts), bias=parts[0].bias is not None)
        fused.weight = nn.Parameter(torch.cat([p.weight.detach() for p in parts]), requires_grad=False)
        if fused.bias is not None:
            fused.bias = nn.Parameter(
                torch.cat([cast(torch.Tensor, p.bias).detach() for p in parts]), requires_grad=False
            )
        self.qkv_proj = fused
        del self.q_proj, self.k_proj, self.v_proj

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        t, hd, nh, nkv = x.shape[0], self.head_dim, self.num_heads, self.num_kv_heads
        if self.qkv_proj is not None:
            qkv = self.qkv_proj(x).view(t, nh + 2 * nkv, hd)
            qk = apply_rotary(qkv[:, : nh + nkv], cos, sin)  # q and k rotated together
            q, k, v = qk[:, :nh], qk[:, nh:], qkv[:, nh + nkv :]
        else:
            q = apply_rotary(self.q_proj(x).view(t, nh, hd), cos, sin)
            k = apply_rotary(self.k_proj(x).view(t, nkv, hd), cos, sin)
            v = self.v_proj(x).view(t, nkv, hd)
        k_cache.index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))
        v_cache.index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))
        b, nq = meta.query_index.shape
        hkv, hd, group = self.num_kv_heads, self.head_dim, self.num_heads // self.num_kv_heads
        # queries grouped by their kv head: [B, Hkv, G*Q, D] (query head h uses kv head h // G)
        qp = q[meta.query_index].view(b, nq, hkv, group, hd).permute(0, 2, 3, 1, 4).reshape(b, hkv, -1, hd)
        # gather whole blocks (contiguous rows, one index_select), viewed as each sequence's padded context
        bs, nb = meta.block_size_tokens, meta.key_blocks.shape[1]
        flat_blocks = meta.key_blocks.reshape(-1)
        kp = k_cache.view(-1, bs * hkv * hd).index_select(0, flat_blocks).view(b, nb * bs, hkv, hd)
        vp = v_cache.view(-1, bs * hkv * hd).index_select(0, flat_blocks).view(b, nb * bs, hkv, hd)
        kp, vp = kp.to(q.dtype), vp.to(q.dtype)
        # one strided bmm per kv head (no K/V copy, no GQA repeat); the additive mask is shared by the group
        scores = torch.stack([torch.bmm(qp[:, h], kp[:, :, h].transpose(1, 2)) for h in range(hkv)], 1)
        probs = scores.view(b, hkv, group, nq, -1).float().mul_(hd**-0.5).add_(meta.mask_bias).softmax(-1)
        probs = probs.to(q.dtype).view(b, hkv, group * nq, -1)
        out = torch.stack([torch.bmm(probs[:, h], vp[:, :, h]) for h in range(hkv)], 1)  # [B, Hkv, G*Q, D]
        out = out.view(b, hkv, group, nq, hd).permute(0, 3, 1, 2, 4).reshape(b * nq, self.num_heads * hd)
        out = out[meta.token_to_padded]
        result: torch.Tensor = self.o_proj(out)
        return result


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_proj: nn.Module | None = None  # gate and up fused into one matmul by `fuse_projections`

    def fuse_projections(self) -> None:
        """Concatenate gate/up into one `gate_up_proj`; the separate ones are dropped."""
        if self.gate_up_proj is not None:
            return
        gate, up = self.gate_proj, self.up_proj
        fused = Linear(gate.weight.shape[1], 2 * gate.weight.shape[0], bias=False)
        fused.weight = nn.Parameter(torch.cat([gate.weight.detach(), up.weight.detach()]), requires_grad=False)
        self.gate_up_proj = fused
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)
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
        cos, sin = self.rotary.tables(positions, h.dtype)
        for mod, (k_cache, v_cache) in zip(self.model.layers, kv_caches, strict=True):
            layer = cast(DecoderLayer, mod)
            h = h + layer.self_attn(layer.input_layernorm(h), cos, sin, k_cache, v_cache, meta)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h = self.model.norm(h[logits_indices])
        logits: torch.Tensor = self.lm_head(h).float()
        return logits

    def fuse_projections(self) -> None:
        """Fuse q/k/v and gate/up in every layer (fewer, larger matmuls; run after the weights are loaded).
        `state_dict()` then has `qkv_proj`/`gate_up_proj` instead of the Hugging Face names."""
        for mod in self.model.layers:
            layer = cast(DecoderLayer, mod)
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()


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
