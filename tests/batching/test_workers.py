"""ThreadWorkers: calls run on the named worker threads, results and exceptions come back to the loop's future,
`threads` calls run at once, and a shut-down pool refuses new calls."""

from __future__ import annotations

import asyncio
import threading

import pytest

from headroom.batching.workers import ThreadWorkers


async def test_results_and_exceptions_come_back_from_the_worker_thread() -> None:
    workers = ThreadWorkers(1, "unit")
    try:
        name = await workers.run(lambda: threading.current_thread().name)
        assert name == "unit_0" and name != threading.current_thread().name
        assert await workers.run(pow, 2, 10) == 1024

        def fails() -> None:
            raise ValueError("model bug")

        with pytest.raises(ValueError, match="model bug"):
            await workers.run(fails)
    finally:
        workers.shutdown()


async def test_threads_calls_run_at_once() -> None:
    workers = ThreadWorkers(2, "pair")
    both_in = threading.Barrier(2, timeout=30)  # breaks (an error) unless two calls are inside together
    try:
        first, second = await asyncio.gather(workers.run(both_in.wait), workers.run(both_in.wait))
        assert {first, second} == {0, 1}
    finally:
        workers.shutdown()


async def test_a_cancelled_wait_drops_the_result_and_the_pool_goes_on() -> None:
    workers = ThreadWorkers(1, "drop")
    gate = threading.Event()
    try:
        held = workers.run(gate.wait, 30)
        held.cancel()  # the awaiting request went away while its call ran
        gate.set()
        assert await workers.run(lambda: "next") == "next"  # the dropped result did not disturb the loop
        assert held.cancelled()
    finally:
        workers.shutdown()


async def test_shutdown_refuses_new_calls() -> None:
    workers = ThreadWorkers(1, "closed")
    assert await workers.run(lambda: 1) == 1
    workers.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        workers.run(lambda: 2)


def test_threads_must_be_positive() -> None:
    with pytest.raises(ValueError, match="threads"):
        ThreadWorkers(0, "none")
