"""The per-model request queue entries shared by the batcher and its tests."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from headroom.batching.policy import QueuedItem


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


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What one request gets back from its batch."""

    outputs: Mapping[str, np.ndarray]  # postprocessed outputs for this request
    queue_s: float  # waited in the batch queue (after preprocessing) before its batch started
    compute_s: float  # the batched predict call (shared by the batch)
    postprocess_s: float  # this request's postprocess time
    batch_size: int  # summed item sizes of the batch it rode in
    missing_streams: tuple[str, ...] = field(default=())  # multistream: streams absent from its frame
