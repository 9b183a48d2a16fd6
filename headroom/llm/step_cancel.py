"""`StepCancel`: stop the engine step in flight once every request in it has been aborted.

A step is one native C call (`hr_native_step`), up to ~1 s with prefill chunks. When every client of that step
went away, finishing it only delays freeing their KV blocks and refreshing the gauges. The engine thread says
which requests a step carries (`begin`) and that it ended (`end`); any thread (the event loop, when a stream is
closed) says that a request is being aborted (`request_abort`), before or during the step. Once every request of
the step in flight is being aborted the flag that the C step reads between layers is set: the step returns early
(`StepCancelled`), the engine discards it, and the queued aborts free the blocks at once. The engine thread
drops a request from the aborting set when it handles its abort (`forget`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterable


class StepCancelled(Exception):
    """The runner stopped the step early because `StepCancel` asked it to: its outputs do not exist."""


class StepCancel:
    """The cancel flag of the step in flight, set once all its requests are being aborted (thread-safe)."""

    def __init__(self) -> None:
        self._flag = ctypes.c_int(0)  # read by the C step with an atomic load between layers
        self._lock = threading.Lock()  # orders the sets below against each other
        self._in_flight: frozenset[str] = frozenset()  # user-visible ids of the step running now
        self._aborting: set[str] = set()  # ids whose abort was asked and not yet handled by the engine thread
        self.steps_cancelled = 0  # steps that a runner reported as cancelled (engine thread)

    @property
    def flag_address(self) -> int:
        """The address of the C `int` flag (valid while this object lives)."""
        return ctypes.addressof(self._flag)

    @property
    def requested(self) -> bool:
        """Whether the flag is set for the step in flight."""
        return bool(self._flag.value)

    def request_abort(self, request_id: str) -> None:
        """A request is being aborted (its abort command is queued): cancel the step if it was the last one."""
        with self._lock:
            self._aborting.add(request_id)
            self._update()

    def forget(self, request_id: str) -> None:
        """The engine thread handled the request's abort."""
        with self._lock:
            self._aborting.discard(request_id)

    def begin(self, request_ids: Iterable[str]) -> None:
        """A step carrying these requests starts (the flag is set at once if all of them are being aborted)."""
        with self._lock:
            self._in_flight = frozenset(request_ids)
            self._flag.value = 0
            self._update()

    def end(self, cancelled: bool) -> None:
        """The step in flight returned (`cancelled`: early, because of the flag)."""
        with self._lock:
            self._in_flight = frozenset()
            self._flag.value = 0
        self.steps_cancelled += cancelled

    def _update(self) -> None:
        if self._in_flight and self._in_flight <= self._aborting:
            self._flag.value = 1
