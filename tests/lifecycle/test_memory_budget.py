"""Memory budget: the pure LRU policy, and the cache around it on a fake clock and with real models."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from headroom.core.clock import FakeClock
from headroom.core.errors import Overloaded
from headroom.lifecycle.memory_budget import ModelCache, ResidentModel, model_size_bytes, plan_eviction
from headroom.models.builtin.digits import predict_digits
from headroom.models.builtin.digits_build import DigitsTrainingConfig, held_out_split
from headroom.models.repository import LoadedModel, ModelRepository

MB = 1 << 20


def _resident(*specs: tuple[str, int, float]) -> list[ResidentModel]:
    return [ResidentModel(name, size * MB, used) for name, size, used in specs]


def test_nothing_is_evicted_while_the_request_fits() -> None:
    resident = _resident(("a", 3, 1.0), ("b", 3, 2.0))
    assert plan_eviction(resident, (), "c", 4 * MB, 10 * MB).evict == ()
    assert plan_eviction(resident, (), "a", 9 * MB, 1 * MB).fits  # already resident: nothing to do


def test_least_recently_used_go_first_and_only_as_many_as_needed() -> None:
    resident = _resident(("a", 3, 5.0), ("b", 3, 1.0), ("c", 3, 3.0))
    decision = plan_eviction(resident, (), "d", 4 * MB, 10 * MB)
    assert decision.fits and decision.evict == ("b",)
    decision = plan_eviction(resident, (), "d", 7 * MB, 10 * MB)
    assert decision.evict == ("b", "c")


def test_pinned_models_are_never_evicted() -> None:
    resident = _resident(("a", 3, 5.0), ("b", 3, 1.0), ("c", 3, 3.0))
    assert plan_eviction(resident, {"b"}, "d", 4 * MB, 10 * MB).evict == ("c",)
    refused = plan_eviction(resident, {"a", "b"}, "d", 5 * MB, 10 * MB)
    assert not refused.fits and refused.evict == () and "pin fewer" in refused.reason
    too_big = plan_eviction([], (), "huge", 11 * MB, 10 * MB)
    assert not too_big.fits and "whole budget" in too_big.reason


class FakeLoader:
    """Loads take `load_s_per_mb` seconds of fake time per MB; records loads and unloads."""

    def __init__(self, clock: FakeClock, sizes: dict[str, int]) -> None:
        self.clock, self.sizes = clock, sizes
        self.events: list[str] = []

    def load(self, name: str) -> str:
        self.clock.advance(0.5 * self.sizes[name] / MB)
        self.events.append(f"+{name}")
        return f"model:{name}"

    def unload(self, name: str, model: str) -> None:
        assert model == f"model:{name}"
        self.events.append(f"-{name}")


def test_cache_swaps_in_on_demand_and_measures_the_swap_in_time() -> None:
    clock = FakeClock()
    sizes = {"a": 4 * MB, "b": 4 * MB, "c": 2 * MB, "p": 2 * MB}
    loader = FakeLoader(clock, sizes)
    registry = CollectorRegistry()
    cache = ModelCache(loader.load, loader.unload, sizes.__getitem__, 10 * MB, clock, pinned={"p"}, registry=registry)

    for name in ["p", "a", "b", "a", "c", "b", "a"]:
        assert cache.get(name) == f"model:{name}"
        assert cache.stats().resident_bytes <= 10 * MB
        clock.advance(1.0)

    # p,a,b fill 10 MB; c evicts the LRU unpinned (b); b then evicts a; a then evicts c (older than b)
    assert loader.events == ["+p", "+a", "+b", "-b", "+c", "-a", "+b", "-c", "+a"]
    stats = cache.stats()
    assert stats.hits == 1
    assert [s.model for s in stats.swap_ins] == ["p", "a", "b", "c", "b", "a"]
    assert [s.duration_s for s in stats.swap_ins] == [1.0, 2.0, 2.0, 1.0, 2.0, 2.0]
    assert stats.swap_ins[3].evicted == ("b",)
    assert {m.name for m in stats.resident} == {"p", "b", "a"}
    assert registry.get_sample_value("headroom_model_swap_in_seconds_count", {"model": "b"}) == 2
    assert registry.get_sample_value("headroom_model_swap_in_seconds_sum", {"model": "b"}) == 4.0
    assert registry.get_sample_value("headroom_model_evictions_total", {"model": "b"}) == 1
    assert registry.get_sample_value("headroom_model_resident_bytes") == 10 * MB
    cache.close()
    assert cache.stats().resident == ()


def test_cache_refuses_a_model_that_cannot_fit() -> None:
    clock = FakeClock()
    sizes = {"p": 8 * MB, "x": 4 * MB}
    loader = FakeLoader(clock, sizes)
    cache = ModelCache(loader.load, loader.unload, sizes.__getitem__, 10 * MB, clock, pinned={"p"})
    cache.get("p")
    with pytest.raises(Overloaded, match="pin fewer models"):
        cache.get("x")
    assert loader.events == ["+p"]


def test_real_models_under_a_small_budget_serve_every_request_correctly(digits_repo: Path, tmp_path: Path) -> None:
    names = ["digits_a", "digits_b", "digits_c"]
    for name in names:
        shutil.copytree(digits_repo / "digits", tmp_path / name)
    size = model_size_bytes(tmp_path / "digits_a" / "1")
    repo = ModelRepository(tmp_path)

    def load(name: str) -> LoadedModel:
        (loaded,) = repo.load(repo.scan([name]))
        return loaded

    clock = FakeClock()
    cache = ModelCache(load, lambda _, m: m.unload(), lambda n: model_size_bytes(tmp_path / n / "1"), 2 * size, clock)
    _, _, x_test, y_test = held_out_split(DigitsTrainingConfig())
    reference = None
    for step, name in enumerate(["digits_a", "digits_b", "digits_c", "digits_a", "digits_c", "digits_b"]):
        rows = slice(step * 20, step * 20 + 20)
        predicted = predict_digits(cache.get(name), x_test[rows])
        assert (predicted == y_test[rows]).mean() >= 0.85
        assert len(cache.stats().resident) <= 2
        if reference is None:
            reference = predicted
        clock.advance(1.0)
    # a, b load; c evicts a; a evicts b; c is resident (a hit that refreshes it); b evicts a
    assert [(s.model, s.evicted) for s in cache.stats().swap_ins] == [
        ("digits_a", ()),
        ("digits_b", ()),
        ("digits_c", ("digits_a",)),
        ("digits_a", ("digits_b",)),
        ("digits_b", ("digits_a",)),
    ]
    assert cache.stats().hits == 1
    np.testing.assert_array_equal(predict_digits(cache.get("digits_b"), x_test[:20]), reference)
    cache.close()
