"""Static (precomputed) inference: run a model offline over a dataset, serve the stored answers online.

MLPerf's Offline scenario: every query is known up front, so the model runs in its largest batches
(`max_batch_size`) for throughput. Each item's outputs are stored in SQLite under a hash of the
single-item request it answers (model, version, input names, dtypes, shapes and bytes), so an online request
for the same input finds it:

    store = PredictionStore(Path("predictions.sqlite"))
    run_offline(loaded.model, "digits", "1", {"input": images[:, None]}, store)
    cache = PredictionLookup(store, "digits", "1", registry=registry)
    outputs = cache.lookup(request_inputs)       # None -> fall back to online inference

Outputs are stored as `.npz` bytes (numeric arrays only, no pickle).
"""

from __future__ import annotations

import hashlib
import io
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Counter

from headroom.models.base import Arrays, Model

_SCHEMA = """
CREATE TABLE IF NOT EXISTS predictions (
    key TEXT PRIMARY KEY,      -- input_key(model, version, inputs)
    model TEXT NOT NULL,       -- model name
    version TEXT NOT NULL,     -- model version
    outputs BLOB NOT NULL      -- npz of the postprocessed outputs of the single-item request
)
"""


def input_key(model: str, version: str, inputs: Arrays) -> str:
    """SHA-256 of one request's wire inputs (names, dtypes, shapes, bytes) for one model version."""
    digest = hashlib.sha256(f"{model}\0{version}\0".encode())
    for name in sorted(inputs):
        value = np.asarray(inputs[name])
        digest.update(f"{name}\0{value.dtype.str}\0{value.shape}\0".encode())
        if value.dtype == object:  # BYTES tensors: length-prefixed elements
            for item in value.reshape(-1):
                raw = item if isinstance(item, bytes) else str(item).encode()
                digest.update(len(raw).to_bytes(8, "little") + raw)
        else:
            digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


def _encode(outputs: Arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **{k: np.asarray(v) for k, v in outputs.items()})
    return buffer.getvalue()


def _decode(blob: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(blob), allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


class PredictionStore:
    """SQLite table of precomputed outputs keyed by `input_key`; safe to share between threads."""

    def __init__(self, path: Path | str) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock, self._db:
            self._db.execute(_SCHEMA)

    def put_many(self, rows: Iterable[tuple[str, str, str, Arrays]]) -> int:
        """Insert or replace (key, model, version, outputs) rows; returns how many were written."""
        encoded = [(key, model, version, _encode(outputs)) for key, model, version, outputs in rows]
        with self._lock, self._db:
            self._db.executemany("INSERT OR REPLACE INTO predictions VALUES (?, ?, ?, ?)", encoded)
        return len(encoded)

    def get_many(self, keys: Sequence[str]) -> list[dict[str, np.ndarray] | None]:
        """Stored outputs per key, None where absent (same order as `keys`)."""
        if not keys:
            return []
        found: dict[str, bytes] = {}
        with self._lock:
            for start in range(0, len(keys), 500):  # SQLite's bound-parameter limit
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                query = f"SELECT key, outputs FROM predictions WHERE key IN ({marks})"
                found.update(self._db.execute(query, chunk).fetchall())
        return [_decode(found[k]) if k in found else None for k in keys]

    def has(self, keys: Sequence[str]) -> set[str]:
        """The subset of `keys` already stored."""
        present: set[str] = set()
        with self._lock:
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(f"SELECT key FROM predictions WHERE key IN ({marks})", chunk)
                present.update(r[0] for r in rows)
        return present

    def count(self, model: str | None = None) -> int:
        with self._lock:
            if model is None:
                (n,) = self._db.execute("SELECT COUNT(*) FROM predictions").fetchone()
            else:
                (n,) = self._db.execute("SELECT COUNT(*) FROM predictions WHERE model = ?", (model,)).fetchone()
        return int(n)

    def close(self) -> None:
        with self._lock:
            self._db.close()


@dataclass(frozen=True, slots=True)
class OfflineReport:
    """What an offline run did."""

    items: int  # dataset items (single-item requests) considered
    computed: int  # items run through the model in this call
    skipped: int  # items already in the store (not recomputed)
    batches: int  # model calls
    batch_size: int  # the largest batch used
    duration_s: float  # wall time of the run
    items_per_s: float  # computed / duration_s (0 when nothing was computed)


def _items(dataset: Arrays) -> list[dict[str, np.ndarray]]:
    sizes = {int(np.asarray(v).shape[0]) for v in dataset.values()}
    if len(sizes) != 1:
        raise ValueError(f"every dataset array needs the same leading size (one row per item), got {sorted(sizes)}")
    (n,) = sizes
    return [{k: np.asarray(v)[i : i + 1] for k, v in dataset.items()} for i in range(n)]


def run_offline(
    model: Model,
    name: str,
    version: str,
    dataset: Arrays,
    store: PredictionStore,
    *,
    batch_size: int | None = None,
    skip_existing: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
) -> OfflineReport:
    """Predict every row of `dataset` (wire inputs, leading axis = items) in the largest batches and store it.

    Each row is one single-item request: preprocess per item, collate, predict, split, postprocess per item,
    exactly the online batcher's path. `on_progress(done, total)` reports after each batch.
    """
    start = time.monotonic()
    size = batch_size or max(model.config.max_batch_size, 1)
    if size < 1 or (model.config.max_batch_size > 0 and size > model.config.max_batch_size):
        raise ValueError(f"batch_size must be within 1..{max(model.config.max_batch_size, 1)}, got {size}")
    items = _items(dataset)
    keys = [input_key(name, version, item) for item in items]
    present = store.has(keys) if skip_existing else set()
    todo = [i for i, key in enumerate(keys) if key not in present]
    batches = 0
    for begin in range(0, len(todo), size):
        chunk = todo[begin : begin + size]
        pre = [model.preprocess(items[i], {}) for i in chunk]
        outputs = model.predict(model.collate(pre))
        parts = model.split(outputs, [model.request_batch_size(p) for p in pre])
        store.put_many(
            (keys[i], name, version, model.postprocess(part, {})) for i, part in zip(chunk, parts, strict=True)
        )
        batches += 1
        if on_progress is not None:
            on_progress(begin + len(chunk), len(todo))
    elapsed = time.monotonic() - start
    rate = len(todo) / elapsed if todo and elapsed > 0 else 0.0
    return OfflineReport(len(items), len(todo), len(items) - len(todo), batches, size, elapsed, rate)


class PredictionLookup:
    """What the server consults before online inference; counts hits and misses (exported when a registry is given).

    A batched request of n rows hits only when all n single-row keys are stored (their outputs are then
    concatenated); otherwise it is a miss and the whole request goes to the model.
    """

    def __init__(
        self,
        store: PredictionStore,
        model: str,
        version: str,
        *,
        batched: bool = True,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.store, self.model, self.version, self.batched = store, model, version, batched
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._counter: Counter | None = None
        if registry is not None:
            self._counter = Counter(
                "headroom_precomputed_lookups",
                "Precomputed-prediction lookups by result",
                ["model", "result"],
                registry=registry,
            )
            self._counter.labels(model, "hit")
            self._counter.labels(model, "miss")

    def lookup(self, inputs: Arrays) -> dict[str, np.ndarray] | None:
        """Stored outputs for this request, or None (a miss: run the model)."""
        requests = _items(inputs) if self.batched else [dict(inputs)]
        found = self.store.get_many([input_key(self.model, self.version, r) for r in requests])
        hit = bool(found) and all(f is not None for f in found)
        with self._lock:
            if hit:
                self._hits += 1
            else:
                self._misses += 1
        if self._counter is not None:
            self._counter.labels(self.model, "hit" if hit else "miss").inc()
        if not hit:
            return None
        rows = [f for f in found if f is not None]
        return rows[0] if len(rows) == 1 else {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}

    @property
    def hits(self) -> int:
        return self._hits

    @property
    def misses(self) -> int:
        return self._misses

    @property
    def hit_rate(self) -> float:
        total = self._hits + self._misses
        return self._hits / total if total else 0.0
