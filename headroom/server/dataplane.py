"""The transport-free data plane: every HTTP and gRPC inference call ends here.

`DataPlane.infer` owns the request lifecycle: resolve the model version → validate against its config →
derive deadline, latency budget (spent from `received_s`, the edge's arrival time, when set) and priority →
submit to the batcher, which admits by predicted delay (racing the client's disconnect) → respond with
per-stage timings → count the outcome. Exactly one result or one HeadroomError per request. `admit_early`
runs the same admission check before a transport reads the body, with the budget from path and headers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import numpy as np

from headroom import __version__
from headroom.batching.batcher import Batcher, BatcherConfig
from headroom.batching.model_config import latency_budget_ms, policy_config
from headroom.batching.queue import BatchResult
from headroom.core import start_signal
from headroom.core.clock import Clock
from headroom.core.dataplane import DisconnectWatcher, ModelMetadata, ServerMetadata
from headroom.core.errors import HeadroomError, InvalidRequest, ModelNotFound
from headroom.core.lifecycle import ServingLifecycle
from headroom.core.types import InferenceRequest, InferenceResponse, StageTimings, Tensor, v2_datatype
from headroom.lifecycle.drift_feed import DriftFeed
from headroom.lifecycle.offline import PredictionLookup, PredictionStore
from headroom.lifecycle.residency import NotResidentModel, Residency
from headroom.models.classification import ImageClassifier, classification_response
from headroom.models.config import ModelConfig
from headroom.protocol.validation import validate_against
from headroom.server.disconnect import race_disconnect
from headroom.server.generative import GenerativeModels
from headroom.server.metrics import ModelObserver, ServerMetrics
from headroom.server.model_metadata import metadata_from_config
from headroom.server.served import ServedVersion

log = logging.getLogger("headroom.access")  # one line per request, refusals before the body included

#: The `model`/`version` label of requests for a model or version that is not served.
UNKNOWN_LABEL = "__unknown__"
EXTENSIONS = ("binary_tensor_data", "classification", "logging", "model_configuration", "model_repository",
              "statistics", "trace", "generate")


class _Slot:
    """One served version plus its batcher."""

    def __init__(self, served: ServedVersion, batcher: Batcher, observer: ModelObserver,
                 lookup: PredictionLookup | None = None) -> None:
        self.lookup = lookup  # precomputed predictions (`headroom batch`), consulted before the model
        self.served = served
        raw = served.config.parameters.get("labels")
        outputs = served.config.outputs
        # classification-extension class names for the first output, computed once per version
        self.labels = ({outputs[0].name: [str(x) for x in raw]}
                       if isinstance(raw, list | tuple) and outputs else None)
        self.batcher = batcher
        self.observer = observer  # its `stats` are this version's Triton statistics


class DataPlane:
    """Implements headroom.core.dataplane.InferenceDataPlane for tensor models."""

    def __init__(self, metrics: ServerMetrics, clock: Clock, precomputed: PredictionStore | None = None,
                 lifecycle: ServingLifecycle | None = None) -> None:
        self._metrics = metrics
        self._precomputed = precomputed
        self._clock = clock
        self._slots: dict[str, dict[str, _Slot]] = {}
        self._expected: set[str] = set()
        # admission/drain/health shared with the LLM routes; this plane's batchers are among its liveness checks
        self.lifecycle = lifecycle or ServingLifecycle()
        self.lifecycle.add_liveness_check(self)
        self._residency: Residency | None = None  # on-demand loading under a memory budget (lifecycle)
        self._drift: DriftFeed | None = None  # input-drift monitors fed with served inputs (lifecycle)
        self.generative = GenerativeModels()  # LLMs: metadata, readiness and config on the V2 routes

    def attach_lifecycle(self, residency: Residency | None, drift: DriftFeed | None) -> None:
        """Load models on demand through `residency`; sample served inputs into `drift`."""
        self._residency, self._drift = residency, drift

    def _hold(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Keep `name` resident while a request uses it (loading it first); a no-op without a budget."""
        if self._residency is not None and self._residency.manages(name):
            return self._residency.use(name)
        return contextlib.nullcontext()

    # -- lifecycle ---------------------------------------------------------------------------------------
    def expect(self, names: Sequence[str]) -> None:
        """Models that must be loaded before the server reports ready."""
        self._expected.update(names)

    def add(self, served: ServedVersion) -> None:
        """Start serving a loaded version (call inside the running loop)."""
        self._slots.setdefault(served.name, {})[served.version] = self._make_slot(served)

    def _make_slot(self, served: ServedVersion) -> _Slot:
        cfg = served.config
        observer = ModelObserver(self._metrics, served.name, cfg.instances)
        batcher = Batcher(
            served.model,
            BatcherConfig(policy=policy_config(cfg), max_queue_size=cfg.batching.max_queue_size,
                          instances=cfg.instances, batching=cfg.max_batch_size > 0,
                          warmup_batches=served.warmup_batches, compute_nice=cfg.runtime.compute_nice,
                          refusal_pacing_ratio=cfg.batching.refusal_pacing_ratio),
            self._clock,
            observer,
            name=served.name,
            on_fatal=lambda exc: self.lifecycle.report_fatal(f"the batcher of model '{served.name}'", exc),
        )
        batcher.start()
        lookup = None
        if self._precomputed is not None:
            lookup = PredictionLookup(self._precomputed, served.name, served.version, batched=cfg.max_batch_size > 0)
        for stage in served.cold_start:
            self._metrics.cold_start.labels(served.name, served.version, stage.name).set(stage.duration_s)
        return _Slot(served, batcher, observer, lookup)

    async def replace(self, name: str, served: Sequence[ServedVersion],
                      drain_timeout_s: float = 30.0) -> list[ServedVersion]:
        """Atomically switch `name` to new versions; drain and stop the old ones; return them for unloading."""
        old = self._slots.get(name, {})
        self._slots[name] = {s.version: self._make_slot(s) for s in served}
        await self._drain(list(old.values()), drain_timeout_s)
        return [slot.served for slot in old.values()]

    async def _drain(self, slots: list[_Slot], drain_timeout_s: float) -> None:
        deadline = self._clock.now_s() + drain_timeout_s
        for slot in slots:
            while slot.batcher.admitted > 0 and self._clock.now_s() < deadline:
                await asyncio.sleep(0.01)
            await slot.batcher.stop()

    async def remove(self, name: str, drain_timeout_s: float = 30.0) -> list[ServedVersion]:
        """Stop serving every version of `name` (new requests get 404), let admitted ones finish, stop batchers.
        A removed model no longer holds the server's readiness (Triton's strict readiness counts the models that
        should be loaded: unloading one on purpose does not take the server out of rotation)."""
        versions = self._slots.pop(name, None)
        if versions is None:
            raise ModelNotFound(f"model '{name}' is not loaded")
        self._expected.discard(name)
        await self._drain(list(versions.values()), drain_timeout_s)
        return [slot.served for slot in versions.values()]

    def loaded_versions(self, name: str) -> list[str]:
        return sorted(self._slots.get(name, {}), key=_version_key)

    @property
    def inflight(self) -> int:
        """Requests in flight, tensor and LLM alike (the shared lifecycle counts them)."""
        return self.lifecycle.inflight

    async def stop(self) -> None:
        for slot in [s for versions in self._slots.values() for s in versions.values()]:
            await slot.batcher.stop()

    # -- health and metadata -------------------------------------------------------------------------------
    def alive(self) -> bool:
        """Every batcher's loop is running (a LivenessCheck of the lifecycle)."""
        return all(slot.batcher.alive for versions in self._slots.values() for slot in versions.values())

    def live(self) -> bool:
        return self.lifecycle.live()

    def ready(self) -> bool:
        return self._expected <= set(self._slots) and self.lifecycle.ready()

    def model_names(self) -> list[str]:
        return sorted(self._slots)

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(name="headroom", version=__version__, extensions=EXTENSIONS)

    def _slot(self, name: str, version: str = "") -> _Slot:
        versions = self._slots.get(name)
        if not versions:
            known = ", ".join(sorted(self._slots)) or "none"
            if name in self.generative:
                raise InvalidRequest(f"model '{name}' is a generative model served by the LLM engine: use "
                                     f"/v2/models/{name}/generate or the OpenAI routes (/v1/chat/completions)")
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found (served models: {known})")
        if not version:
            return versions[max(versions, key=_version_key)]
        if version not in versions:
            loaded = ", ".join(sorted(versions))
            raise ModelNotFound(f"Request for unknown model: '{name}' version {version} is not found "
                                f"(loaded versions: {loaded})")
        return versions[version]

    def served(self, name: str, version: str = "") -> ServedVersion:
        cfg = self._residency.not_resident_config(name) if self._residency is not None else None
        if cfg is not None:  # known under the memory budget, loads on the next request
            return ServedVersion(name=name, version=version, config=cfg, model=NotResidentModel(cfg))
        return self._slot(name, version).served

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        """The config of a served version (or of a generative model, which has no versions)."""
        if name in self.generative and name not in self._slots:
            return self.generative.config(name, version)
        return self.served(name, version).config  # from the config alone while not resident (memory budget)

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        cfg = self.model_config(name, version)
        return metadata_from_config(name, cfg, tuple(self.loaded_versions(name)) if not version else (version,))

    def labels(self, name: str, version: str = "") -> dict[str, list[str]] | None:
        """Class names for the classification extension: `parameters.labels` names the first output's classes."""
        try:
            return self._slot(name, version).labels
        except ModelNotFound:
            return None

    def resolve(self, name: str, version: str = "", request_id: str = "") -> ServedVersion:
        """`served` for an inference route that checks the model before reading the body: a 404 is counted
        (under UNKNOWN_LABEL) and written to the access log as `infer` would."""
        try:
            return self.served(name, version)
        except ModelNotFound as exc:
            self._metrics.observe_request(*self._unknown_labels(name), _outcome(exc), None)
            self._log(request_id, name, UNKNOWN_LABEL, exc.http_status, self._clock.now_s(), exc.reason)
            raise

    def _unknown_labels(self, name: str) -> tuple[str, str]:
        """Series labels never come from unvalidated client input: one fixed label for unknown names."""
        return (name if name in self._slots else UNKNOWN_LABEL), UNKNOWN_LABEL

    def admit_early(self, name: str, version: str, client_timeout_ms: float | None, request_id: str = "",
                    received_s: float | None = None) -> None:
        """Admission before the body is read (`headroom.batching.admission`): raise Overloaded (counted as
        rejected, logged) if the backlog already rules out the latency budget that the path and headers allow,
        less the time spent since the edge received the request (`received_s`, when known)."""
        if version not in self._slots.get(name, {}) and not (name in self._slots and not version):
            return  # not resident (memory budget) or unknown: `infer` answers
        slot = self._slot(name, version)
        now_s = self._clock.now_s()
        spent_s = 0.0 if received_s is None else max(0.0, now_s - received_s)
        try:
            slot.batcher.check_admission(latency_budget_ms(slot.served.config, client_timeout_ms) / 1e3 - spent_s)
        except HeadroomError as exc:
            slot.observer.stats.on_failure(0.0)
            self._metrics.observe_request(name, slot.served.version, _outcome(exc), None)
            self._log(request_id, name, slot.served.version, exc.http_status,
                      now_s if received_s is None else min(now_s, received_s), exc.reason)
            raise

    def config_of(self, name: str, version: str = "") -> ModelConfig | None:
        """The config requests for `name` are checked against while decoding (None: unknown, 404 later)."""
        try:
            return self.served(name, version).config
        except ModelNotFound:
            return None

    def model_ready(self, name: str, version: str = "") -> bool:
        if name in self.generative and name not in self._slots:
            config, draining = self.generative.config(name, version), self.lifecycle.draining
            return bool(config and not draining and self.generative.ready(name))
        if self._residency is not None and self._residency.not_resident_config(name) is not None:
            return False  # known, loads on the next request
        self._slot(name, version)
        return not self.lifecycle.draining

    def model_stats(self, name: str = "", version: str = "") -> list[dict[str, object]]:
        """Per-version statistics in Triton's schema (server/statistics.py; LLMs too), + queue_depth, cold_start."""
        if name in self.generative and name not in self._slots:
            return [self.generative.stats(name, version)]
        slots = [self._slot(name, version)] if name else [s for v in self._slots.values() for s in v.values()]
        return [*([] if name else [self.generative.stats(n) for n in self.generative.loaded_names()]), *[{
            **slot.observer.stats.to_json(slot.served.name, slot.served.version),
            "queue_depth": slot.batcher.admitted,
            "cold_start": [{"stage": s.name, "seconds": s.duration_s} for s in slot.served.cold_start],
        } for slot in slots]]

    def queue_depth(self, name: str) -> int:
        return sum(s.batcher.admitted for s in self._slots.get(name, {}).values())

    # -- inference ---------------------------------------------------------------------------------------
    async def infer(self, request: InferenceRequest,
                    disconnected: DisconnectWatcher | None = None) -> InferenceResponse:
        entered_s = self._clock.now_s()  # time spent at the edge (HTTP parsing, a busy event loop) counts too:
        start_s = entered_s if request.received_s is None else min(entered_s, request.received_s)
        name, version = request.model_name, request.model_version or "?"
        slot: _Slot | None = None
        admitted = False
        try:
            self.lifecycle.admit(name)  # Draining (503 + x-headroom-draining) once SIGTERM arrived
            admitted = True
            self._metrics.inflight.inc()
            async with self._hold(name):
                swap_wait_s = self._clock.now_s() - entered_s  # an on-demand load does not use up the timeout
                slot = self._slot(request.model_name, request.model_version)
                version = slot.served.version
                response = await self._infer(slot, request, start_s, disconnected, swap_wait_s)
        except HeadroomError as exc:
            if slot is not None:
                slot.observer.stats.on_failure(self._clock.now_s() - start_s)
            else:
                name, version = self._unknown_labels(name)
            self._metrics.observe_request(name, version, _outcome(exc), None)
            self._log(request.request_id, request.model_name, version, exc.http_status, start_s, exc.reason)
            raise
        finally:
            if admitted:
                self._metrics.inflight.dec()
                self.lifecycle.release()
        slot.observer.stats.on_success(response.timings, response.batch_size, time.time_ns() // 1_000_000)
        self._metrics.observe_request(name, version, "success", response.timings)
        self._log(request.request_id, request.model_name, version, 200, start_s, "ok")
        return response

    async def _infer(self, slot: _Slot, request: InferenceRequest, start_s: float,
                     disconnected: DisconnectWatcher | None, swap_wait_s: float = 0.0) -> InferenceResponse:
        cfg = slot.served.config
        validate_against(request, cfg)  # names, datatypes and shapes (headroom.protocol.validation)
        inputs = {t.name: t.data for t in request.inputs}
        if self._drift is not None and slot.served.version_dir is not None:
            self._drift.offer(cfg.name, slot.served.version_dir, inputs)
        timeout_ms = cfg.batching.default_timeout_ms
        if request.timeout_ms is not None:
            if not request.timeout_ms > 0:
                raise InvalidRequest(f"timeout must be > 0 ms, got {request.timeout_ms}")
            timeout_ms = min(timeout_ms, request.timeout_ms)  # may shorten, never lengthen
        spent_s = self._clock.now_s() - start_s - swap_wait_s
        budget_s = latency_budget_ms(cfg, request.timeout_ms) / 1e3 - spent_s
        levels = cfg.batching.priority_levels
        priority = request.priority or levels
        if not 1 <= priority <= levels:
            raise InvalidRequest(f"priority must be between 1 (highest) and {levels} for model '{cfg.name}'")
        params = request.parameters
        if slot.lookup is not None:
            stored = await asyncio.to_thread(slot.lookup.lookup, inputs)
            self._metrics.precomputed.labels(cfg.name, "hit" if stored is not None else "miss").inc()
            if stored is not None:
                return self._response(slot, request, BatchResult(stored, 0.0, 0.0, 0.0, 0), start_s)
        submit = slot.batcher.submit(
            inputs, params, deadline_s=start_s + swap_wait_s + timeout_ms / 1e3, priority=priority,
            group=str(params.get("frame_id", "")), stream=str(params.get("stream_id", "")), budget_s=budget_s,
            on_start=start_signal.take(),  # a tied copy tells its router when it leaves the queue
        )
        result = await race_disconnect(submit, disconnected, cfg.name)
        return self._response(slot, request, result, start_s)

    def _response(self, slot: _Slot, request: InferenceRequest, result: BatchResult,
                  start_s: float) -> InferenceResponse:
        cfg = slot.served.config
        wanted = [o.name for o in request.outputs] or [o.name for o in cfg.outputs]
        outputs = []
        for out_name in wanted:
            if out_name not in result.outputs:
                raise InvalidRequest(f"model '{cfg.name}' has no output '{out_name}'")
            arr = np.asarray(result.outputs[out_name])
            outputs.append(Tensor(name=out_name, datatype=v2_datatype(arr), shape=tuple(arr.shape), data=arr))
        timings = result.timings((self._clock.now_s() - start_s) * 1e3)
        params: dict[str, object] = {}
        if result.missing_streams:
            params["missing_streams"] = list(result.missing_streams)
        return InferenceResponse(
            request_id=request.request_id, model_name=cfg.name, model_version=slot.served.version,
            outputs=tuple(outputs), requested=request.outputs, parameters=params, timings=timings,
            batch_size=result.batch_size,
        )

    def _log(self, request_id: str, model: str, version: str, status: int, start_s: float, reason: str) -> None:
        if log.isEnabledFor(logging.INFO):
            log.info("request", extra={"fields": {
                "request_id": request_id, "model": model, "version": version, "status": status, "reason": reason,
                "duration_ms": round((self._clock.now_s() - start_s) * 1e3, 3),
            }})

    async def classify_image(self, name: str, version: str, image: bytes, top_k: int, min_confidence: float,
                             disconnected: DisconnectWatcher | None = None) -> tuple[dict[str, object], StageTimings]:
        """The raw-image route: decode → the model's batched pipeline → top-k labelled predictions."""
        async with self._hold(name):
            slot = self._slot(name, version)
        model = slot.served.model
        if not isinstance(model, ImageClassifier):
            raise InvalidRequest(f"model '{name}' does not accept raw images; use /v2/models/{name}/infer")
        inputs = await asyncio.to_thread(model.image_inputs, image)
        tensors = tuple(Tensor(k, v2_datatype(v), tuple(v.shape), v) for k, v in inputs.items())
        request = InferenceRequest(request_id=f"image-{name}", model_name=name, model_version=version,
                                   inputs=tensors)
        response = await self.infer(request, disconnected)
        outputs = {t.name: t.data for t in response.outputs}
        predictions = model.classify(outputs, top_k, min_confidence)
        body = classification_response(predictions, name, response.model_version, response.timings.total_ms)
        return body, response.timings


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), version) if version.isdigit() else (-1, version)


def _outcome(exc: HeadroomError) -> str:
    return {504: "timeout", 503: "rejected", 429: "rejected", 499: "cancelled"}.get(
        exc.http_status, "error" if exc.http_status >= 500 else "invalid")
