"""Tenant isolation of the LLM prefix cache behind a real `headroom route` (API keys at the router, policy
cache_aware) in front of two real `headroom serve` replicas: the router forwards the tenant it authenticated, so
tenant B sending tenant A's prompt gets no cached tokens, and a client cannot claim another tenant through the
router; and cache-aware routing hashes each prompt under that tenant, so a tenant's repeats go to the replica
holding its prefix (with replicas publishing only their "anonymous" tenant, it used to route them by load)."""

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
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.reliability.common import stop as stop_process
from headroom.llm.prefix_blocks import PATH, parse
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
    cmd = [sys.executable, "-m", "headroom.cli.main", "route", "--replicas", "2", "--policy", "cache_aware",
           "--port", str(port),
           "--grpc-port", "-1", "--model-repository", str(REPO), "--model", "smollm2",
           "--api-keys-file", str(keys_file), "--drain-timeout-s", "5"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240.0
        while True:  # bounded poll of the router's readiness (both replicas ready behind it)
            assert proc.poll() is None, f"router exited:\n{log_path.read_text(errors='replace')}"
            try:
                if _metric(url, "headroom_router_replicas", state="ready") == 2:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"router not ready:\n{log_path.read_text(errors='replace')}"
            time.sleep(0.2)
        yield url, key_a, key_b
    finally:
        stop_process(proc, grace_s=60.0)


def _metric(url: str, name: str, **labels: str) -> float:
    """One sample of the router's /metrics (parsed with prometheus_client); 0 when absent."""
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10.0).text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def _complete(url: str, key: str, prompt: str = PROMPT, **headers: str) -> tuple[int, str]:
    """(cached prompt tokens, the replica that answered)."""
    body: dict[str, Any] = {"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}", **headers},
                   timeout=120.0)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] > 100
    return int(usage["prompt_tokens_details"]["cached_tokens"]), r.headers["x-headroom-replica"]


def _cached_tokens(url: str, key: str, prompt: str = PROMPT, **headers: str) -> int:
    return _complete(url, key, prompt, **headers)[0]


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


def test_cache_aware_routes_a_tenant_to_the_replica_holding_its_prefix(keyed_router: tuple[str, str, str]) -> None:
    """A replica holds tenant A's prompt (sent to it directly, as the router would forward it) and publishes the
    blocks; the router hashes A's request under A too (not the replicas' "anonymous"), so it matches: a cache
    hit on that replica. Tenant B's request for the same prompt hashes to other blocks: no hit."""
    url, key_a, key_b = keyed_router
    prompt = PROMPT.replace("billing", "shipping")
    targets = httpx.get(url + "/metrics/replicas", timeout=10.0).json()  # Prometheus SD: every replica
    holder, address = targets[0]["labels"]["replica"], targets[0]["targets"][0]
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    r = httpx.post(f"http://{address}/v1/completions", json=body, headers={"x-headroom-tenant": "tenant-a"},
                   timeout=120.0)  # replicas listen on loopback and trust the router's tenant header
    assert r.status_code == 200, r.text
    # what the holder publishes now (nothing else runs meanwhile), and the router's copy of it
    own = parse(httpx.get(f"http://{address}{PATH}", timeout=10.0).content).models["smollm2"].hashes
    published = "headroom_router_cache_aware_published_blocks"
    deadline = time.monotonic() + 60.0
    while _metric(url, published, replica=holder) != len(own):  # bounded poll: the router has read its blocks
        assert time.monotonic() < deadline, "the router never saw the holder's new blocks"
        time.sleep(0.1)
    hits = "headroom_router_cache_aware_decisions_total"
    matched_tokens = "headroom_router_cache_aware_matched_tokens_total"
    before, matched = _metric(url, hits, reason="cache_hit"), _metric(url, matched_tokens)
    cached, replica = _complete(url, key_a, prompt)
    assert (replica, _metric(url, hits, reason="cache_hit")) == (holder, before + 1)
    assert cached >= 96 and _metric(url, matched_tokens) >= matched + 96
    _complete(url, key_b, prompt)  # B's blocks of the same prompt are other hashes
    assert _metric(url, hits, reason="cache_hit") == before + 1
