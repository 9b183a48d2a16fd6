"""A Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over a paged KV cache.

Tensor names follow Hugging Face (`model.layers.0.self_attn.q_proj.weight`, ...), so HF checkpoints and our
converted GGUF load with `load_state_dict`. One forward takes a *flat* batch of new tokens from many
sequences (prefill chunks and decodes mixed). The K/V cache is head-major (`[Hkv, slots, D]` per layer), so
one `index_select` of whole blocks gathers every sequence's context already laid out as `[Hkv * B, K, D]`,
and attention is one `bmm` for the scores and one for the output over all heads and sequences. Decodes and
longer chunks are padded and attended as separate groups (`AttentionGroup`), so a 100-token prompt chunk
does not pad 30 decodes to 100 query rows.
After loading, `fuse_projections` concatenates q/k/v and gate/up (fewer, larger matmuls; state_dict keys
become `qkv_proj` / `gate_up_proj`). With `AttentionMetadata.kernel` (CPU fp32, headroom.llm.kernels) RoPE + the
cache write are one C call and decode groups are attended in place through their block tables (no gather).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn

from headroom.llm.config import DecoderConfig

if TYPE_CHECKING:
    from headroom.llm.kernels.paged_attention import PagedAttentionKernel


@dataclass(frozen=True, slots=True)
class AttentionGroup:
    """Sequences whose queries are padded to one length Q and attended together (decodes apart from prefill
    chunks, so one long chunk does not pad every decode to its length)."""

    query_index: torch.Tensor  # [B, Q] long: flat token index of each sequence's i-th new token (0 = pad)
    query_slice: tuple[int, int] | None  # (start, end): the group's tokens are flat[start:end], unpadded
    flat_blocks: torch.Tensor  # [B * NB] long: each sequence's block table, 0-padded to NB, flattened
    mask_bias: torch.Tensor  # [B, 1, Q, NB * block size] fp32: 0 where a query may attend a key, -inf elsewhere
    seq_lens: torch.Tensor  # [B] long: each sequence's context length after this step (keys its last query sees)


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """How the flat batch of new tokens maps onto sequences and cache slots for one forward."""

    slot_mapping: torch.Tensor  # [T] long: cache slot each new token's K/V is written to
    groups: tuple[AttentionGroup, ...]  # the sequences, partitioned (each sequence in exactly one group)
    token_to_padded: torch.Tensor  # [T] long: row of each flat token in the groups' padded outputs, concatenated
    padded_is_flat: bool  # the concatenated padded outputs are already in flat token order (no gather needed)
    block_size_tokens: int  # tokens per cache block
    kernel: PagedAttentionKernel | None = None  # the C paged-attention kernel (CPU fp32); None = torch ops only


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


class Rotary(nn.Module):
    """Rotary position embedding (rotate-half layout), cos/sin tables precomputed for the context.

    The sin table is stored *signed* (first half negated), so rotate-half becomes a roll:
    `cat(-x2, x1) * sin == roll(x, D/2) * cat(-sin1, sin2)` exactly (negation is exact), in 4 ops instead of 7.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        half = head_dim // 2
        sin = emb.sin()
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin_signed", torch.cat((-sin[:, :half], sin[:, half:]), dim=-1), persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed-sin rows for `positions` ([T]) as [T, 1, D]: looked up once per forward, shared by
        layers (pass them to `apply_rotary`)."""
        cos = cast(torch.Tensor, self.cos)[positions].unsqueeze(1).to(dtype)
        sin = cast(torch.Tensor, self.sin_signed)[positions].unsqueeze(1).to(dtype)
        return cos, sin

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, H, D]; positions: [T]."""
        cos, sin = self.tables(positions, x.dtype)
        return apply_rotary(x, cos, sin)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D] rotated by the [T, 1, D] tables of `Rotary.tables` (`x * cos + rotate_half(x) * sin`)."""
    out: torch.Tensor = x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed
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
        kernel = meta.kernel
        if kernel is not None and self.qkv_proj is not None:  # RoPE + cache write in one C call
            q = kernel.rope_write_kv(self.qkv_proj.forward(x), cos, sin, meta.slot_mapping, k_cache, v_cache, nh)
            outs = [
                kernel.decode_attention(q, k_cache, v_cache, g, meta.block_size_tokens)
                if g.query_index.shape[1] == 1
                else self._attend(q, k_cache, v_cache, g, meta.block_size_tokens)
                for g in meta.groups
            ]
            return self._project(outs, meta)
        if self.qkv_proj is not None:
            qkv = self.qkv_proj.forward(x).view(t, nh + 2 * nkv, hd)
            qk = apply_rotary(qkv[:, : nh + nkv], cos, sin)  # q and k rotated together
            q, k, v = qk[:, :nh], qk[:, nh:], qkv[:, nh + nkv :]
        else:
            q = apply_rotary(self.q_proj(x).view(t, nh, hd), cos, sin)
            k = apply_rotary(self.k_proj(x).view(t, nkv, hd), cos, sin)
            v = self.v_proj(x).view(t, nkv, hd)
        if k.dtype != k_cache.dtype:
            k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        # the cache is head-major, [Hkv, slots, D]: one layer's new K/V go in with one index_copy_ each
        k_cache.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
        v_cache.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
        return self._project([self._attend(q, k_cache, v_cache, g, meta.block_size_tokens) for g in meta.groups], meta)

    def _project(self, outs: list[torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        """The groups' padded outputs back in flat token order, through o_proj."""
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        if not meta.padded_is_flat:
            out = out[meta.token_to_padded]
        result: torch.Tensor = self.o_proj.forward(out)
        return result

    def _attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, g: AttentionGroup, block_size: int
    ) -> torch.Tensor:
        """One group's attention output, [B * Q, H * D] in the padded layout."""
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        b, nq = g.query_index.shape
        group = nh // nkv
        # queries grouped by their kv head: [Hkv * B, G * Q, D] (query head h uses kv head h // G)
        if g.query_slice is not None:
            qp = q[g.query_slice[0] : g.query_slice[1]].reshape(b, nq, nh, hd)
        else:
            qp = q[g.query_index]
        qp = qp.view(b, nq, nkv, group, hd).permute(2, 0, 3, 1, 4).reshape(nkv * b, group * nq, hd)
        # gather whole blocks (contiguous rows, one index_select per cache): [Hkv * B, K, D], already contiguous
        row = block_size * hd
        kp = k_cache.view(nkv, -1, row).index_select(1, g.flat_blocks).view(nkv * b, -1, hd)
        vp = v_cache.view(nkv, -1, row).index_select(1, g.flat_blocks).view(nkv * b, -1, hd)
        if kp.dtype != q.dtype:
            kp, vp = kp.to(q.dtype), vp.to(q.dtype)
        # all heads of all sequences in one bmm each; the additive [B, 1, Q, K] mask is shared by every head
        scores = torch.bmm(qp, kp.transpose(1, 2)).view(nkv, b, group, nq, kp.shape[1])
        probs = scores.float().mul_(hd**-0.5).add_(g.mask_bias).softmax(-1)
        if probs.dtype != q.dtype:
            probs = probs.to(q.dtype)
        out = torch.bmm(probs.view(nkv * b, group * nq, -1), vp)  # [Hkv * B, G * Q, D]
        return out.view(nkv, b, group, nq, hd).permute(1, 3, 0, 2, 4).reshape(b * nq, nh * hd)


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
            gate, up = self.gate_up_proj.forward(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        out: torch.Tensor = self.down_proj.forward(F.silu(gate).mul_(up))
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
        # `.forward` directly, not `module(...)`: hooks are never used here, and the call machinery costs as much
        # as a small kernel (a decode step of a 135M model makes ~250 module calls)
        for mod, (k_cache, v_cache) in zip(self.model.layers, kv_caches, strict=True):
            layer = cast(DecoderLayer, mod)
            h = h + layer.self_attn.forward(layer.input_layernorm.forward(h), cos, sin, k_cache, v_cache, meta)
            h = h + layer.mlp.forward(layer.post_attention_layernorm.forward(h))
        h = self.model.norm.forward(h[logits_indices])
        logits: torch.Tensor = self.lm_head.forward(h).float()
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
