"""Profile files: batch-size tables with interpolation, the linear model, LLM sections, built-ins."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from headroom.sim.profile import Jitter, ServiceProfile, builtin_profiles, load_profile, resolve_profile


def test_table_profile_interpolates_and_extrapolates(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: t\nservice_ms: {1: 5.0, 4: 7.2, 8: 9.1}\n")
    p = load_profile(path)
    assert p.mean_service_s(1) == pytest.approx(0.005)
    assert p.mean_service_s(4) == pytest.approx(0.0072)
    assert p.mean_service_s(6) == pytest.approx((0.0072 + 0.0091) / 2)
    assert p.mean_service_s(12) == pytest.approx(0.0091 + (0.0091 - 0.0072) / 4 * 4)
    assert p.distribution == "deterministic"


def test_linear_profile_and_json_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"linear": {"fixed_ms": 5, "per_item_ms": 0.6, "max_batch_size": 32},
                                "distribution": "exponential"}))
    p = load_profile(path)
    assert p.mean_service_s(1) == pytest.approx(0.0056)
    assert p.mean_service_s(32) == pytest.approx(0.0242)
    back = tmp_path / "back.json"
    back.write_text(json.dumps(p.to_json()))
    assert load_profile(back).mean_service_s(16) == pytest.approx(p.mean_service_s(16))


def test_llm_section_derives_static_batch_times() -> None:
    p = resolve_profile("llm_8b_gpu")
    assert p.llm is not None
    assert p.llm.step_s(8) == pytest.approx(0.013)
    # A static batch runs to its longest sequence: more sequences, longer batch.
    assert p.mean_service_s(16) > p.mean_service_s(1) > p.llm.output_tokens * p.llm.step_s(1)


def test_builtins_load() -> None:
    names = builtin_profiles()
    assert {"resnet50_v100", "llm_8b_gpu", "cpu_small"} <= set(names)
    for name in names:
        resolve_profile(name)


def test_bad_profiles_say_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="built-ins"):
        resolve_profile(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("service_ms: {0: 5}\n")
    with pytest.raises(ValueError, match="batch sizes >= 1"):
        load_profile(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("name: x\n")
    with pytest.raises(ValueError, match="service_ms"):
        load_profile(empty)
    with pytest.raises(ValueError, match="distribution"):
        ServiceProfile((1,), (0.01,), distribution="weird")


def test_jitter_has_mean_one() -> None:
    for dist, cv in (("exponential", 1.0), ("lognormal", 0.5)):
        j = Jitter(dist, cv, np.random.default_rng(0), block=1000)
        draws = np.array([j.draw() for _ in range(20_000)])
        assert draws.mean() == pytest.approx(1.0, abs=0.03)
        assert draws.std() == pytest.approx(cv, rel=0.1)
    assert Jitter("deterministic", 0.0, np.random.default_rng(0)).draw() == 1.0
