"""The model-runner seam: the engine hands a `ModelBatch` to a `Runner` and gets logits back.

`TorchRunner` owns the device-specific parts (device, dtype, the preallocated K/V tensors, thread count);
the rest of the engine is device-agnostic. A fake runner implementing the same protocol tests the
scheduler without a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from headroom.llm.config import DecoderConfig, EngineConfig
from headroom.llm.device import resolve_placement
from headroom.llm.kernels.paged_attention import PagedAttentionKernel, select_attention_kernel
from headroom.llm.kv_pool import kv_block_bytes, pool_blocks, zero_mapping
from headroom.llm.model import AttentionGroup, AttentionMetadata, DecoderForCausalLM
from headroom.llm.step_batch import BatchItem, ModelBatch, Runner
from headroom.llm.step_threads import StepThreads

__all__ = [  # BatchItem, ModelBatch, Runner and StepThreads live in torch-free modules; re-exported for callers
    "BatchItem", "ModelBatch", "Runner", "StepThreads", "TorchRunner", "allocate_kv_pool", "build_metadata",
    "kv_bytes_per_block", "prepare_model", "resolve_device", "swap_in_blocks", "swap_out_blocks",
    "zeroed_tensors",
]


def resolve_device(cfg: EngineConfig) -> tuple[torch.device, torch.dtype]:
    """Pick device and dtype (`device.resolve_placement`) as torch objects; raises when `device: cuda` is asked
    for and torch sees no GPU."""
    placement = resolve_placement(cfg)
    if placement.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda requested but torch sees no GPU; use device: cpu or auto")
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    return torch.device(placement.device), names[placement.dtype]


def prepare_model(model: DecoderForCausalLM) -> None:
    """Make a loaded model fast for inference, in place: fuse q/k/v and gate/up (idempotent: the runner calls
    it; `load_engine` calls it first to time it as its own cold-start stage)."""
    model.fuse_projections()


def kv_bytes_per_block(cfg: DecoderConfig, block_size_tokens: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers (K and V)."""
    return kv_block_bytes(cfg, block_size_tokens, dtype.itemsize)


def zeroed_tensors(
    shape: tuple[int, ...], count: int, dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """`count` zero tensors of `shape`. On the CPU they are views of ONE private anonymous mapping
    (`kv_pool.zero_mapping`: zero pages on first touch, so reserving the pool costs microseconds)."""
    if device.type != "cpu":
        return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(count)]
    numel = int(np.prod(shape))
    flat = torch.frombuffer(zero_mapping(numel * dtype.itemsize * count), dtype=dtype)  # the views keep the map
    return [flat[i * numel : (i + 1) * numel].view(shape) for i in range(count)]


def build_metadata(
    batch: ModelBatch, device: torch.device, kernel: PagedAttentionKernel | None = None
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
    """Flat input ids, positions, attention metadata and logits indices for a batch (attended with `kernel`
    when given)."""
    bs = batch.block_size_tokens
    items = batch.items
    lengths = [len(it.token_ids) for it in items]
    starts = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    total = int(starts[-1])
    input_ids: list[int] = []
    positions = np.empty(total, dtype=np.int64)
    slot_mapping = np.empty_like(positions)
    tables: list[np.ndarray] = []
    logits_indices: list[int] = []
    for i, it in enumerate(items):
        t, n = int(starts[i]), lengths[i]
        table = np.asarray(it.block_table[: -(-(it.start_position + n) // bs)], dtype=np.int64)
        tables.append(table)
        new_pos = np.arange(it.start_position, it.start_position + n, dtype=np.int64)
        input_ids.extend(it.token_ids)
        positions[t : t + n] = new_pos
        slot_mapping[t : t + n] = table[new_pos // bs] * bs + new_pos % bs
        if it.needs_logits:
            logits_indices.extend(range(t + n - it.num_logits, t + n))
    # decodes (one new token) and longer chunks are padded and attended as separate groups
    token_to_padded = np.empty_like(positions)
    groups: list[AttentionGroup] = []
    offset = 0
    for members in ([i for i, n in enumerate(lengths) if n == 1], [i for i, n in enumerate(lengths) if n > 1]):
        if members:
            groups.append(_group(members, lengths, starts, positions, tables, bs, token_to_padded, offset, device))
            offset += len(members) * max(lengths[i] for i in members)
    meta = AttentionMetadata(
        slot_mapping=torch.from_numpy(slot_mapping).to(device),
        groups=tuple(groups),
        token_to_padded=torch.from_numpy(token_to_padded).to(device),
        padded_is_flat=offset == total and bool(np.array_equal(token_to_padded, np.arange(total))),
        block_size_tokens=bs,
        kernel=kernel,
    )
    ids = torch.tensor(input_ids, dtype=torch.long, device=device)
    pos = torch.from_numpy(positions).to(device)
    return ids, pos, meta, torch.tensor(logits_indices, dtype=torch.long, device=device)


def _group(
    members: list[int],
    lengths: list[int],
    starts: np.ndarray,
    positions: np.ndarray,
    tables: list[np.ndarray],
    bs: int,
    token_to_padded: np.ndarray,
    offset: int,
    device: torch.device,
) -> AttentionGroup:
    """One attention group over the items `members`; fills their rows of `token_to_padded` (from `offset`)."""
    b, q = len(members), max(lengths[i] for i in members)
    nb = max(len(tables[i]) for i in members)
    query_index = np.zeros((b, q), dtype=np.int64)
    key_blocks = np.zeros((b, nb), dtype=np.int64)
    mask = np.zeros((b, 1, q, nb * bs), dtype=bool)
    seq_lens = np.zeros(b, dtype=np.int64)
    key_pos = np.arange(nb * bs, dtype=np.int64)
    for row, i in enumerate(members):
        t, n = int(starts[i]), lengths[i]
        key_blocks[row, : len(tables[i])] = tables[i]
        query_index[row, :n] = np.arange(t, t + n)
        seq_lens[row] = positions[t + n - 1] + 1
        token_to_padded[t : t + n] = offset + row * q + np.arange(n)
        mask[row, 0, :n, :] = key_pos[None, :] <= positions[t : t + n, None]
        mask[row, 0, n:, 0] = True  # padded query rows attend one key (no NaN); their output is dropped
    unpadded_run = all(lengths[i] == q for i in members) and members == list(range(members[0], members[-1] + 1))
    return AttentionGroup(
        query_index=torch.from_numpy(query_index).to(device),
        query_slice=(int(starts[members[0]]), int(starts[members[-1] + 1])) if unpadded_run else None,
        flat_blocks=torch.from_numpy(key_blocks.reshape(-1)).to(device),
        mask_bias=torch.from_numpy(np.where(mask, np.float32(0.0), np.float32(-np.inf))).to(device),
        seq_lens=torch.from_numpy(seq_lens).to(device),
    )


def allocate_kv_pool(
    cfg: DecoderConfig, engine: EngineConfig, dtype: torch.dtype, device: torch.device, num_blocks: int | None
) -> tuple[int, int, list[tuple[torch.Tensor, torch.Tensor]]]:
    """(blocks, bytes per block, per-layer (K, V) caches `[Hkv, slots, D]`, head-major, zeroed) for a pool of
    `num_blocks` blocks, or by default as many as `engine.kv_cache_memory_mb` holds."""
    blocks, per_block = pool_blocks(cfg, engine, dtype.itemsize, num_blocks)
    shape = (cfg.num_key_value_heads, blocks * engine.block_size_tokens, cfg.head_dim_resolved)
    pool = zeroed_tensors(shape, 2 * cfg.num_hidden_layers, dtype, device)
    return blocks, per_block, [(pool[2 * i], pool[2 * i + 1]) for i in range(cfg.num_hidden_layers)]


class TorchRunner:
    """Runs a DecoderForCausalLM over a K/V pool preallocated from `kv_cache_memory_mb`."""

    def __init__(self, model: DecoderForCausalLM, engine: EngineConfig, num_blocks: int | None = None) -> None:
        """`num_blocks`: the pool's size in blocks, when the caller knows it (a draft model sized to the target's
        pool); by default as many as `engine.kv_cache_memory_mb` holds."""
        self.model = model
        cfg = model.config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.threads = StepThreads(engine, self.device.type == "cpu", torch.set_num_threads, torch.get_num_threads)
        prepare_model(model)
        self.block_size = engine.block_size_tokens
        self.num_blocks, self.kv_bytes_per_block, self.kv_caches = allocate_kv_pool(
            cfg, engine, self.dtype, self.device, num_blocks
        )
        self.vocab_size = cfg.vocab_size
        heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim_resolved, self.block_size)
        # the C paged-attention kernel (CPU fp32) or None = torch ops (see headroom.llm.kernels.paged_attention)
        self.attention_kernel = select_attention_kernel(self.device, self.dtype, heads)

    @property
    def threads_now(self) -> int:
        """The intra-op thread count the last step ran with (0 = never set by this runner)."""
        return self.threads.now

    def tuner_means(self) -> dict[tuple[int, int], float]:
        """The thread tuner's estimates (medians of recent steps): (step-size bucket, threads) -> seconds per token
        (empty: no tuner)."""
        return self.threads.means()

    def execute(self, batch: ModelBatch) -> np.ndarray:
        return self.threads.run(batch, lambda _threads: self._forward(batch).numpy())

    def _forward(self, batch: ModelBatch) -> torch.Tensor:
        ids, pos, meta, logits_idx = build_metadata(batch, self.device, self.attention_kernel)
        with torch.inference_mode():
            logits: torch.Tensor = self.model(ids, pos, self.kv_caches, meta, logits_idx)
        return logits.float().cpu()

    def swap_out(self, block_ids: Sequence[int]) -> object:
        return swap_out_blocks(self.kv_caches, self.block_size, block_ids)

    def swap_in(self, host_copy: object, block_ids: Sequence[int]) -> None:
        swap_in_blocks(self.kv_caches, self.block_size, host_copy, block_ids)


def _paged(cache: torch.Tensor, block_size: int) -> torch.Tensor:
    """[Hkv, slots, D] viewed as [Hkv, blocks, block size, D]."""
    return cache.view(cache.shape[0], -1, block_size, cache.shape[2])


def swap_out_blocks(
    kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]], block_size: int, block_ids: Sequence[int]
) -> object:
    """Host copies of these blocks' K/V in every layer (what `Runner.swap_out` returns)."""
    idx = torch.tensor(list(block_ids), dtype=torch.long, device=kv_caches[0][0].device)
    return [
        (_paged(k, block_size)[:, idx].to("cpu", copy=True), _paged(v, block_size)[:, idx].to("cpu", copy=True))
        for k, v in kv_caches
    ]


def swap_in_blocks(
    kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]], block_size: int, host_copy: object, block_ids: Sequence[int]
) -> None:
    """Copy `swap_out_blocks`' host copies back into these (new) blocks."""
    saved = cast(list[tuple[torch.Tensor, torch.Tensor]], host_copy)
    device = kv_caches[0][0].device
    idx = torch.tensor(list(block_ids), dtype=torch.long, device=device)
    for (k, v), (hk, hv) in zip(kv_caches, saved, strict=True):
        _paged(k, block_size)[:, idx] = hk.to(device)
        _paged(v, block_size)[:, idx] = hv.to(device)
