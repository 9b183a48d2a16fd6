"""`--model-control-mode poll`: the pure plan, fingerprints, and a real server picking up a change."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from headroom.server.repository_poll import fingerprint, poll_plan
from tests.server.conftest import build_test_repository
from tests.support.server import TRUST_PYTHON, run_server


def test_plan_loads_new_and_changed_and_unloads_removed() -> None:
    plan = poll_plan({"a": "1", "b": "1", "c": "1"}, {"a": "1", "b": "2", "d": "1"})
    assert plan.load == ("b", "d") and plan.unload == ("c",)
    assert poll_plan({"a": "1"}, {"a": "1"}).load == ()


def test_fingerprint_changes_with_config_and_version_files(tmp_path: Path) -> None:
    repo = build_test_repository(tmp_path / "repo")
    before = fingerprint(repo / "echo")
    (repo / "echo" / "2").mkdir()
    (repo / "echo" / "2" / "model.py").write_text("x = 1\n")
    assert fingerprint(repo / "echo") != before


def test_poll_mode_reloads_a_changed_model_and_refuses_the_api(tmp_path: Path) -> None:
    repo = build_test_repository(tmp_path / "repo")
    args = ["--grpc-port", "-1", "--model", "echo", "--model-control-mode", "poll", "--repository-poll-secs", "0.2",
            *TRUST_PYTHON]
    with run_server(repo, tmp_path, args) as srv:
        assert httpx.post(srv.url + "/v2/repository/models/echo/load").status_code == 503  # as Triton's POLL
        (repo / "echo" / "2").mkdir()
        (repo / "echo" / "2" / "model.py").write_text((repo / "echo" / "1" / "model.py").read_text())
        deadline = time.monotonic() + 30
        versions: list[str] = []
        while time.monotonic() < deadline and versions != ["2"]:  # polled by the server every 0.2 s
            versions = httpx.get(srv.url + "/v2/models/echo").json()["versions"]
            time.sleep(0.1)
        assert versions == ["2"], srv.log()
