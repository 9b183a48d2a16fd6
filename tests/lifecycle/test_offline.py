"""Static inference: offline predictions stored by input hash answer online requests with the online result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from headroom.lifecycle.offline import PredictionLookup, PredictionStore, input_key, run_offline
from headroom.models.builtin.digits_build import DigitsTrainingConfig, held_out_split
from headroom.models.repository import LoadedModel, ModelRepository
from headroom.models.warmup import run_pipeline


@pytest.fixture(scope="module")
def digits(digits_repo: Path) -> LoadedModel:
    repo = ModelRepository(digits_repo)
    (loaded,) = repo.load(repo.scan(["digits"]))
    return loaded


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    """Held-out digits as wire inputs [N, 1, 8, 8] (0..16)."""
    _, _, x_test, _ = held_out_split(DigitsTrainingConfig())
    return x_test[:, None].astype(np.float32)


def test_input_key_depends_on_everything_that_identifies_a_request() -> None:
    x = np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8)
    base = input_key("digits", "1", {"input": x})
    assert base == input_key("digits", "1", {"input": x.copy()})
    assert base != input_key("digits", "2", {"input": x})
    assert base != input_key("other", "1", {"input": x})
    assert base != input_key("digits", "1", {"input": x.astype(np.float64)})
    assert base != input_key("digits", "1", {"input": x.reshape(1, 64)})
    text = np.array([[b"ab"], [b"c"]], dtype=object)
    assert input_key("m", "1", {"text": text}) != input_key("m", "1", {"text": np.array([[b"a"], [b"bc"]], object)})


def test_offline_run_uses_the_largest_batches_and_skips_what_is_stored(
    digits: LoadedModel, images: np.ndarray, tmp_path: Path
) -> None:
    store = PredictionStore(tmp_path / "p.sqlite")
    progress: list[tuple[int, int]] = []
    report = run_offline(
        digits.model, "digits", "1", {"input": images}, store, on_progress=lambda d, t: progress.append((d, t))
    )
    n = len(images)
    assert (report.items, report.computed, report.skipped) == (n, n, 0)
    assert report.batch_size == digits.config.max_batch_size == 32
    assert report.batches == -(-n // 32) and progress[-1] == (n, n)
    assert store.count("digits") == n
    again = run_offline(digits.model, "digits", "1", {"input": images}, store)
    assert (again.computed, again.skipped, again.batches) == (0, n, 0)
    with pytest.raises(ValueError, match="batch_size"):
        run_offline(digits.model, "digits", "1", {"input": images}, store, batch_size=64)


def test_cached_hits_equal_online_results(digits: LoadedModel, images: np.ndarray, tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    writer = PredictionStore(path)
    run_offline(digits.model, "digits", "1", {"input": images[:200]}, writer)
    writer.close()
    store = PredictionStore(path)  # reopened: the predictions persisted
    registry = CollectorRegistry()
    lookup = PredictionLookup(store, "digits", "1", registry=registry)

    for i in range(0, 200, 7):
        request = {"input": images[i : i + 1]}
        cached = lookup.lookup(request)
        online = run_pipeline(digits.model, request)
        assert cached is not None
        np.testing.assert_allclose(cached["probabilities"], online["probabilities"], rtol=1e-5, atol=1e-7)
        assert np.argmax(cached["probabilities"]) == np.argmax(online["probabilities"])
    several = {"input": images[10:14]}  # a 4-row request hits when all 4 rows are stored
    cached = lookup.lookup(several)
    assert cached is not None and cached["probabilities"].shape == (4, 10)
    np.testing.assert_allclose(cached["probabilities"], run_pipeline(digits.model, several)["probabilities"], atol=1e-6)

    assert lookup.lookup({"input": images[250:251]}) is None  # never computed offline
    assert lookup.lookup({"input": images[198:202]}) is None  # partly stored -> the whole request is a miss
    assert lookup.lookup({"input": images[0:1]}) is not None
    hits = -(-200 // 7) + 2
    assert (lookup.hits, lookup.misses) == (hits, 2)
    assert lookup.hit_rate == pytest.approx(hits / (hits + 2))
    assert registry.get_sample_value("headroom_precomputed_lookups_total", {"model": "digits", "result": "hit"}) == hits
    assert registry.get_sample_value("headroom_precomputed_lookups_total", {"model": "digits", "result": "miss"}) == 2


def test_another_version_does_not_see_these_predictions(digits: LoadedModel, images: np.ndarray) -> None:
    store = PredictionStore(":memory:")
    run_offline(digits.model, "digits", "1", {"input": images[:5]}, store)
    assert PredictionLookup(store, "digits", "2").lookup({"input": images[:1]}) is None
    assert PredictionLookup(store, "digits", "1").lookup({"input": images[:1]}) is not None
