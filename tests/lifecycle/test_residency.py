"""On-demand residency under a memory budget: shared loads, LRU eviction of idle models only, pinned kept."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from headroom.core.clock import FakeClock
from headroom.core.errors import Overloaded
from headroom.lifecycle.residency import Residency, ResidencyConfig, initial_residents

SIZES = {"a": 10, "b": 10, "c": 10, "p": 10}  # bytes; budget 25 = pinned p + one other


class Loader:
    """Records loads/unloads; a load can be held open with `gate` to observe waiting requests."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.events: list[str] = []
        self.gate: asyncio.Event | None = None

    async def load(self, name: str) -> None:
        self.events.append(f"load {name}")
        if self.gate is not None:
            await self.gate.wait()
        self.clock.advance(0.5)

    async def unload(self, name: str) -> None:
        self.events.append(f"unload {name}")


def _residency(loader: Loader, budget: int = 25, wait_timeout_s: float = 30.0,
               registry: CollectorRegistry | None = None) -> Residency:
    return Residency(SIZES, {"p"}, ResidencyConfig(budget, wait_timeout_s), loader.load, loader.unload,
                     loader.clock, registry)


def test_initial_residents_are_the_pinned_then_others_while_they_fit() -> None:
    assert initial_residents(SIZES, {"p"}, 25) == ("p", "a")
    assert initial_residents(SIZES, set(), 100) == ("a", "b", "c", "p")
    with pytest.raises(ValueError, match="pinned models"):
        initial_residents(SIZES, {"a", "b", "p"}, 25)
    with pytest.raises(ValueError, match="not in the repository"):
        initial_residents(SIZES, {"zz"}, 25)


def test_alternating_requests_swap_models_in_lru_order_and_never_evict_the_pinned() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        loader = Loader(clock)
        registry = CollectorRegistry()
        res = _residency(loader, registry=registry)
        assert not res.ready()
        assert await res.start() == ("p", "a")
        assert res.ready()
        for name in ("b", "c", "a", "a", "p"):
            async with res.use(name):
                assert res.is_resident(name) and res.resident_bytes() <= 25
        assert loader.events == ["load p", "load a", "unload a", "load b", "unload b", "load c", "unload c",
                                 "load a"]
        swaps = res.swap_ins()
        assert [(s.model, s.evicted) for s in swaps] == [("b", ("a",)), ("c", ("b",)), ("a", ("c",))]
        assert all(s.duration_s == pytest.approx(0.5) for s in swaps)
        assert registry.get_sample_value("headroom_model_swap_in_seconds_count", {"model": "b"}) == 1
        assert registry.get_sample_value("headroom_model_evictions_total", {"model": "a"}) == 1
        assert registry.get_sample_value("headroom_model_evictions_total", {"model": "p"}) is None
        assert registry.get_sample_value("headroom_model_resident_bytes") == 20

    asyncio.run(scenario())


def test_concurrent_requests_for_an_unloaded_model_share_one_load() -> None:
    async def scenario() -> None:
        loader = Loader(FakeClock())
        res = _residency(loader)
        await res.start()
        loader.gate = asyncio.Event()
        entered: list[int] = []

        async def request(i: int) -> None:
            async with res.use("b"):
                entered.append(i)

        tasks = [asyncio.create_task(request(i)) for i in range(5)]
        await asyncio.sleep(0.01)
        assert entered == [] and loader.events.count("load b") == 1  # all five wait on the same load
        loader.gate.set()
        await asyncio.gather(*tasks)
        assert sorted(entered) == [0, 1, 2, 3, 4] and loader.events.count("load b") == 1

    asyncio.run(scenario())


def test_a_model_with_requests_in_flight_is_not_evicted_until_they_finish() -> None:
    async def scenario() -> None:
        loader = Loader(FakeClock())
        res = _residency(loader)
        await res.start()
        release = asyncio.Event()
        order: list[str] = []

        async def long_request_on_a() -> None:
            async with res.use("a"):
                order.append("a running")
                await release.wait()
                order.append("a done")

        async def request_for_b() -> None:
            async with res.use("b"):
                order.append("b running")

        first = asyncio.create_task(long_request_on_a())
        await asyncio.sleep(0.01)
        second = asyncio.create_task(request_for_b())
        await asyncio.sleep(0.01)
        assert order == ["a running"] and "unload a" not in loader.events  # b waits: a is busy
        release.set()
        await asyncio.gather(first, second)
        assert order == ["a running", "a done", "b running"]
        assert loader.events.index("unload a") > 0

    asyncio.run(scenario())


def test_a_model_too_big_for_the_pinned_budget_is_refused_and_busy_models_time_out() -> None:
    async def scenario() -> None:
        loader = Loader(FakeClock())
        res = Residency({"p": 10, "big": 20}, {"p"}, ResidencyConfig(25), loader.load, loader.unload, loader.clock)
        await res.start()
        with pytest.raises(Overloaded, match="pinned"):
            async with res.use("big"):
                pass
        assert res.is_resident("p") and loader.events == ["load p"]

        res2 = _residency(Loader(FakeClock()), wait_timeout_s=0.05)
        await res2.start()
        hold = asyncio.Event()

        async def busy_a() -> None:
            async with res2.use("a"):
                await hold.wait()

        task = asyncio.create_task(busy_a())
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded, match="stayed busy"):
            async with res2.use("c"):
                pass
        hold.set()
        await task
        async with res2.use("c"):  # once a is idle the swap goes through
            assert res2.is_resident("c") and not res2.is_resident("a")

    asyncio.run(scenario())
