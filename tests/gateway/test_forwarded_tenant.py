"""The tenant a router forwards (`headroom.gateway.forwarded_tenant`): the router drops a client's claim and adds
its own; a replica believes the header only when told to trust it and has no API keys of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from headroom.gateway.auth import KeyStore, create_key
from headroom.gateway.forwarded_tenant import TENANT_HEADER, claimed_tenant, forwarded_headers
from headroom.gateway.middleware import GatewayConfig, GatewayMiddleware
from tests.gateway.test_middleware import call, scope


def test_the_router_drops_the_clients_claim_and_adds_its_own() -> None:
    client = [("content-type", "application/json"), ("X-Headroom-Tenant", "victim"), ("connection", "close")]
    out = forwarded_headers(client, frozenset({"connection"}), "acme")
    assert out == (("content-type", "application/json"), (TENANT_HEADER, "acme"))
    assert forwarded_headers(client, frozenset(), "") == (("content-type", "application/json"),
                                                          ("connection", "close"))


@pytest.mark.parametrize(("raw", "tenant"), [(b"acme", "acme"), (b"team-7.prod_a", "team-7.prod_a"), (None, None),
                                             (b"", None), (b"a\nb", None), (b"-lead", None), (b"x" * 65, None),
                                             (b"caf\xe9", None)])
def test_a_replica_accepts_only_tenant_names(raw: bytes | None, tenant: str | None) -> None:
    assert claimed_tenant(raw) == tenant


async def _tenant_seen(config: GatewayConfig, headers: list[tuple[bytes, bytes]], keys: KeyStore | None = None) -> str:
    seen: dict[str, Any] = {}

    async def app(sc: Any, receive: Any, send: Any) -> None:
        seen.update(sc["state"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    status, _, _, _ = await call(GatewayMiddleware(app, config, keys), scope("/v1/completions", headers=headers))
    assert status == 200
    return str(seen["tenant"])


async def test_a_replica_believes_the_header_only_when_trusting_and_keyless(tmp_path: Path) -> None:
    claim = [(TENANT_HEADER.encode(), b"acme")]
    assert await _tenant_seen(GatewayConfig(trust_tenant_header=True), claim) == "acme"
    assert await _tenant_seen(GatewayConfig(), claim) == "anonymous"  # the default: a client's claim is ignored
    assert await _tenant_seen(GatewayConfig(trust_tenant_header=True), [(TENANT_HEADER.encode(), b"a b")]) \
        == "anonymous"
    keys_file = tmp_path / "keys.yaml"
    key = create_key(keys_file, "ops")
    keyed = GatewayConfig(auth_enabled=True, trust_tenant_header=True)
    with_key = [(b"authorization", f"Bearer {key}".encode()), *claim]
    assert await _tenant_seen(keyed, with_key, KeyStore.from_file(keys_file)) == "ops"  # its own keys win
