"""Time a request spent before the data plane (HTTP parsing, a busy event loop) counts against its deadline and
latency budget: on a fake clock, a real DataPlane with the test repository's `slow` model (no batching window)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from headroom.core.clock import FakeClock
from headroom.core.errors import DeadlineExceeded
from headroom.core.types import InferenceRequest, Tensor
from headroom.models.repository import ModelRepository
from headroom.server.dataplane import DataPlane
from headroom.server.metrics import ServerMetrics
from headroom.server.served import ServedVersion
from tests.server.conftest import build_test_repository, seen_tags

NOW_S = 1000.0


@pytest.fixture()
async def plane(tmp_path: Path) -> AsyncIterator[tuple[DataPlane, Path]]:
    root = build_test_repository(tmp_path)
    repo = ModelRepository(root)
    dataplane = DataPlane(ServerMetrics(CollectorRegistry()), FakeClock(NOW_S))
    for loaded in await repo.load_async(repo.scan(["slow"])):
        dataplane.add(ServedVersion(name=loaded.name, version=loaded.version, config=loaded.config,
                                    model=loaded.model, version_dir=loaded.version_dir))
    yield dataplane, root
    await dataplane.stop()


def _slow(tag: int, timeout_ms: float, received_s: float | None) -> InferenceRequest:
    inputs = (Tensor("delay_ms", "FP32", (1, 1), np.zeros((1, 1), np.float32)),
              Tensor("tag", "INT64", (1, 1), np.full((1, 1), tag, np.int64)))
    return InferenceRequest(request_id=f"r{tag}", model_name="slow", model_version="", inputs=inputs,
                            timeout_ms=timeout_ms, received_s=received_s)


async def test_time_at_the_edge_counts_against_the_deadline(plane: tuple[DataPlane, Path]) -> None:
    dataplane, root = plane
    with pytest.raises(DeadlineExceeded):  # arrived 200 ms ago with a 100 ms timeout: never executed
        await dataplane.infer(_slow(1, 100.0, NOW_S - 0.2))
    late_but_in_time = await dataplane.infer(_slow(2, 100.0, NOW_S - 0.05))
    assert late_but_in_time.timings.total_ms == pytest.approx(50.0)  # the edge's 50 ms are in the total
    fresh = await dataplane.infer(_slow(3, 100.0, None))  # no edge time known: counted from the data plane
    assert fresh.timings.total_ms == pytest.approx(0.0)
    assert 1 not in seen_tags(root) and {2, 3} <= set(seen_tags(root))


async def test_an_edge_time_after_the_data_planes_clock_is_ignored(plane: tuple[DataPlane, Path]) -> None:
    dataplane, _ = plane
    response = await dataplane.infer(_slow(4, 100.0, NOW_S + 5.0))  # never later than the data plane's now
    assert response.timings.total_ms == pytest.approx(0.0)
