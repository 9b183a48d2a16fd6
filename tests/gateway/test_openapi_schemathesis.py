"""schemathesis against the served /openapi.json: no 5xx, responses conform to the document.

Two targets: a real `headroom serve` subprocess on a temp repository of Python models, and the same HTTP app
behind the gateway with auth on (requests carry a key). Bounded: a fixed number of cases per operation,
deterministic generation, no shrinking.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.gateway.conftest import GatewayServer
from tests.server.conftest import build_test_repository
from tests.support.server import TRUST_PYTHON, run_server

SCHEMATHESIS = shutil.which("schemathesis", path=str(Path(sys.executable).parent))


def schemathesis(
    url: str, cwd: Path, checks: str, extra: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    assert SCHEMATHESIS is not None, "schemathesis is a dev dependency: pip install -e '.[dev]'"
    cmd = [
        SCHEMATHESIS,
        "run",
        f"{url}/openapi.json",
        "--checks",
        checks,
        "--max-examples",
        "6",
        "--phases",
        "coverage,fuzzing",
        "--generation-deterministic",
        "--no-shrink",
        "--workers",
        "1",
        "--request-timeout",
        "20",
        *extra,
    ]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=240)


def test_headroom_serve_conforms_to_its_openapi(tmp_path: Path) -> None:
    repo = build_test_repository(tmp_path / "repo")
    with run_server(repo, tmp_path, ["--model-control-mode", "explicit", *TRUST_PYTHON]) as server:
        result = schemathesis(
            server.url,
            tmp_path,
            "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance",
        )
        assert server.alive()
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


@pytest.mark.usefixtures("keyed_server")
def test_gateway_fronted_server_has_no_server_errors(keyed_server: GatewayServer, tmp_path: Path) -> None:
    key = keyed_server.keys["admin"]
    result = schemathesis(
        keyed_server.url,
        tmp_path,
        "not_a_server_error,response_schema_conformance",
        ["--header", f"Authorization: Bearer {key}"],
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert key not in keyed_server.log()
