"""profile_decode.py measures what `headroom serve` runs: its default OpenMP environment is the CLI's."""

from __future__ import annotations

from benchmarks.llm.profile_decode import OMP_DEFAULTS
from headroom.cli.main import OPENMP_DEFAULTS


def test_profile_runs_with_the_servers_openmp_defaults() -> None:
    assert OMP_DEFAULTS == OPENMP_DEFAULTS
