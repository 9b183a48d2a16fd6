"""The per-model request queue entries shared by the batcher and its tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from headroom.batching.policy import QueuedItem
from headroom.core.types import StageTimings


@dataclass(slots=True)
class Entry:
    """One admitted request waiting for (or riding in) a batch. Mutable: owned by the batcher alone."""

    item: QueuedItem  # what the pure policy sees
    inputs: Mapping[str, np.ndarray]  # preprocessed model inputs (leading dim = item.size)
    parameters: Mapping[str, object]  # request parameters for postprocess
    future: asyncio.Future[BatchResult]  # resolved exactly once: result or exception
    admitted_s: float  # admission time (before preprocessing)
    preprocess_s: float  # seconds spent preprocessing this request
    cancelled: bool = False  # client went away; skip if still queued
    on_start: Callable[[], None] | None = None  # called once when its batch starts (`headroom.core.start_signal`)


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What one request gets back from its batch."""

    outputs: Mapping[str, np.ndarray]  # postprocessed outputs for this request
    queue_s: float  # waited in the batch queue (after preprocessing) before its batch started
    compute_s: float  # the batched predict call (shared by the batch)
    postprocess_s: float  # this request's postprocess time
    batch_size: int  # summed item sizes of the batch it rode in
    missing_streams: tuple[str, ...] = field(default=())  # multistream: streams absent from its frame
    preprocess_s: float = 0.0  # this request's preprocessing (admission to enqueue)
    batch_wait_s: float = 0.0  # batch start to its postprocess, less compute (executor hop, collate, split,
    #   the postprocessing of the requests before it)

    def timings(self, total_ms: float) -> StageTimings:
        """The request's disjoint stages, as measured by the batcher, and `other`: the rest of `total_ms`
        (the data plane's entry to response ready) that no stage covers."""
        stages_ms = [s * 1e3 for s in (self.queue_s, self.batch_wait_s, self.preprocess_s, self.compute_s,
                                       self.postprocess_s)]
        queue_ms, batch_wait_ms, preprocess_ms, compute_ms, postprocess_ms = stages_ms
        return StageTimings(queue_ms=queue_ms, batch_wait_ms=batch_wait_ms, preprocess_ms=preprocess_ms,
                            compute_ms=compute_ms, postprocess_ms=postprocess_ms,
                            total_ms=max(total_ms, sum(stages_ms)), other_ms=max(0.0, total_ms - sum(stages_ms)))
