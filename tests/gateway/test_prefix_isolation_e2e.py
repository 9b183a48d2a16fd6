"""Tenant isolation of the LLM prefix cache through a real `headroom serve` with two API keys: tenant B sending
tenant A's prompt gets no cached tokens, and a `cache_salt` splits one tenant's cache the same way. Over gRPC
ModelInfer too (tritonclient, the key in the metadata): the call runs as its key's tenant, so it shares that tenant's
cache with its HTTP requests and nobody else's (seen on the server's prefix-cache hit counter)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from prometheus_client.parser import text_string_to_metric_families

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
    with run_server(REPO, tmp, ["--model", "smollm2", "--api-keys-file", str(keys_file)]) as srv:
        yield srv, key_a, key_b


def _cached_tokens(server: RunningServer, key: str, **extra: Any) -> int:
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 1, "temperature": 0, **extra}  # extra may set prompt
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


def _prefix_hits(server: RunningServer) -> float:
    page = httpx.get(server.url + "/metrics", timeout=30.0).text
    return sum(sample.value for family in text_string_to_metric_families(page) for sample in family.samples
               if sample.name == "headroom_llm_prefix_cache_hits_total")


def _grpc_hits(server: RunningServer, key: str, prompt: str) -> float:
    """Prefix-cache hits (tokens) of one gRPC ModelInfer of `prompt` as `key`'s tenant."""
    before = _prefix_hits(server)
    text = tg.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    client = tg.InferenceServerClient(server.grpc_target)
    result = client.infer("smollm2", [text], parameters={"max_tokens": 1, "temperature": 0},
                          headers={"authorization": f"Bearer {key}"})
    assert result.as_numpy("text_output") is not None
    return _prefix_hits(server) - before


def test_grpc_calls_run_as_their_keys_tenant_in_the_prefix_cache(keyed_llm: tuple[RunningServer, str, str]) -> None:
    server, key_a, key_b = keyed_llm
    prompt = "Tenant A's private gRPC context: the vault combination is 31-4-15. " * 6
    _grpc_hits(server, key_a, prompt)
    assert _grpc_hits(server, key_a, prompt) >= 96  # A's repeat over gRPC hits A's cache
    assert _grpc_hits(server, key_b, prompt) == 0  # B probing A's gRPC prompt learns nothing
    assert _grpc_hits(server, key_b, prompt) >= 96  # B's own repeat hits B's cache
    # one tenant, one cache across transports: A's HTTP request hits what A's gRPC call cached
    assert _cached_tokens(server, key_a, prompt=prompt) >= 96
