"""`headroom profile`'s measurement on a fake model; the document it writes is a valid simulator profile."""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from headroom.models.base import Model
from headroom.models.config import ModelConfig, TensorSpec
from headroom.profiling.measure import default_batch_sizes, measure_batch, profile_document, profile_model


class Sleepy(Model):
    """Takes 1 ms + 0.2 ms per item; counts the batch sizes it was called with."""

    def __init__(self) -> None:
        super().__init__(ModelConfig(name="sleepy", backend="python", inputs=(TensorSpec("x", "FP32", (3,)),),
                                     outputs=(TensorSpec("y", "FP32", (3,)),), max_batch_size=16))
        self.calls: list[int] = []

    def predict(self, batch: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        n = batch["x"].shape[0]
        self.calls.append(n)
        time.sleep(0.001 + 0.0002 * n)
        return {"y": batch["x"]}


def test_default_batch_sizes_are_powers_of_two_up_to_the_cap() -> None:
    assert default_batch_sizes(16) == (1, 2, 4, 8, 16)
    assert default_batch_sizes(24) == (1, 2, 4, 8, 16, 24)
    assert default_batch_sizes(0) == (1,)


def test_measure_batch_times_whole_batches_of_the_requested_size() -> None:
    model = Sleepy()
    timing = measure_batch(model, 8, repeats=4, warmup=1)
    assert model.calls == [8] * 5
    assert len(timing.times_s) == 4 and timing.mean_ms >= 1.0


def test_profile_document_is_readable_by_the_simulator() -> None:
    from headroom.sim.profile import profile_from_mapping

    model = Sleepy()
    timings = profile_model(model, (1, 4, 16), repeats=3)
    doc = profile_document("sleepy", timings, 3)
    assert set(doc["service_ms"]) == {"1", "4", "16"}  # type: ignore[call-overload]
    profile = profile_from_mapping(doc)
    assert profile.mean_service_s(16) > profile.mean_service_s(1)
    assert profile.distribution == "lognormal" and profile.cv >= 0
