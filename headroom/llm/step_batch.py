"""The model-runner seam, without torch: the engine hands a `ModelBatch` to a `Runner` and gets logits back.

The native runner (the default on CPU) and the engine, sampler and scheduler use only these types and numpy, so
`headroom serve` with the native LLM never imports torch; the fp32 reference runner (`headroom.llm.runner`) is the
one place torch is loaded, and only when that mode is chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


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
    """Runs one step; returns fp32 logits as a numpy array [sum of num_logits over items with needs_logits,
    vocab] (C-contiguous, owned by the caller)."""

    num_blocks: int  # cache blocks the runner preallocated
    vocab_size: int  # logits width
    kv_bytes_per_block: int  # bytes one block holds (all layers, K and V)

    def execute(self, batch: ModelBatch) -> np.ndarray: ...

    def swap_out(self, block_ids: Sequence[int]) -> object:
        """Copy these blocks' K/V to host memory; returns the host copy."""
        ...

    def swap_in(self, host_copy: object, block_ids: Sequence[int]) -> None:
        """Copy a host copy back into these (new) blocks."""
        ...
