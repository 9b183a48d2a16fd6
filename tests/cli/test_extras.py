"""The product is lean: `headroom serve` imports no bench-only dependency, and a command whose optional extra is
missing says how to install it instead of failing with a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from headroom.cli import main as cli_main

BENCH_ONLY = ("matplotlib", "plotly", "tritonclient", "aiohttp", "hdrh")


def loaded_at_serve_start(names: tuple[str, ...]) -> str:
    """Which of `names` a fresh interpreter has loaded after importing what `headroom serve` imports."""
    code = (
        "import sys, headroom.cli.serve, headroom.server.app, headroom.llm.factory, headroom.llm.http\n"
        f"print(','.join(m for m in {names!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip()


def test_serve_import_graph_has_no_bench_dependency() -> None:
    assert loaded_at_serve_start(BENCH_ONLY) == ""


#: imported on first use, not at `headroom serve` start (issue 16: cold start)
NOT_AT_START = ("headroom.sim", "headroom.dashboard.playground", "opentelemetry.sdk", "headroom.llm.quality")


def test_serve_start_defers_what_serving_the_default_models_does_not_need() -> None:
    assert loaded_at_serve_start(NOT_AT_START) == ""


def test_every_bench_only_module_maps_to_the_bench_extra() -> None:
    assert set(BENCH_ONLY) <= set(cli_main.OPTIONAL_MODULES)
    assert {cli_main.OPTIONAL_MODULES[m] for m in BENCH_ONLY} == {"bench"}


def test_missing_extra_at_import_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "hdrh" or m.startswith("hdrh.")] + ["hdrh"]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it (or a submodule) now raises
    for name in [m for m in sys.modules if m.startswith(("headroom.cli.bench", "headroom.loadgen"))]:
        monkeypatch.delitem(sys.modules, name)
    result = CliRunner().invoke(cli_main.app, ["bench", "run", "--rate", "5"])
    assert result.exit_code == 2
    assert "pip install 'headroom[bench]'" in result.output
    listing = CliRunner().invoke(cli_main.app, ["--help"])
    assert listing.exit_code == 0 and "bench" in listing.output


def test_a_missing_required_module_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    monkeypatch.delitem(sys.modules, "headroom.cli.build_models", raising=False)
    with pytest.raises(ModuleNotFoundError):
        cli_main.load_subcommand("build-models")


def test_missing_extra_at_use_names_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # imported only when a plot is asked for
    monkeypatch.setattr(
        sys, "argv", ["headroom", "sim", "--rate", "50", "--duration", "2", "--plot", f"{tmp_path}/p.png"]
    )
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main()
    assert exit_info.value.code == 2
    assert "pip install 'headroom[bench]'" in capsys.readouterr().err
