"""The tenant a router forwards to its replicas, so that tenant isolation of the LLM prefix cache holds behind
`headroom route` / `serve --replicas`.

The router authenticates the client (API keys are checked once, at the router) and sends the replica the
tenant it established in `x-headroom-tenant`, after dropping any such header the client sent. A replica
believes the header only when it was started with `--trust-tenant-header` (its gateway config's
`trust_tenant_header`) and runs without API keys of its own: then the header names the tenant that scopes
the prefix cache, rate limits and logs, exactly as an API key's tenant would on a single server. Replicas
that `serve --replicas` and `route --replicas` start listen on loopback and get the flag; a replica that
other clients can reach must not (a client could then claim any tenant).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from headroom.gateway.auth import TENANT_RE

TENANT_HEADER = "x-headroom-tenant"


def forwarded_headers(headers: Iterable[tuple[str, str]], dropped: Collection[str],
                      tenant: str) -> tuple[tuple[str, str], ...]:
    """Router side: the request headers to send a replica, without `dropped` (lower-case names) or the
    client's own tenant header, plus the router's `tenant` (none when empty)."""
    out = tuple((k, v) for k, v in headers if k.lower() not in dropped and k.lower() != TENANT_HEADER)
    return (*out, (TENANT_HEADER, tenant)) if tenant else out


def claimed_tenant(value: bytes | None) -> str | None:
    """Replica side: the tenant a trusted router named (None when the header is absent or not a tenant name;
    the request then counts as the anonymous tenant)."""
    if value is None:
        return None
    text = value.decode("latin-1")
    return text if TENANT_RE.match(text) else None
