"""The server's garbage collector: freeze the start-up heap once ready, and time every collection.

A full (generation-2) collection walks every container object in the process. After start-up a model server
holds a few hundred thousand of them that live forever (imported modules, the web framework, the tokenizer,
the model wrappers), so each full collection paused the event loop *and* the batch thread for 190-270 ms
on this 2-vCPU machine (minilm server under load, measured with a `gc.callbacks` probe, 2026-11-30), about
once a minute: every request in flight or arriving meanwhile waited that long, which is a p99 event at
30-100 req/s. `gc.freeze()` once the models are loaded moves everything alive into the permanent generation
(an O(1) list splice, no pause), so later collections walk only what was allocated since. Objects are still
freed by reference counting as before; only cyclic garbage that already existed at start-up stays
uncollected (a one-time, bounded amount). The same remedy the CPython docs give for pre-fork servers.

`GcMonitor` exports what the collector does: `headroom_gc_pause_seconds{generation}` (a histogram of each
collection's duration, from `gc.callbacks`) and `headroom_gc_frozen_objects`. It is owned by the `Server`,
installed at start and removed at shutdown (the callback list is process-wide).
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram

log = logging.getLogger("headroom.server")

GC_PAUSE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class GcMonitor:
    """Times each garbage collection into a histogram on `registry` while installed."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pause_seconds = Histogram("headroom_gc_pause_seconds", "Duration of each garbage collection "
                                       "(the whole process stops meanwhile), by generation", ["generation"],
                                       registry=registry, buckets=GC_PAUSE_BUCKETS_S)
        # one child per generation, bound once: the callback runs at every young collection (hundreds a second)
        self._pause_by_generation = {g: self.pause_seconds.labels(str(g)) for g in range(3)}
        self.frozen_objects = Gauge("headroom_gc_frozen_objects", "Objects moved to the collector's permanent "
                                    "generation when the models were loaded", registry=registry)
        self._started_s = 0.0
        self._installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_s = time.perf_counter()
        elif self._started_s > 0:
            generation = info.get("generation", 0)
            child = self._pause_by_generation.get(generation) or self.pause_seconds.labels(str(generation))
            child.observe(time.perf_counter() - self._started_s)
            self._started_s = 0.0

    def freeze_heap(self) -> int:
        """Move every object the collector tracks into the permanent generation; returns how many were frozen.

        The count is taken here, once: `gc.get_freeze_count()` walks the whole permanent generation (O(n),
        ~10^5-10^6 objects), so it must not run at every /metrics scrape (measured: evaluated per scrape it
        doubled the server's host CPU per request at 30 req/s with the bench scraping every 0.5 s)."""
        gc.freeze()
        frozen = gc.get_freeze_count()
        self.frozen_objects.set(frozen)
        log.info("garbage collector: froze %d start-up objects (later collections skip them)", frozen)
        return frozen

    def install(self) -> None:
        """Start timing collections (idempotent)."""
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def uninstall(self) -> None:
        """Stop timing collections (idempotent)."""
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False
