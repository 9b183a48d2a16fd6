"""The entry point: every subcommand is reachable, and start-up imports only what the command needs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from headroom.cli.main import SUBCOMMANDS, app, load_subcommand


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_loads_under_its_name_and_has_help(name: str) -> None:
    command = load_subcommand(name)
    assert command.name == name
    result = CliRunner().invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_top_level_help_lists_every_subcommand_and_unknown_ones_fail() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in SUBCOMMANDS:
        assert name in result.output
    bad = CliRunner().invoke(app, ["nosuchcommand"])
    assert bad.exit_code != 0 and "No such command" in bad.output


def _imported_after(code: str, modules: tuple[str, ...]) -> list[str]:
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return [m for m in out.stdout.strip().split(",") if m]


def test_the_entry_point_imports_no_subcommand_until_one_is_used() -> None:
    heavy = ("torch", "onnxruntime", "headroom.loadgen.runner", "headroom.router.proxy", "headroom.cli.serve")
    assert _imported_after("import headroom.cli.main", heavy) == []


def test_the_server_imports_no_model_runtime_until_a_model_needs_one() -> None:
    # an LLM-only server must not pay for onnxruntime, an ONNX-only one not for torch (cold start)
    assert _imported_after("import headroom.server.app", ("torch", "onnxruntime")) == []
    loaded = _imported_after(
        "from headroom.models.backends import backend_class\nbackend_class('onnxruntime')", ("torch", "onnxruntime")
    )
    assert loaded == ["onnxruntime"]
