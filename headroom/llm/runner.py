"""The model-runner seam: the engine hands a `ModelBatch` to a `Runner` and gets logits back.

`TorchRunner` owns the device-specific parts (device, dtype, the preallocated K/V tensors, thread count);
the rest of the engine is device-agnostic. A fake runner implementing the same protocol tests the
scheduler without a model.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import torch

from headroom.llm.config import DecoderConfig, EngineConfig
from headroom.llm.kernels.paged_attention import PagedAttentionKernel, select_attention_kernel
from headroom.llm.model import AttentionGroup, AttentionMetadata, DecoderForCausalLM
from headroom.llm.threads import ThreadTunerConfig, ThreadTunerState, choose_threads, observe


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One sequence's part of a forward pass."""

    request_id: str  # the sequence
    token_ids: tuple[int, ...]  # new tokens to run
    start_position: int  # position of the first new token (tokens before it are in the cache)
    block_table: tuple[int, ...]  # the sequence's cache blocks, covering start_position + len(token_ids)
    needs_logits: bool  # return logits after the last new token
    num_logits: int = 1  # with needs_logits: rows for the last this-many tokens (speculative verification)


@dataclass(frozen=True, slots=True)
class ModelBatch:
    """A flat step: many sequences' new tokens."""

    items: tuple[BatchItem, ...]  # in batch order; logits come back in this order (needs_logits only)
    block_size_tokens: int  # tokens per cache block
    cancel_flag_address: int = 0  # a C int a runner may poll to stop early (StepCancelled); 0 = none


class Runner(Protocol):
    """Runs one step; returns fp32 logits [sum of num_logits over items with needs_logits, vocab]."""

    num_blocks: int  # cache blocks the runner preallocated
    vocab_size: int  # logits width
    kv_bytes_per_block: int  # bytes one block holds (all layers, K and V)

    def execute(self, batch: ModelBatch) -> torch.Tensor: ...

    def swap_out(self, block_ids: Sequence[int]) -> object:
        """Copy these blocks' K/V to host memory; returns the host copy."""
        ...

    def swap_in(self, host_copy: object, block_ids: Sequence[int]) -> None:
        """Copy a host copy back into these (new) blocks."""
        ...


def resolve_device(cfg: EngineConfig) -> tuple[torch.device, torch.dtype]:
    """Pick device and dtype: CPU fp32 by default, CUDA bf16 when asked for (or `auto` and present)."""
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("device: cuda requested but torch sees no GPU; use device: cpu or auto")
    device = torch.device("cuda" if use_cuda else "cpu")
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    dtype = names.get(cfg.dtype, torch.bfloat16 if use_cuda else torch.float32)
    return device, dtype


def cpu_threads(requested: int, cpu_count: int) -> int:
    """Intra-op threads to start with: `requested` if > 0; else 1 on a machine with <= 2 CPUs (an OpenMP team as
    wide as the machine stalls badly as soon as anything else runs: a decode step measured 40 ms with 1 thread
    vs 0.2-1.8 s with 2 on a busy 2-core box; the runner then picks per step, see `headroom.llm.threads`),
    else 0 = leave torch's default."""
    if requested > 0:
        return requested
    return 1 if cpu_count <= 2 else 0


def prepare_model(model: DecoderForCausalLM) -> None:
    """Make a loaded model fast for inference, in place: fuse q/k/v and gate/up (idempotent: the runner calls
    it; `load_engine` calls it first to time it as its own cold-start stage)."""
    model.fuse_projections()


def kv_bytes_per_block(cfg: DecoderConfig, block_size_tokens: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers (K and V)."""
    elem = torch.tensor([], dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * block_size_tokens * cfg.num_key_value_heads * cfg.head_dim_resolved * elem


def zeroed_tensors(
    shape: tuple[int, ...], count: int, dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """`count` zero tensors of `shape`. On the CPU they are views of ONE private anonymous mapping: the kernel
    hands out zero pages on first touch, so reserving a 512 MiB K/V pool costs microseconds instead of the
    ~0.3 s of writing zeros (a tenth of the LLM's cold start); blocks are paid for as they are first written.
    Zeros, not torch.empty: attention over a partly filled block must never read NaN garbage."""
    if device.type != "cpu":
        return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(count)]
    numel = int(np.prod(shape))
    buffer = mmap.mmap(-1, numel * dtype.itemsize * count, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    flat = torch.frombuffer(buffer, dtype=dtype)  # keeps `buffer` alive as long as any view exists
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


class StepThreads:
    """The intra-op thread count each step runs with: `num_threads` when set; else on a <= 2-CPU machine chosen
    per step by measuring (`headroom.llm.threads`), else torch's default. Shared by the torch and native runners
    (a native step's result never depends on its thread count, so tuning it is safe for batch invariance)."""

    def __init__(self, engine: EngineConfig, on_cpu: bool) -> None:
        cpu_count = os.cpu_count() or 1
        self.now = 0  # what was last set (0 = nothing yet)
        self._tuner: ThreadTunerConfig | None = None
        self._state = ThreadTunerState()
        if on_cpu:
            threads = cpu_threads(engine.num_threads, cpu_count)
            if threads:
                torch.set_num_threads(threads)
                self.now = threads
            if engine.num_threads <= 0 and 1 < cpu_count <= 2:
                self._tuner = ThreadTunerConfig((1, cpu_count), engine.wide_step_min_tokens)
                self._tuner.validate()

    def means(self) -> dict[tuple[int, int], float]:
        """The tuner's running means, (step-size bucket, threads) -> seconds per token (empty: no tuner)."""
        return dict(self._state.mean_s_per_token)

    def run(self, batch: ModelBatch, forward: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """`forward(threads)` with the chosen thread count (set in the calling thread: OpenMP counts are per
        thread), timed for the tuner."""
        tuner = self._tuner
        if tuner is None:
            return forward(self.now or torch.get_num_threads())
        num_tokens = sum(len(it.token_ids) for it in batch.items)
        threads = choose_threads(self._state, tuner, num_tokens)
        if threads != self.now:
            torch.set_num_threads(threads)
            self.now = threads
        start = time.perf_counter()
        out = forward(threads)
        self._state = observe(self._state, tuner, num_tokens, threads, time.perf_counter() - start)
        return out


def allocate_kv_pool(
    cfg: DecoderConfig, engine: EngineConfig, dtype: torch.dtype, device: torch.device, num_blocks: int | None
) -> tuple[int, int, list[tuple[torch.Tensor, torch.Tensor]]]:
    """(blocks, bytes per block, per-layer (K, V) caches `[Hkv, slots, D]`, head-major, zeroed) for a pool of
    `num_blocks` blocks, or by default as many as `engine.kv_cache_memory_mb` holds."""
    per_block = kv_bytes_per_block(cfg, engine.block_size_tokens, dtype)
    blocks = num_blocks if num_blocks is not None else int(engine.kv_cache_memory_mb * 2**20 // per_block)
    if blocks < 1:
        raise ValueError(
            f"kv_cache_memory_mb={engine.kv_cache_memory_mb} holds no block of {per_block} bytes; raise it"
        )
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
        self.threads = StepThreads(engine, self.device.type == "cpu")
        prepare_model(model)
        self.block_size = engine.block_size_tokens
        self.num_blocks, self.kv_bytes_per_block, self.kv_caches = allocate_kv_pool(
            cfg, engine, self.dtype, self.device, num_blocks
        )
        self.vocab_size = cfg.vocab_size
        heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim_resolved, self.block_size)
        # the C paged-attention kernel (CPU fp32) or None = torch ops (see headroom.llm.kernels.paged_attention)
        self.attention_kernel = select_attention_kernel(engine.attention_backend, self.device, self.dtype, heads)

    @property
    def threads_now(self) -> int:
        """The intra-op thread count the last step ran with (0 = never set by this runner)."""
        return self.threads.now

    def tuner_means(self) -> dict[tuple[int, int], float]:
        """The thread tuner's running means, (step-size bucket, threads) -> seconds per token (empty: no tuner)."""
        return self.threads.means()

    def execute(self, batch: ModelBatch) -> torch.Tensor:
        return self.threads.run(batch, lambda _threads: self._forward(batch))

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
