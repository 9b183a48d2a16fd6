"""The runner's CPU thread choice."""

from __future__ import annotations

from headroom.llm.runner import cpu_threads


def test_cpu_threads_auto_is_one_on_small_machines_and_explicit_wins() -> None:
    assert cpu_threads(0, 2) == 1  # a 2-core box: never an OpenMP team as wide as the machine
    assert cpu_threads(0, 1) == 1
    assert cpu_threads(0, 16) == 0  # larger machines: torch's default
    assert cpu_threads(3, 2) == 3  # an explicit value is used as given
