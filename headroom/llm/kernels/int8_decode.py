"""The whole int8 decode step in one C call (`int8_decode.c`): the batch-1 (few-sequence) fast path on CPU.

With int8 weights on CPU, a decode step of up to `EngineConfig.kernel_decode_max_seqs` sequences (every sequence
one new token, each wanting its logits) skips the torch modules: `Int8DecodeKernel.decode` hands the token ids,
positions, cache slots and block tables to `hr_q8_decode_step`, which runs embedding, every layer (RMSNorm, the
fused q/k/v, RoPE + cache write, paged attention, o, SwiGLU, residuals) and the lm_head in one OpenMP region.
At batch 1 the module path spends more time dispatching its ~400 torch ops than in the matmuls.

Numerics (why it is its own backend, `decode_backend`): the weights are the same per-channel int8 as the FBGEMM
path, but activations are quantised per *row*, symmetric 8-bit (FBGEMM: one 7-bit asymmetric scale per call),
so a decode row's logits do not depend on the other rows in the step. Prefill chunks, longer decode steps and
speculative verification keep the FBGEMM module path. Memory: the kernel reads the plain int8 weights
(`Int8DynamicLinear.qweight`); loaded from the int8 cache these are views of the memory-mapped file.
"""

from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from headroom.llm.kernels.build import BACKENDS, KernelUnavailableError, load_library
from headroom.llm.model import DecoderForCausalLM, DecoderLayer
from headroom.llm.quant import Int8DynamicLinear

if TYPE_CHECKING:
    from headroom.llm.runner import ModelBatch

log = logging.getLogger("headroom.llm")
_P, _I = ctypes.c_void_p, ctypes.c_int64


class Q8Linear(ctypes.Structure):
    """`hr_q8_linear`: one int8 linear's pointers and shape."""

    _fields_ = [("weight", _P), ("scale", _P), ("bias", _P), ("out_features", _I), ("in_features", _I)]


class Q8Layer(ctypes.Structure):
    """`hr_q8_layer`: one decoder layer's norms, linears and K/V cache."""

    _fields_ = [
        ("input_norm", _P), ("post_norm", _P), ("qkv", Q8Linear), ("o", Q8Linear), ("gate_up", Q8Linear),
        ("down", Q8Linear), ("k_cache", _P), ("v_cache", _P),
    ]  # fmt: skip


class Q8Decoder(ctypes.Structure):
    """`hr_q8_decoder`: the whole model."""

    _fields_ = [
        ("num_layers", _I), ("hidden", _I), ("num_heads", _I), ("num_kv_heads", _I), ("head_dim", _I),
        ("intermediate", _I), ("vocab", _I), ("num_slots", _I), ("block_size", _I), ("max_positions", _I),
        ("eps", ctypes.c_float), ("embed", _P), ("cos_table", _P), ("sin_table", _P), ("final_norm", _P),
        ("layers", ctypes.POINTER(Q8Layer)), ("lm_head", Q8Linear),
    ]  # fmt: skip


def q8_linear(lin: Int8DynamicLinear) -> Q8Linear:
    """The C view of an int8 linear (the tensors must outlive it)."""
    bias = 0 if lin.bias_fp32 is None else lin.bias_fp32.data_ptr()
    return Q8Linear(lin.qweight.data_ptr(), lin.scales.data_ptr(), bias, lin.out_features, lin.in_features)


def linear_forward(lib: ctypes.CDLL, lin: Int8DynamicLinear, x: torch.Tensor, num_threads: int = 1) -> torch.Tensor:
    """`hr_q8_linear_forward`: x [rows, in] fp32 -> [rows, out], activations quantised per row (tests, benches)."""
    x = x.float().contiguous()
    y = torch.empty((x.shape[0], lin.out_features), dtype=torch.float32)
    spec = q8_linear(lin)
    fn = lib.hr_q8_linear_forward
    fn.argtypes, fn.restype = [ctypes.POINTER(Q8Linear), _I, _P, _P, _I], ctypes.c_int
    if fn(ctypes.byref(spec), x.shape[0], x.data_ptr(), y.data_ptr(), num_threads) != 0:
        raise MemoryError("hr_q8_linear_forward: out of memory")
    return y


class Int8DecodeKernel:
    """A prepared int8 model and its K/V caches, seen by `hr_q8_decode_step`."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        model: DecoderForCausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size_tokens: int,
        max_seqs: int,
    ) -> None:
        """Raises ValueError when the model is not an int8-prepared fp32 CPU model (`why_not` says why)."""
        why = why_not(model)
        if why:
            raise ValueError(why)
        cfg = model.config
        self.max_seqs = max_seqs  # most sequences a step may have to run here
        self.vocab_size = cfg.vocab_size
        self.block_size = block_size_tokens
        self._keep: list[torch.Tensor] = []  # every tensor the C structs point into
        layers = (Q8Layer * cfg.num_hidden_layers)()
        for i, mod in enumerate(model.model.layers):
            layer = cast(DecoderLayer, mod)
            k_cache, v_cache = kv_caches[i]
            attn, mlp = layer.self_attn, layer.mlp
            layers[i] = Q8Layer(
                self._ptr(layer.input_layernorm.weight), self._ptr(layer.post_attention_layernorm.weight),
                self._linear(attn.qkv_proj), self._linear(attn.o_proj), self._linear(mlp.gate_up_proj),
                self._linear(mlp.down_proj), k_cache.data_ptr(), v_cache.data_ptr(),
            )  # fmt: skip
        self._layers = layers
        cos, sin = cast(torch.Tensor, model.rotary.cos), cast(torch.Tensor, model.rotary.sin_signed)
        self._decoder = Q8Decoder(
            cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim_resolved, cfg.intermediate_size, cfg.vocab_size, kv_caches[0][0].shape[1], block_size_tokens,
            cos.shape[0], cfg.rms_norm_eps, self._ptr(model.model.embed_tokens.weight), self._ptr(cos),
            self._ptr(sin), self._ptr(model.model.norm.weight), layers, self._linear(model.lm_head),
        )  # fmt: skip
        self._step = lib.hr_q8_decode_step
        self._step.argtypes = [ctypes.POINTER(Q8Decoder), _I, _P, _P, _P, _P, _I, _P, _P, _I]
        self._step.restype = ctypes.c_int

    def _ptr(self, t: torch.Tensor) -> int:
        t = t.detach().float().contiguous()
        self._keep.append(t)
        return t.data_ptr()

    def _linear(self, mod: object) -> Q8Linear:
        lin = cast(Int8DynamicLinear, mod)
        self._keep += [lin.qweight, lin.scales] + ([] if lin.bias_fp32 is None else [lin.bias_fp32])
        return q8_linear(lin)

    def serves(self, batch: ModelBatch) -> bool:
        """Whether `decode` can run this step: a pure decode step of at most `max_seqs` sequences, all wanting
        the logits of their one new token."""
        items = batch.items
        return (
            0 < len(items) <= self.max_seqs
            and batch.block_size_tokens == self.block_size
            and all(len(it.token_ids) == 1 and it.needs_logits and it.num_logits == 1 for it in items)
        )

    def decode(self, batch: ModelBatch, num_threads: int) -> torch.Tensor:
        """Run a step `serves` accepts; returns fp32 logits [sequences, vocab], in batch order."""
        items, bs = batch.items, self.block_size
        b = len(items)
        ids = np.fromiter((it.token_ids[0] for it in items), dtype=np.int64, count=b)
        pos = np.fromiter((it.start_position for it in items), dtype=np.int64, count=b)
        max_blocks = max(int(p) // bs + 1 for p in pos)
        tables = np.zeros((b, max_blocks), dtype=np.int64)
        for row, it in enumerate(items):
            used = int(pos[row]) // bs + 1
            tables[row, :used] = it.block_table[:used]
        slots = tables[np.arange(b), pos // bs] * bs + pos % bs
        seq_lens = pos + 1
        logits = torch.empty((b, self.vocab_size), dtype=torch.float32)
        rc = self._step(
            ctypes.byref(self._decoder), b, ids.ctypes.data, pos.ctypes.data, slots.ctypes.data, tables.ctypes.data,
            max_blocks, seq_lens.ctypes.data, logits.data_ptr(), max(1, num_threads),
        )  # fmt: skip
        if rc == -1:
            raise MemoryError("hr_q8_decode_step: out of memory")
        if rc != 0:
            raise ValueError("hr_q8_decode_step: a token id, position, cache slot or block id is out of range")
        return logits


def why_not(model: DecoderForCausalLM) -> str:
    """Why the C decode step cannot run this model ("" = it can)."""
    param = model.model.embed_tokens.weight
    if param.device.type != "cpu" or param.dtype != torch.float32:
        return f"the int8 decode kernel serves CPU float32 models (this one: {param.dtype} on {param.device})"
    layer0 = cast(DecoderLayer, model.model.layers[0])
    linears = [layer0.self_attn.qkv_proj, layer0.self_attn.o_proj, layer0.mlp.gate_up_proj, layer0.mlp.down_proj]
    if not all(isinstance(m, Int8DynamicLinear) for m in [*linears, model.lm_head]):
        return "the int8 decode kernel needs int8 weights (weight_dtype: int8 or int8_on_cpu)"
    return ""


def select_decode_kernel(
    backend: str,
    model: DecoderForCausalLM,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    block_size_tokens: int,
    max_seqs: int,
    attention_kernel_ready: bool,
) -> Int8DecodeKernel | None:
    """The decode kernel to use, or None for the module path. `backend`: `auto` (the kernel for an int8 CPU model
    when the kernels build and the attention kernel serves its shape; silent otherwise: fp32 is not a fallback),
    `torch`, or `kernel` (raise ValueError saying why it cannot be used)."""
    if backend not in BACKENDS:
        raise ValueError(f"decode_backend {backend!r}: use auto, torch or kernel")
    if backend == "torch" or max_seqs < 1:
        return None
    model_why = why_not(model)  # not an int8 CPU model: the modules are the plan, not a fallback worth a log line
    why = model_why or ("" if attention_kernel_ready else "the paged-attention kernel is not in use")
    if not why:
        try:
            return Int8DecodeKernel(load_library(), model, kv_caches, block_size_tokens, max_seqs)
        except KernelUnavailableError as exc:
            why = str(exc)
    if backend == "kernel":
        raise ValueError(f"decode_backend: kernel cannot be used: {why}; set decode_backend: auto or torch")
    if not model_why:
        log.warning("int8 decode kernel unavailable (%s): decode steps use the torch modules", why)
    return None
