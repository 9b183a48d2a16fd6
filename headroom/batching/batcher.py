"""The asyncio mechanism around `policy.decide`: admission, a wake-up loop, and thread execution.

Request path inside one model version:

    submit() ── admission (queue full, or predicted delay over the budget → Overloaded/503; held a while
             when refusals far outnumber admissions: `refusal_pacing`)
             ── preprocess in a worker thread (overlaps the running batch) ── queue
             ── loop: decide(snapshot, now) ── expire → DeadlineExceeded (never executed)
                                            └── take  → collate/predict/split/postprocess in
                                                       the model's executor → futures resolved

Model work runs on `workers.ThreadWorkers` threads (one queue put per call, one `call_soon_threadsafe` back).
A model whose preprocess only decodes (`cheap_preprocess = True`, e.g. minilm, which tokenizes the whole
batch in collate) has it run inline on the event loop: a thread hop per request costs more than that work.

The loop sleeps (on one plain future) until a request arrives, a batch finishes with requests still queued, or
the policy's `wake_at_s` (one loop timer). It is the only writer of the queue. Every admitted request's future
is resolved exactly once: if the loop itself dies (a bug, never a model error: those fail their batch only),
everything queued fails with a 500, `alive` turns false and `on_fatal` is told, so that the server turns
liveness red and exits. The load estimators (`headroom.batching.estimator`) are updated on the event loop
only: arrivals in `submit`, batch service times when a batch's executor call returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import NoReturn, Protocol

import numpy as np

from headroom.batching.admission import admit, refusal_message
from headroom.batching.estimator import LoadEstimates
from headroom.batching.policy import BatchPolicyConfig, QueuedItem, QueueSnapshot, decide
from headroom.batching.queue import BatchResult, Entry
from headroom.batching.refusal_pacing import STORM_RATIO, RefusalPacing
from headroom.batching.workers import ThreadWorkers
from headroom.core import start_signal
from headroom.core.clock import Clock
from headroom.core.errors import Cancelled, DeadlineExceeded, HeadroomError, InvalidRequest, Overloaded
from headroom.models.base import Model

log = logging.getLogger("headroom.batcher")


class BatcherObserver(Protocol):
    """Where the batcher reports what it does (the server wires Prometheus metrics here)."""

    def on_queue_depth(self, depth: int) -> None: ...
    def on_batch(self, batch_size: int, num_requests: int, compute_s: float, window_s: float) -> None: ...
    def on_busy(self, busy_s: float) -> None: ...


class NullObserver:
    """An observer that records nothing (tests, simulator)."""

    def on_queue_depth(self, depth: int) -> None:
        pass

    def on_batch(self, batch_size: int, num_requests: int, compute_s: float, window_s: float) -> None:
        pass

    def on_busy(self, busy_s: float) -> None:
        pass


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    """Mechanism settings for one model version's batcher."""

    policy: BatchPolicyConfig  # the pure policy's knobs
    max_queue_size: int = 256  # admitted-but-unfinished requests beyond this are rejected (503)
    instances: int = 1  # batches that may execute concurrently
    batching: bool = True  # False: every request runs alone (max_batch_size 0 models)
    retry_after_s: float = 1.0  # Retry-After advertised on a full queue's 503
    warmup_batches: tuple[tuple[int, float], ...] = ()  # (items, seconds) of warmup's batches: the first estimate
    compute_nice: int = 0  # nice value of the batch and preprocess threads (headroom.core.compute_priority)
    refusal_pacing_ratio: float = STORM_RATIO  # refusals per admission past which refusals are held (0: never)


class Batcher:
    """Dynamic batcher for one model version. Create inside a running loop; call `start()` then `submit()`."""

    def __init__(self, model: Model, config: BatcherConfig, clock: Clock,
                 observer: BatcherObserver | None = None, name: str = "model",
                 on_fatal: Callable[[BaseException], None] | None = None) -> None:
        self._model = model
        self._cfg = config
        self._clock = clock
        self._obs: BatcherObserver = observer or NullObserver()
        self._name = name
        self._queue: list[Entry] = []
        self._admitted = 0  # admitted and not yet resolved (includes preprocessing and executing)
        self._free_instances = config.instances
        # The loop sleeps on one plain future (no Event, no asyncio.timeout per sleep): `_wake` resolves it, and a
        # policy's `wake_at_s` is one loop timer that calls `_wake`.
        self._sleeping: asyncio.Future[None] | None = None
        self._executor = ThreadWorkers(config.instances, f"{name}-exec", nice=config.compute_nice)
        self._pre_executor = ThreadWorkers(2, f"{name}-pre", nice=config.compute_nice)
        # A model whose preprocess only decodes (`cheap_preprocess = True`) runs it on the event loop.
        self._inline_preprocess = model.cheap_preprocess
        self._loop_task: asyncio.Task[None] | None = None
        self._on_fatal = on_fatal  # told once if the loop dies
        self._died: BaseException | None = None  # why the loop died
        self._batch_tasks: set[asyncio.Task[None]] = set()
        self._load = LoadEstimates()  # arrival rate and service time: the same code as the simulator's
        # holds refusals during a retry storm (None: off)
        self._pacing = RefusalPacing(config.refusal_pacing_ratio) if config.refusal_pacing_ratio > 0 else None
        for items, seconds in config.warmup_batches:  # the estimate is not 0 before the first request
            self._load.service.observe(seconds, items)

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name=f"batcher-{self._name}")
            self._loop_task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """The loop only ends by `stop()` (cancelled); anything else is a death: fail the queue, report."""
        if task.cancelled() or task.exception() is None:
            return
        self._died = exc = task.exception()
        for entry in self._queue:
            if not entry.future.done():
                entry.future.set_exception(HeadroomError(f"model '{self._name}' batcher failed: {exc}"))
        self._queue.clear()
        if self._on_fatal is not None and exc is not None:
            self._on_fatal(exc)

    @property
    def alive(self) -> bool:
        """False once the loop died (not started and stopped count as alive: nothing is wrong)."""
        return self._died is None

    async def stop(self) -> None:
        """Cancel the loop, fail what is still queued with NotReady-like errors, release threads."""
        if self._loop_task is not None:
            if self._died is None:  # a loop that died was already reported; its exception is not stop()'s
                self._loop_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._loop_task
            self._loop_task = None
        for entry in self._queue:
            if not entry.future.done():
                entry.future.set_exception(Overloaded("the model is shutting down", retry_after_s=1.0))
        self._queue.clear()
        if self._batch_tasks:
            await asyncio.gather(*self._batch_tasks, return_exceptions=True)
        self._executor.shutdown()
        self._pre_executor.shutdown()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def admitted(self) -> int:
        return self._admitted

    @property
    def service_time_s(self) -> float:
        """The current per-batch service-time estimate."""
        return self._load.service.mean_s

    @property
    def delay_factor(self) -> float:
        """The delay calibration's correction of admission's predictions (`headroom.batching.calibration`)."""
        return self._load.delays.factor_at(self._clock.now_s())

    def check_admission(self, budget_s: float | None) -> float:
        """Raise Overloaded (503 + Retry-After) if the queue is full or, with a latency budget, if the
        predicted delay (`headroom.batching.admission`) does not fit it. Cheap: callable before a body is read.
        Returns admission's mean prediction of the delay (0 without a budget): the delay calibration's input."""
        if self._admitted >= self._cfg.max_queue_size:
            self._refuse(f"model '{self._name}' queue is full ({self._cfg.max_queue_size} requests); retry later",
                         self._cfg.retry_after_s)
        if budget_s is None:
            return 0.0
        backlog = self._load.backlog(self._admitted, self._cfg.policy.max_batch_size if self._cfg.batching else 1,
                                     self._cfg.instances, self._clock.now_s())
        decision = admit(backlog, budget_s)
        if not decision.admitted:
            self._refuse(refusal_message(self._name, backlog, decision, budget_s), decision.retry_after_s)
        return decision.expected_s

    def _refuse(self, message: str, retry_after_s: float) -> NoReturn:
        """Raise Overloaded, held while refusals far outnumber admissions (`headroom.batching.refusal_pacing`)."""
        hold_s = 0.0 if self._pacing is None else self._pacing.on_refused(self._clock.now_s(), retry_after_s)
        if self._pacing is not None and hold_s > 0.0:
            message += (f"; answered after {hold_s * 1e3:.0f} ms: refusals outnumber admissions over "
                        f"{self._pacing.ratio:g} to 1 (clients re-sending without waiting for Retry-After)")
        raise Overloaded(message, retry_after_s=retry_after_s, hold_s=hold_s)

    # -- request path ----------------------------------------------------------------------------------
    async def submit(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, object], *,
                     deadline_s: float, priority: int = 1, group: str = "", stream: str = "",
                     budget_s: float | None = None, on_start: Callable[[], None] | None = None) -> BatchResult:
        """Admit (`check_admission` with the request's remaining latency budget), preprocess, queue and
        await one request; `on_start` is called once when its batch starts executing (never for a request
        that leaves the queue without running). Raises HeadroomError subclasses."""
        expected_s = self.check_admission(budget_s)
        if self._pacing is not None:
            self._pacing.on_admitted(self._clock.now_s())
        self._admitted += 1
        self._obs.on_queue_depth(self._admitted)
        try:
            return await self._admit(inputs, parameters, deadline_s, priority, group, stream, on_start,
                                     math.inf if budget_s is None else budget_s, expected_s)
        finally:
            self._admitted -= 1
            self._obs.on_queue_depth(self._admitted)

    async def _admit(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, object],
                     deadline_s: float, priority: int, group: str, stream: str,
                     on_start: Callable[[], None] | None, budget_s: float, expected_s: float) -> BatchResult:
        admitted_s = self._clock.now_s()
        self._load.arrivals.observe(admitted_s)
        if self._inline_preprocess:  # cheaper than the thread hop it would otherwise take
            model_inputs = self._model.preprocess(inputs, parameters)
        else:
            model_inputs = await self._pre_executor.run(self._model.preprocess, inputs, parameters)
        now_s = self._clock.now_s()
        preprocess_s = now_s - admitted_s
        if now_s >= deadline_s:
            raise DeadlineExceeded("the request's deadline passed during preprocessing; it was not executed")
        size = self._model.request_batch_size(model_inputs) if self._cfg.batching else 1
        if self._cfg.batching and size > self._cfg.policy.max_batch_size:
            cap = self._cfg.policy.max_batch_size
            raise InvalidRequest(f"request batch size {size} exceeds the model's max_batch_size {cap}")
        key = self._model.batch_key(model_inputs) if self._cfg.batching else ()
        item = QueuedItem(enqueued_s=now_s, deadline_s=deadline_s, size=size, priority=priority,
                          group=group, stream=stream, batch_key=key, budget_s=budget_s,
                          expected_s=expected_s)
        entry = Entry(item=item, inputs=model_inputs, parameters=parameters,
                      future=asyncio.get_running_loop().create_future(),
                      admitted_s=admitted_s, preprocess_s=preprocess_s, on_start=on_start)
        entry.future.add_done_callback(_consume_exception)
        if self._died is not None:  # nothing would ever take it from the queue
            raise HeadroomError(f"model '{self._name}' batcher failed: {self._died}")
        self._queue.append(entry)
        self._wake()
        try:  # no shield: a cancelled future is one the batcher skips (it only resolves futures not done)
            return await entry.future
        except asyncio.CancelledError:
            entry.cancelled = True
            if entry in self._queue:
                self._queue.remove(entry)
                self._wake()
            raise

    # -- the loop --------------------------------------------------------------------------------------
    def _wake(self) -> None:
        """Have the loop look again (at most once per loop iteration, however many callers)."""
        sleeping = self._sleeping
        if sleeping is not None and not sleeping.done():
            sleeping.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            wake_at_s = self._step()
            self._sleeping = sleeping = loop.create_future()
            if wake_at_s is None:
                await sleeping
                continue
            timer = loop.call_later(max(0.0, wake_at_s - self._clock.now_s()), self._wake)
            try:
                await sleeping
            finally:
                timer.cancel()

    def _step(self) -> float | None:
        """Dispatch as many batches as free instances allow; return when to look again."""
        wake_at_s: float | None = None
        while self._queue:
            now_s = self._clock.now_s()
            if self._free_instances <= 0:
                # Every instance is busy: only expire requests whose deadline passed meanwhile.
                self._expire(tuple(i for i, e in enumerate(self._queue) if e.item.deadline_s <= now_s))
                return self._next_deadline()
            policy = self._cfg.policy if self._cfg.batching else replace(self._cfg.policy, max_batch_size=1)
            decision = decide(self._snapshot(now_s), now_s, policy)
            taken = [self._queue[i] for i in decision.take]
            self._expire(decision.expire)
            if not taken:
                wake_at_s = decision.wake_at_s
                break
            for entry in taken:
                self._queue.remove(entry)
            self._free_instances -= 1
            task = asyncio.create_task(self._execute(taken, decision.window_s, decision.missing_streams),
                                       name=f"batch-{self._name}")
            self._batch_tasks.add(task)
            task.add_done_callback(self._batch_tasks.discard)
        return wake_at_s

    def _snapshot(self, now_s: float) -> QueueSnapshot:
        return self._load.snapshot([e.item for e in self._queue], now_s)

    def _next_deadline(self) -> float | None:
        return min((e.item.deadline_s for e in self._queue), default=None)

    def _expire(self, indices: tuple[int, ...]) -> None:
        expired = [self._queue[i] for i in indices]
        for entry in expired:
            self._queue.remove(entry)
            if not entry.future.done():
                entry.future.set_exception(
                    DeadlineExceeded("the request's deadline passed while it was queued; it was not executed")
                )

    async def _execute(self, entries: list[Entry], window_s: float, missing: tuple[str, ...]) -> None:
        start_s = self._clock.now_s()
        live = [e for e in entries if not e.cancelled and not e.future.done()]  # done: its task was cancelled
        compute_s = 0.0
        for entry in live:
            start_signal.fire(entry.on_start)
        try:
            if live:
                results = await self._executor.run(self._run_batch, live, start_s, missing)
                # collate + predict + split + postprocess, for the batch's items
                done_s = self._clock.now_s()
                self._load.service.observe(done_s - start_s, sum(e.item.size for e in live))
                for entry in live:  # admission's feedback: did each request make its budget?
                    self._load.delays.observe(done_s - entry.admitted_s, entry.item.budget_s, entry.item.expected_s,
                                              done_s)
                compute_s = results[0].compute_s
                for entry, result in zip(live, results, strict=True):
                    if not entry.future.done():
                        entry.future.set_result(result)
        except HeadroomError as exc:
            for entry in live:
                if not entry.future.done():
                    entry.future.set_exception(exc)
        except Exception as exc:  # a model bug must not take the server down
            log.exception("model %s failed on a batch of %d", self._name, len(live))
            for entry in live:
                if not entry.future.done():
                    entry.future.set_exception(HeadroomError(f"model '{self._name}' failed: {exc}"))
        finally:
            busy_s = self._clock.now_s() - start_s
            self._obs.on_busy(busy_s)
            self._free_instances += 1
            if self._queue:  # an empty queue has nothing to dispatch: the next arrival wakes the loop
                self._wake()
        if live:
            self._obs.on_batch(sum(e.item.size for e in live), len(live), compute_s, window_s)

    def _run_batch(self, entries: list[Entry], start_s: float, missing: tuple[str, ...]) -> list[BatchResult]:
        """Runs in the executor thread: collate, predict, split, postprocess."""
        model = self._model
        batch = model.collate([e.inputs for e in entries])
        t0 = self._clock.now_s()
        outputs = model.predict(batch)
        compute_s = self._clock.now_s() - t0
        sizes = [e.item.size for e in entries]
        pieces = model.split(outputs, sizes)
        batch_size = sum(sizes)
        results = []
        for entry, piece in zip(entries, pieces, strict=True):
            p0 = self._clock.now_s()
            post = model.postprocess(piece, entry.parameters)
            results.append(BatchResult(outputs=post, queue_s=max(0.0, start_s - entry.item.enqueued_s),
                                       compute_s=compute_s, postprocess_s=self._clock.now_s() - p0,
                                       batch_size=batch_size, missing_streams=missing,
                                       preprocess_s=entry.preprocess_s,
                                       batch_wait_s=max(0.0, p0 - start_s - compute_s)))
        return results


def _consume_exception(future: asyncio.Future[BatchResult]) -> None:
    """Mark a future's exception as retrieved (its client may have gone away before reading it)."""
    if not future.cancelled():
        future.exception()


def cancelled_error(name: str) -> Cancelled:
    """The error recorded for a request whose client went away."""
    return Cancelled(f"client disconnected; request to '{name}' dropped")
