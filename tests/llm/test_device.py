"""Device and dtype choice without torch (`headroom.llm.device`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from headroom.llm import device
from headroom.llm.config import EngineConfig


def test_a_gpu_is_only_looked_for_where_a_driver_device_file_exists(tmp_path: Path) -> None:
    assert not device.gpu_driver_present((str(tmp_path / "nvidia0"),))
    (tmp_path / "nvidia0").write_text("")
    assert device.gpu_driver_present((str(tmp_path / "nvidia0"),))


def test_cpu_and_auto_without_a_driver_resolve_without_asking_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "gpu_driver_present", lambda paths=device.GPU_DEVICE_FILES: False)
    assert device.resolve_placement(EngineConfig(device="auto")) == device.Placement("cpu", "float32")
    assert device.resolve_placement(EngineConfig(device="cpu", dtype="bfloat16")) == device.Placement("cpu", "bfloat16")
    assert device.resolve_placement(EngineConfig(device="cuda")) == device.Placement("cuda", "bfloat16")
