"""Tenant isolation of the LLM prefix cache behind a real `headroom route` (API keys at the router) in front of
a real `headroom serve` replica: the router forwards the tenant it authenticated, so tenant B sending tenant
A's prompt gets no cached tokens, and a client cannot claim another tenant through the router."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.reliability.common import stop as stop_process
from tests.gateway.test_prefix_isolation_e2e import _create_key
from tests.support.server import free_port

REPO = Path(__file__).resolve().parents[2] / "models"
# ~10 blocks of 16 tokens, different from tests/gateway/test_prefix_isolation_e2e.py's prompt
PROMPT = "You are the billing assistant of Initech. Internal note, never reveal: the vault PIN is 5150. " * 6


@pytest.fixture(scope="module")
def keyed_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    tmp = tmp_path_factory.mktemp("router-tenants")
    keys_file = tmp / "keys.yaml"
    key_a, key_b = _create_key(keys_file, "tenant-a"), _create_key(keys_file, "tenant-b")
    port = free_port()
    log_path = tmp / "route.log"
    cmd = [sys.executable, "-m", "headroom.cli.main", "route", "--replicas", "1", "--port", str(port),
           "--grpc-port", "-1", "--model-repository", str(REPO), "--model", "smollm2",
           "--api-keys-file", str(keys_file), "--drain-timeout-s", "5"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240.0
        while True:  # bounded poll of the router's readiness (a replica ready behind it)
            assert proc.poll() is None, f"router exited:\n{log_path.read_text(errors='replace')}"
            try:
                if httpx.get(url + "/v2/health/ready", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"router not ready:\n{log_path.read_text(errors='replace')}"
            time.sleep(0.2)
        yield url, key_a, key_b
    finally:
        stop_process(proc, grace_s=60.0)


def _cached_tokens(url: str, key: str, prompt: str = PROMPT, **headers: str) -> int:
    body: dict[str, Any] = {"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}", **headers},
                   timeout=120.0)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] > 100
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def test_tenants_behind_the_router_never_share_the_replicas_prefix_cache(keyed_router: tuple[str, str, str]) -> None:
    url, key_a, key_b = keyed_router
    _cached_tokens(url, key_a)  # tenant A's prompt is now cached on the replica, for tenant A
    assert _cached_tokens(url, key_a) >= 96  # A's repeat hits its own cache through the router
    assert _cached_tokens(url, key_b) == 0  # B probing A's prompt learns nothing (was ~all cached before)
    assert _cached_tokens(url, key_b) >= 96  # B's own repeat hits B's cache


def test_a_client_cannot_claim_another_tenant_through_the_router(keyed_router: tuple[str, str, str]) -> None:
    url, key_a, key_b = keyed_router
    prompt = PROMPT.replace("billing", "payroll")
    _cached_tokens(url, key_a, prompt)
    assert _cached_tokens(url, key_a, prompt) >= 96
    # B names tenant A in the header the router forwards: the router drops it and sends its own verdict
    assert _cached_tokens(url, key_b, prompt, **{"x-headroom-tenant": "tenant-a"}) == 0
