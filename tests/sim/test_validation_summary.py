"""benchmarks/sim_validation/summarise.py: medians over repeated validation runs and the verdict on them."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.support.scripts import load_script


def _module() -> ModuleType:
    return load_script("benchmarks/sim_validation/summarise.py")


def _run(errors: list[tuple[float, float]], passes: bool) -> dict[str, Any]:
    loads = []
    for (load, judged), (e50, e99) in zip(((0.3, True), (0.7, True), (0.9, False)), errors, strict=True):
        loads.append({"load_fraction": load, "judged": judged, "rate_per_s": 100 * load,
                      "pass": (abs(e50) <= 0.15 and abs(e99) <= 0.15) if judged else None,
                      "rel_error": {"p50": e50, "p99": e99},
                      "real": {"p50_ms": 20.0, "p99_ms": 50.0, "utilisation": load,
                               "server_usage": {"slowdown_at_load": 1.0}},
                      "sim": {"p50_ms": 20.0 * (1 + e50), "p99_ms": 50.0 * (1 + e99), "utilisation": load}})
    return {"model": "m", "config": {"target_rel_error": 0.15, "load_basis": "utilisation"},
            "environment": {"command_line": "headroom sim --validate", "load_average": [1.0, 1.0, 1.0]},
            "simulated": {"service_time_scale": 1.05}, "loads": loads, "verdict": {"pass": passes}}


def test_the_verdict_is_on_the_median_error_of_each_judged_load() -> None:
    runs = [_run([(0.05, -0.10), (0.20, 0.30), (0.9, 0.9)], False),  # misses at 70 %
            _run([(0.02, 0.01), (0.04, -0.05), (0.5, 0.5)], True),
            _run([(-0.03, 0.12), (0.10, -0.40), (0.6, -0.2)], False)]  # misses at 70 % the other way
    summary = _module().summarise(runs, ["a.json", "b.json", "c.json"])
    first, second, reported = summary["loads"]
    assert first["median_rel_error_p50"] == pytest.approx(0.02) and first["median_rel_error_p99"] == pytest.approx(0.01)
    assert second["median_rel_error_p50"] == pytest.approx(0.10)
    assert second["median_rel_error_p99"] == pytest.approx(-0.05)
    assert first["runs_passing"] == 3 and second["runs_passing"] == 1
    assert reported["median_pass"] is None and reported["runs_passing"] is None  # above the judged range
    assert summary["verdict_on_medians"] is True  # every judged median within 15 %, though two runs missed
    assert [r["verdict"] for r in summary["runs"]] == [False, True, False]


def test_a_median_outside_the_target_fails_and_mismatched_runs_are_refused() -> None:
    runs = [_run([(0.0, 0.0), (0.2, 0.2), (0.0, 0.0)], False), _run([(0.0, 0.0), (0.3, 0.1), (0.0, 0.0)], False)]
    assert _module().summarise(runs, ["a", "b"])["verdict_on_medians"] is False  # 70 % p50 median 25 %
    other = _run([(0.0, 0.0), (0.0, 0.0), (0.0, 0.0)], True)
    other["loads"][0]["load_fraction"] = 0.4
    with pytest.raises(ValueError, match="same loads"):
        _module().summarise([runs[0], other], ["a", "b"])
