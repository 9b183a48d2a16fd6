"""Tenant isolation of the LLM prefix cache through a real `headroom serve` with two API keys: tenant B sending
tenant A's prompt gets no cached tokens, and a `cache_salt` splits one tenant's cache the same way."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[2] / "models"
# ~10 blocks of 16 tokens: what a tenant's system prompt looks like to the cache.
PROMPT = "You are the support assistant of ACME Corp. Secret internal note: the launch code is 7421. " * 6


def _create_key(keys_file: Path, tenant: str) -> str:
    out = subprocess.run([sys.executable, "-m", "headroom.cli.main", "keys", "create", "--tenant", tenant,
                          "--role", "user", "--keys-file", str(keys_file)], capture_output=True, text=True,
                         check=True)
    return next(tok for tok in out.stdout.split() if tok.startswith("hr_"))


@pytest.fixture(scope="module")
def keyed_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str, str]]:
    tmp = tmp_path_factory.mktemp("llm-tenants")
    keys_file = tmp / "keys.yaml"
    key_a, key_b = _create_key(keys_file, "tenant-a"), _create_key(keys_file, "tenant-b")
    with run_server(REPO, tmp, ["--model", "smollm2", "--grpc-port", "-1", "--api-keys-file", str(keys_file)]) as srv:
        yield srv, key_a, key_b


def _cached_tokens(server: RunningServer, key: str, **extra: Any) -> int:
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 1, "temperature": 0, **extra}
    r = httpx.post(server.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                   timeout=120.0)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] > 100
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def test_a_tenant_never_hits_another_tenants_prefix_cache(keyed_llm: tuple[RunningServer, str, str]) -> None:
    server, key_a, key_b = keyed_llm
    _cached_tokens(server, key_a)  # tenant A's prompt is now cached (for tenant A)
    assert _cached_tokens(server, key_a) >= 96  # A's own repeat hits its cache
    assert _cached_tokens(server, key_b) == 0  # B probing A's prompt learns nothing
    assert _cached_tokens(server, key_b) >= 96  # B's own repeat hits B's cache


def test_a_cache_salt_splits_one_tenants_cache(keyed_llm: tuple[RunningServer, str, str]) -> None:
    server, key_a, _ = keyed_llm
    _cached_tokens(server, key_a)
    assert _cached_tokens(server, key_a, cache_salt="user-1-secret") == 0
    assert _cached_tokens(server, key_a, cache_salt="user-1-secret") >= 96
    assert _cached_tokens(server, key_a, cache_salt="user-2-secret") == 0


def test_an_empty_cache_salt_is_a_400_naming_the_field(keyed_llm: tuple[RunningServer, str, str]) -> None:
    server, key_a, _ = keyed_llm
    for salt in ("", 7, "x" * 1025):
        r = httpx.post(server.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key_a}"},
                       json={"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                             "cache_salt": salt}, timeout=60.0)
        assert r.status_code == 400, r.text
        assert "cache_salt" in r.json()["error"]["message"]
