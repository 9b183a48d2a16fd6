"""The whole model step on GGUF block-quantised weights in one C call (`native_step.c`, `native_gemm.c`).

`NativeStepKernel.step(batch)` runs any flat ModelBatch (prefill chunks, decodes, speculative verification rows,
many sequences at once) and returns the logits rows (numpy) in TorchRunner's order. The weights stay in their GGUF
formats (`NativeDecoderWeights`: QTensors that may be views of a memory map); the K/V cache has TorchRunner's layout
([Hkv, num_slots, D] fp32 per layer, numpy arrays from `headroom.llm.kv_pool`), so swap and preemption work
unchanged. Nothing here imports torch. Batch-invariant: a sequence's logits
are bit-identical alone or beside others, prefilled whole or in chunks, on any thread count (see native_step.c).

q/k rows must be in Hugging Face's rotate-half order: a GGUF (llama) stores them permuted for interleaved RoPE;
reorder the ROWS of the raw bytes (`permute_rows`) - each row is whole blocks, so no requantisation.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from headroom.llm.config import DecoderConfig
from headroom.llm.kernels.native_gemm import ISA_NAMES, CQTensor, c_qtensor, pack_tensor, resolve_isa
from headroom.llm.quant_blocks import QK, QTensor
from headroom.llm.step_cancel import StepCancelled

if TYPE_CHECKING:
    from headroom.llm.step_batch import ModelBatch

_P, _I = ctypes.c_void_p, ctypes.c_int64


@dataclass(frozen=True, slots=True)
class NativeLayerWeights:
    """One decoder layer: RMSNorm weights (fp32 [hidden]), the seven linears (out x in), optional q/k/v biases."""

    input_norm: np.ndarray
    post_norm: np.ndarray
    q: QTensor
    k: QTensor
    v: QTensor
    o: QTensor
    gate: QTensor
    up: QTensor
    down: QTensor
    q_bias: np.ndarray | None = None
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class NativeDecoderWeights:
    """A whole decoder for the native step (lm_head is the embedding QTensor when tied)."""

    config: DecoderConfig
    embed: QTensor  # [vocab, hidden]
    layers: tuple[NativeLayerWeights, ...]
    final_norm: np.ndarray  # fp32 [hidden]
    lm_head: QTensor  # [vocab, hidden]

    def validate(self) -> None:
        """Raise ValueError when a shape does not fit the config."""
        c = self.config
        hid, inter = c.hidden_size, c.intermediate_size
        hd, kvd = c.num_attention_heads * c.head_dim_resolved, c.num_key_value_heads * c.head_dim_resolved
        for width, what in ((hid, "hidden_size"), (hd, "heads * head_dim"), (inter, "intermediate_size")):
            if width % QK:
                raise ValueError(f"native kernels need {what} ({width}) to be a multiple of {QK}")
        if self.final_norm.shape != (hid,):
            raise ValueError(f"final_norm has shape {self.final_norm.shape}, expected ({hid},)")
        if len(self.layers) != c.num_hidden_layers:
            raise ValueError(f"{len(self.layers)} layers, config says {c.num_hidden_layers}")
        want = {"embed": (c.vocab_size, hid), "lm_head": (c.vocab_size, hid)}
        got = {"embed": self.embed, "lm_head": self.lm_head}
        for i, ly in enumerate(self.layers):
            shapes = {"q": (hd, hid), "k": (kvd, hid), "v": (kvd, hid), "o": (hid, hd), "gate": (inter, hid),
                      "up": (inter, hid), "down": (hid, inter)}  # fmt: skip
            for name, shape in shapes.items():
                want[f"layers.{i}.{name}"] = shape
                got[f"layers.{i}.{name}"] = getattr(ly, name)
            vectors = (
                ("input_norm", ly.input_norm, hid), ("post_norm", ly.post_norm, hid), ("q_bias", ly.q_bias, hd),
                ("k_bias", ly.k_bias, kvd), ("v_bias", ly.v_bias, kvd),
            )  # fmt: skip
            for name, vec, n in vectors:
                if vec is not None and vec.shape != (n,):
                    raise ValueError(f"layers.{i}.{name} has shape {vec.shape}, expected ({n},)")
        for name, shape in want.items():
            t = got[name]
            if (t.rows, t.cols) != shape:
                raise ValueError(f"{name} is {t.rows}x{t.cols}, expected {shape[0]}x{shape[1]}")


def permute_rows(t: QTensor, order: np.ndarray) -> QTensor:
    """A copy of `t` with its rows in `order` (new row i = old row order[i])."""
    data = t.data.reshape(t.rows, t.row_bytes)[np.asarray(order)]
    return QTensor(t.fmt, t.rows, t.cols, np.ascontiguousarray(data).reshape(-1))


def rope_tables(head_dim: int, max_positions: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """fp32 RoPE tables [max_positions, head_dim] in the rotate-half layout: cos, and sin *signed* (first half
    negated), as the torch model's `Rotary` lays them out, computed the same way in fp32 (theta ** (i / D) rounded
    to fp32, its fp32 reciprocal, fp32 angles) except that cos/sin are taken in fp64 and rounded once: numpy's and
    torch's fp32 sin/cos differ in the last bit of some entries, and these are the correctly rounded values."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    inv_freq = np.float32(1.0) / (np.float64(theta) ** exponents.astype(np.float64)).astype(np.float32)
    angles = np.outer(np.arange(max_positions, dtype=np.float32), inv_freq).astype(np.float64)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    return np.concatenate((cos, cos), axis=1), np.concatenate((-sin, sin), axis=1)


class NativeLayer(ctypes.Structure):
    """`hr_native_layer`."""

    _fields_ = [
        ("input_norm", _P), ("post_norm", _P), ("q_bias", _P), ("k_bias", _P), ("v_bias", _P),
        ("q", CQTensor), ("k", CQTensor), ("v", CQTensor), ("o", CQTensor), ("gate", CQTensor), ("up", CQTensor),
        ("down", CQTensor), ("k_cache", _P), ("v_cache", _P),
    ]  # fmt: skip


class NativeModel(ctypes.Structure):
    """`hr_native_model`."""

    _fields_ = [
        ("num_layers", _I), ("hidden", _I), ("num_heads", _I), ("num_kv_heads", _I), ("head_dim", _I),
        ("intermediate", _I), ("vocab", _I), ("num_slots", _I), ("block_size", _I), ("max_positions", _I),
        ("eps", ctypes.c_float), ("embed", CQTensor), ("cos_table", _P), ("sin_table", _P), ("final_norm", _P),
        ("layers", ctypes.POINTER(NativeLayer)), ("lm_head", CQTensor),
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A ModelBatch flattened for `hr_native_step` (int64 arrays)."""

    ids: np.ndarray  # [T]
    positions: np.ndarray  # [T]
    seq_of: np.ndarray  # [T] index of the token's item
    tables: np.ndarray  # [items, max_blocks]
    logit_rows: np.ndarray  # [R] token indices whose logits come back


def plan_step(batch: ModelBatch) -> StepPlan:
    """Flatten a batch; logits rows follow TorchRunner (per item wanting logits, its last num_logits tokens)."""
    bs = batch.block_size_tokens
    items = batch.items
    lengths = [len(it.token_ids) for it in items]
    max_blocks = max(1, *(-(-(it.start_position + n) // bs) for it, n in zip(items, lengths, strict=True)))
    tables = np.zeros((max(len(items), 1), max_blocks), dtype=np.int64)
    rows: list[int] = []
    t = 0
    for i, (it, n) in enumerate(zip(items, lengths, strict=True)):
        used = min(len(it.block_table), max_blocks)
        tables[i, :used] = it.block_table[:used]
        tables[i, used:] = -1  # a position past the table is refused by the kernel
        if it.needs_logits:
            rows.extend(range(t + n - it.num_logits, t + n))
        t += n
    spans = [np.arange(it.start_position, it.start_position + n) for it, n in zip(items, lengths, strict=True)]
    return StepPlan(
        ids=np.fromiter((tok for it in items for tok in it.token_ids), dtype=np.int64, count=t),
        positions=np.concatenate(spans or [np.zeros(0, dtype=np.int64)]).astype(np.int64),
        seq_of=np.repeat(np.arange(len(items), dtype=np.int64), lengths),
        tables=tables,
        logit_rows=np.asarray(rows, dtype=np.int64),
    )


class NativeStepKernel:
    """Prepared native weights + the K/V caches, seen by `hr_native_step`."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        weights: NativeDecoderWeights,
        kv_caches: Sequence[tuple[np.ndarray, np.ndarray]],
        block_size_tokens: int,
        isa: str | None = None,
    ) -> None:
        """`isa`: a path to force (else `$HEADROOM_KERNEL_ISA`, else the best this CPU runs)."""
        weights.validate()
        cfg = weights.config
        self.isa = resolve_isa(lib, isa)
        self.vocab_size = cfg.vocab_size
        self.block_size = block_size_tokens
        caches = [(np.asarray(k), np.asarray(v)) for k, v in kv_caches]  # CPU torch tensors: views, no copy
        num_slots = int(caches[0][0].shape[1])
        d = cfg.head_dim_resolved
        for k_cache, v_cache in caches:
            for c in (k_cache, v_cache):
                if c.dtype != np.float32 or not c.flags.c_contiguous or not c.flags.writeable or c.shape != (
                    cfg.num_key_value_heads, num_slots, d
                ):  # fmt: skip
                    raise ValueError(f"native step needs contiguous fp32 CPU K/V caches [Hkv, slots, D], got {c.shape}")
        if len(kv_caches) != cfg.num_hidden_layers or num_slots % block_size_tokens:
            raise ValueError("native step: one (K, V) pair per layer, slots a multiple of the block size")
        self.kv_caches = caches  # the caches this kernel writes (TorchRunner's layout)
        self._keep: list[object] = [weights, list(kv_caches)]  # everything else the C structs point into
        cos, sin = (self._f32(t) for t in rope_tables(d, cfg.max_position_embeddings, cfg.rope_theta))
        layers = (NativeLayer * cfg.num_hidden_layers)()
        for i, ly in enumerate(weights.layers):
            k_cache, v_cache = caches[i]
            linears = [self._packed(lib, t) for t in (ly.q, ly.k, ly.v, ly.o, ly.gate, ly.up, ly.down)]
            layers[i] = NativeLayer(
                self._f32(ly.input_norm), self._f32(ly.post_norm), self._f32(ly.q_bias), self._f32(ly.k_bias),
                self._f32(ly.v_bias), *linears, k_cache.ctypes.data, v_cache.ctypes.data,
            )  # fmt: skip
        self._layers = layers
        self._model = NativeModel(
            cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, d,
            cfg.intermediate_size, cfg.vocab_size, num_slots, block_size_tokens, cfg.max_position_embeddings,
            cfg.rms_norm_eps, c_qtensor(weights.embed), cos, sin, self._f32(weights.final_norm), layers,
            self._packed(lib, weights.lm_head),
        )  # fmt: skip
        self._fn = lib.hr_native_step
        self._fn.argtypes = [ctypes.POINTER(NativeModel), _I, _P, _P, _P, _I, _P, _I, _P, _I, _P, _I, _I, _P]
        self._fn.restype = ctypes.c_int

    def _packed(self, lib: ctypes.CDLL, t: QTensor) -> CQTensor:
        """The C view of a linear with 8- or 16-bit inputs, with its packed layout where this path has one (one
        pass over the bytes at load, ~the GGUF's size: native_pack.c)."""
        packed = pack_tensor(lib, t, self.isa)
        self._keep.append(packed)
        return c_qtensor(t, packed)

    def _f32(self, a: np.ndarray | None) -> int:
        if a is None:
            return 0
        arr = np.ascontiguousarray(a, dtype=np.float32)
        self._keep.append(arr)
        return int(arr.ctypes.data)

    def step(self, batch: ModelBatch, num_threads: int = 1, cancel_flag_address: int = 0) -> np.ndarray:
        """Run the batch; returns fp32 logits [rows, vocab] (TorchRunner.execute's rows). Raises ValueError for an
        out-of-range token id, position or block (the cache is then untouched), StepCancelled when the C int at
        `cancel_flag_address` (0: none) was non-zero at the end of a layer (the step's K/V may be written)."""
        if batch.block_size_tokens != self.block_size:
            raise ValueError(f"batch block size {batch.block_size_tokens} != the cache's {self.block_size}")
        if not batch.items or not any(it.token_ids for it in batch.items):
            return np.empty((0, self.vocab_size), dtype=np.float32)
        p = plan_step(batch)
        logits = np.empty((len(p.logit_rows), self.vocab_size), dtype=np.float32)
        rc = self._fn(
            ctypes.byref(self._model), len(p.ids), p.ids.ctypes.data, p.positions.ctypes.data, p.seq_of.ctypes.data,
            p.tables.shape[0], p.tables.ctypes.data, p.tables.shape[1], p.logit_rows.ctypes.data, len(p.logit_rows),
            logits.ctypes.data, ISA_NAMES.index(self.isa), max(1, num_threads), cancel_flag_address or None,
        )  # fmt: skip
        if rc == -3:
            raise StepCancelled("the step was cancelled: every request in it was aborted")
        if rc == -1:
            raise MemoryError("hr_native_step: out of memory")
        if rc != 0:
            raise ValueError("native step refused the batch: a token id, position or cache block is out of range")
        return logits
