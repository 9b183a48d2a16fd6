"""`AsyncLLMEngine`: the step loop in one background thread, per-request async output streams.

The event loop never runs model code: `generate()` sends an "add" command to the engine thread and awaits
the admission verdict (InvalidRequest / RateLimited surface there), then yields `SequenceOutput`s pushed
back with `call_soon_threadsafe`. Leaving the stream early (`aclose()`: client disconnect, deadline) sends an
"abort" command, which frees the request's blocks before the next step; closing works also on a stream whose
first `__anext__` was cancelled before it ever ran (`asyncio.wait_for` with a deadline already past). An abort
also tells the engine's `StepCancel`: once every request of the step in flight is being aborted, that step stops
at its next layer boundary instead of running to its end, so the blocks and gauges are freed within a layer.

If the step loop dies (an exception that no single sequence owns, e.g. in the model's forward), every open
stream ends with a 500, new requests get 503, `alive()` turns false and `on_fatal(exc)` is called from the
engine thread (its owner hands it to the event loop: `headroom serve` then exits non-zero).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from headroom.core import start_signal
from headroom.core.errors import HeadroomError, NotReady
from headroom.llm.engine import LLMEngine
from headroom.llm.kv_cache import CachedBlocks
from headroom.llm.request import SamplingParams, SequenceOutput


@dataclass(frozen=True, slots=True)
class _Add:
    """Admit a request (answered through `admitted`)."""

    request_id: str  # user-visible id
    prompt_token_ids: tuple[int, ...]  # prompt
    params: SamplingParams  # sampling
    priority: int  # lower = sooner
    cache_key: str  # prefix-cache isolation key ("" = shared)
    stream: asyncio.Queue[SequenceOutput | BaseException]  # where outputs go
    admitted: asyncio.Future[None]  # resolved (or failed) once admission is decided
    loop: asyncio.AbstractEventLoop  # the loop owning stream and admitted


@dataclass(frozen=True, slots=True)
class _Abort:
    """Abort a request if still running."""

    request_id: str  # user-visible id


class AsyncLLMEngine:
    """Owns an LLMEngine and the thread that steps it."""

    def __init__(self, engine: LLMEngine, on_fatal: Callable[[BaseException], None] | None = None,
                 published_blocks_limit: int = 4096) -> None:
        self.engine = engine
        self.published_blocks_limit = published_blocks_limit  # most block hashes `cached_blocks` holds
        # what the prefix cache holds, republished by the engine thread after a step that changed it (the
        # event loop reads this immutable value; it never touches the KV manager the engine thread mutates)
        self._cached = engine.kv.cached_blocks(published_blocks_limit)
        self._on_fatal = on_fatal  # called from the engine thread if the loop dies
        self._commands: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[SequenceOutput | BaseException]]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._closed = False  # set by the engine thread as it exits: no command is taken after that
        self._lock = threading.Lock()  # orders `_closed` against putting an "add" command
        self._unhandled = 0  # "add" commands put and not yet handled by the engine thread (under _lock)
        self._ids = itertools.count()

    # --- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop the loop thread; every open stream ends with NotReady."""
        self._stopping.set()
        self._commands.put(None)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    @property
    def healthy(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._error is None

    def alive(self) -> bool:
        """False once the step loop died (not started yet and stopped count as alive)."""
        return self._error is None

    # --- the public API ---------------------------------------------------------------------------------
    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._ids)}"

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        priority: int = 0,
        cache_key: str = "",
    ) -> AsyncIterator[SequenceOutput]:
        """Admit (raising InvalidRequest / RateLimited / NotReady) and return the output stream."""
        if not self.healthy:
            raise NotReady(f"the LLM engine is not running ({self._error or 'stopped'})")
        loop = asyncio.get_running_loop()
        on_start = start_signal.take()  # a tied copy tells its router when its first output arrives
        stream: asyncio.Queue[SequenceOutput | BaseException] = asyncio.Queue()
        admitted: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._closed:
                raise NotReady(f"the LLM engine is not running ({self._error or 'stopped'})")
            self._commands.put(_Add(request_id, tuple(prompt_token_ids), params, priority, cache_key, stream,
                                    admitted, loop))
            self._unhandled += 1
        try:
            await admitted
        except asyncio.CancelledError:
            self._abort(request_id)
            raise
        return _OutputStream(self._abort, request_id, params.n, stream, on_start)

    def idle(self) -> bool:
        """No request is queued for or running in the engine (a reload drains the old engine until idle)."""
        with self._lock:
            return self._unhandled == 0 and not self._streams

    def cached_blocks(self) -> CachedBlocks:
        """The prefix cache's block hashes as of the last step that changed them (safe from any thread)."""
        return self._cached

    async def abort(self, request_id: str) -> None:
        self._abort(request_id)

    def _abort(self, request_id: str) -> None:
        """Queue the abort, then let it cancel the step in flight if that step carries nothing else."""
        self._commands.put(_Abort(request_id))
        self.engine.cancel.request_abort(request_id)

    # --- the engine thread ------------------------------------------------------------------------------
    def _handle(self, cmd: _Add | _Abort) -> None:
        if isinstance(cmd, _Abort):
            self._deliver_all(self.engine.abort(cmd.request_id))
            self._streams.pop(cmd.request_id, None)
            self.engine.cancel.forget(cmd.request_id)
            return
        try:
            self._add(cmd)
        finally:
            with self._lock:
                self._unhandled -= 1

    def _add(self, cmd: _Add) -> None:
        try:
            self.engine.add_request(cmd.request_id, cmd.prompt_token_ids, cmd.params, cmd.priority, cmd.cache_key)
        except Exception as exc:  # admission errors go back to the caller
            cmd.loop.call_soon_threadsafe(_set_exception, cmd.admitted, exc)
            return
        self._streams[cmd.request_id] = (cmd.loop, cmd.stream)
        cmd.loop.call_soon_threadsafe(_set_result, cmd.admitted)

    def _deliver(self, out: SequenceOutput) -> None:
        target = self._streams.get(out.parent_id)
        if target is None:
            return
        loop, stream = target
        item: SequenceOutput | BaseException = out if out.error is None else out.error
        with contextlib.suppress(RuntimeError):  # the loop closed under us: nobody listens any more
            loop.call_soon_threadsafe(stream.put_nowait, item)
        if out.error is not None:
            self._streams.pop(out.parent_id, None)  # a failed sequence ends its whole request

    def _deliver_all(self, outs: Sequence[SequenceOutput]) -> None:
        """Deliver a batch of outputs, then drop the streams of requests that have no sequence left (only after
        the whole batch: n siblings often finish in the same step, and each of them must reach the stream)."""
        for out in outs:
            self._deliver(out)
        for parent in {out.parent_id for out in outs if out.finished}:
            if not self.engine.has_request(parent):
                self._streams.pop(parent, None)

    def _run(self) -> None:
        torch = sys.modules.get("torch")  # the fp32 runner's torch (the native runner takes a count per step)
        if torch is not None and self.engine.config.num_threads > 0:  # OpenMP counts are per calling thread
            torch.set_num_threads(self.engine.config.num_threads)
        try:
            while not self._stopping.is_set():
                block = not self.engine.has_unfinished
                try:
                    cmd = self._commands.get(block=block)
                except queue.Empty:
                    cmd = None
                    block = False
                while cmd is not None:
                    self._handle(cmd)
                    try:
                        cmd = self._commands.get_nowait()
                    except queue.Empty:
                        cmd = None
                if self._stopping.is_set():
                    break
                if self.engine.has_unfinished:
                    self._deliver_all(self.engine.step())
                    if self.engine.kv.version != self._cached.version:
                        self._cached = self.engine.kv.cached_blocks(self.published_blocks_limit)
        except BaseException as exc:  # a model failure: fail every stream, refuse new work
            self._error = exc
        finally:
            err: BaseException = (
                HeadroomError(f"LLM engine failed: {self._error}") if self._error else NotReady("LLM engine stopped")
            )
            for loop, stream in list(self._streams.values()):
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(stream.put_nowait, err)
            self._streams.clear()
            with self._lock:
                self._closed = True
            self._refuse_pending(err)
            try:
                for req_id in self.engine.request_ids():
                    self.engine.abort(req_id)
            except Exception as exc:  # the engine is broken beyond freeing its requests
                self._error = self._error or exc
            self.engine.close()
            if self._error is not None and self._on_fatal is not None:
                self._on_fatal(self._error)


    def _refuse_pending(self, err: BaseException) -> None:
        """Answer the "add" commands that arrived after the loop's last look (none hangs)."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Add):
                with contextlib.suppress(RuntimeError):
                    cmd.loop.call_soon_threadsafe(_set_exception, cmd.admitted, err)


class _OutputStream:
    """One request's outputs until all `n` choices finished; `aclose()` aborts what is still running."""

    def __init__(
        self,
        abort: Callable[[str], None],
        request_id: str,
        n: int,
        stream: asyncio.Queue[SequenceOutput | BaseException],
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self._abort = abort  # queues the request's abort for the engine thread
        self._on_start = on_start  # fired once, on the first output (the request is executing)
        self._request_id = request_id  # user-visible id
        self._remaining = n  # choices not finished yet
        self._stream = stream  # outputs pushed by the engine thread

    def __aiter__(self) -> _OutputStream:
        return self

    async def __anext__(self) -> SequenceOutput:
        if not self._remaining:
            raise StopAsyncIteration
        item = await self._stream.get()
        if isinstance(item, BaseException):
            self._remaining = 0  # the engine failed or stopped: nothing left to abort
            raise item
        if self._on_start is not None:
            start_signal.fire(self._on_start)
            self._on_start = None
        if item.finished:
            self._remaining -= 1
        return item

    async def aclose(self) -> None:
        """Abort the request unless every choice finished (idempotent)."""
        if self._remaining:
            self._remaining = 0
            self._abort(self._request_id)


def _set_result(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _set_exception(fut: asyncio.Future[None], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
