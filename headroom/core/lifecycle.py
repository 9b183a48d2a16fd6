"""The serving lifecycle that every request shares, whatever kind of model serves it.

One `ServingLifecycle` per process. Tensor requests (`server.dataplane.DataPlane`) and LLM requests
(`llm.serving.OpenAIServing`) both pass through it; transports only translate:

    admit(model) ─► Draining (503, `x-headroom-draining: 1`) once drain started; else counted in flight
    release()    ─► when the response is complete (a stream: when its last event went out or it was closed)
    live()       ─► no background loop died, and every LivenessCheck (engine loops, batchers) is alive
    ready()      ─► live, not draining, and every ReadinessCheck (models loaded, engines warmed) is ready
    report_fatal ─► a background loop died: log its traceback, liveness turns false, the owner is told
                    (`headroom serve` then drains the other models and exits non-zero)

Everything here runs on the event loop; a component whose loop is a thread hands `report_fatal` to the loop
with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Protocol

from headroom.core.errors import Draining

log = logging.getLogger("headroom.lifecycle")

FatalHandler = Callable[[str, BaseException], None]  # (component, exception)


class LivenessCheck(Protocol):
    """A component with a background loop (an engine thread, a batcher task)."""

    def alive(self) -> bool: ...


class ReadinessCheck(Protocol):
    """A component that must be ready before the server takes traffic (models loaded, engines warmed)."""

    def ready(self) -> bool: ...


class ServingLifecycle:
    """Admission while not draining, in-flight accounting, liveness, readiness and the fatal path."""

    def __init__(self) -> None:
        self._draining = False
        self._inflight = 0
        self._idle = asyncio.Event()  # set whenever nothing is in flight
        self._idle.set()
        self._liveness: list[LivenessCheck] = []
        self._readiness: list[ReadinessCheck] = []
        self._fatal_handlers: list[FatalHandler] = []
        self.fatal: tuple[str, BaseException] | None = None  # the first component that died, and why

    # -- admission ---------------------------------------------------------------------------------------
    def admit(self, model: str) -> None:
        """Count one request in flight; raise Draining (503) once drain has started."""
        if self._draining:
            raise Draining(f"the server is draining; send requests for '{model}' elsewhere", retry_after_s=1.0)
        self._inflight += 1
        self._idle.clear()

    def release(self) -> None:
        """The response of one admitted request is complete."""
        self._inflight -= 1
        if self._inflight <= 0:
            self._inflight = 0
            self._idle.set()

    @contextlib.contextmanager
    def request(self, model: str) -> Iterator[None]:
        """`admit` on entry, `release` on exit."""
        self.admit(model)
        try:
            yield
        finally:
            self.release()

    @property
    def inflight(self) -> int:
        """Admitted requests whose response is not complete yet."""
        return self._inflight

    # -- drain -------------------------------------------------------------------------------------------
    def start_draining(self) -> None:
        """Refuse new requests from now on (readiness turns false at once)."""
        self._draining = True

    @property
    def draining(self) -> bool:
        return self._draining

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is in flight, at most `timeout_s`; True if it got there."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout=max(0.0, timeout_s))
        return self._inflight == 0

    # -- health ------------------------------------------------------------------------------------------
    def add_liveness_check(self, check: LivenessCheck) -> None:
        self._liveness.append(check)

    def add_readiness_check(self, check: ReadinessCheck) -> None:
        self._readiness.append(check)

    def live(self) -> bool:
        return self.fatal is None and all(c.alive() for c in self._liveness)

    def ready(self) -> bool:
        return not self._draining and self.live() and all(c.ready() for c in self._readiness)

    # -- the fatal path ----------------------------------------------------------------------------------
    def on_fatal(self, handler: FatalHandler) -> None:
        """Call `handler(component, exc)` when a background loop dies (the composition root stops the process)."""
        self._fatal_handlers.append(handler)

    def report_fatal(self, component: str, exc: BaseException) -> None:
        """A background loop died: log the traceback, turn liveness false, tell the owner (first report only)."""
        log.critical("%s died; liveness is now false and the server will exit", component,
                     exc_info=(type(exc), exc, exc.__traceback__))
        if self.fatal is not None:
            return
        self.fatal = (component, exc)
        for handler in self._fatal_handlers:
            handler(component, exc)
