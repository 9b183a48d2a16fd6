"""Compute threads yield to the event loop: a model's threads run at a lower CPU priority (a higher nice value).

Under overload every core runs model work, and the event loop, which admits, rejects and answers health checks,
waits for a CPU behind it: measured at 2x minilm capacity on 2 cores, the loop spent 25-33% of its time runnable
but not running, which is what a rejection's p99 and the accepted requests' tail paid. With the model's threads at
nice 10 (CFS weight 110 against the loop's 1024) that wait fell to 7% and the rejection p99 from 11-26 ms to 6 ms
(docs/serving.md, "Where a rejection's time goes").

Linux keeps a nice value per thread, and a new thread inherits its creator's. So:

* `lower_current_thread(nice)` lowers the calling thread (the batch and preprocess workers call it first);
* `run_lowered(fn, nice)` runs `fn` in a fresh thread lowered first and returns its result: a model loaded there
  creates its runtime's thread pools (onnxruntime's intra-op pool, torch's OpenMP team) at the lower priority.

An unprivileged process can raise a thread's nice value but not lower it back, which is why loading runs in a
thread of its own. Elsewhere than Linux (where the call would lower the whole process) these are no-ops, as is
a nice value of 0. Inside a container the values order the pod's own threads only: the cgroup's CPU share
against other pods is unchanged.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

MAX_NICE = 19
DEFAULT_COMPUTE_NICE = 10


def check_nice(value: object, where: str) -> int:
    """A validated nice increment (0..19); raises ValueError naming `where`."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_NICE:
        raise ValueError(f"{where}: expected an integer from 0 (same priority as the event loop) to {MAX_NICE} "
                         f"(lowest), got {value!r}")
    return value


def lower_current_thread(nice: int) -> bool:
    """Raise the calling thread's nice value to at least `nice`; True if this thread's priority is now lowered."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        if current < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError:  # a seccomp profile may refuse it: run at the loop's priority rather than fail
        return False
    return True


def run_lowered(fn: Callable[[], T], nice: int, name: str = "lowered") -> T:
    """`fn()` in a fresh thread whose priority is lowered to `nice` first (blocking); re-raises its exception."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return fn()
    result: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        lower_current_thread(nice)
        try:
            result.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
