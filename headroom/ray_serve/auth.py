"""API keys on a headroom Ray Serve application: `headroom serve --api-keys-file`'s behaviour.

With `api_keys_file` (a keys file from `headroom keys create`, at the same path on every Ray node, like the model
repository; empty: no keys, every request runs as the anonymous tenant, as before):

* the ingress authenticates every HTTP request it answers or forwards, except the gateway's exempt paths
  (`/v2/health/*`, `/metrics`), and every gRPC RPC except the health ones (`ServerLive`, `ServerReady`,
  `ModelReady`): the key from `Authorization: Bearer <key>` or `X-API-Key` (gRPC: the same metadata), its role
  checked against the admin paths. A refusal is `headroom serve`'s: 401 with `WWW-Authenticate` (403 for a
  missing role) and the gateway's body (OpenAI's error shape on /v1), gRPC UNAUTHENTICATED / PERMISSION_DENIED;
* the replicas run their gateway with the same keys (`replica_gateway`), so a forwarded OpenAI, generate or
  embeddings request (its headers travel in the `HttpCall`) runs as its key's tenant there: the LLM's prefix
  cache is scoped by tenant and the access log names it, as under `headroom serve`.

The file is re-read when it changes (every `keys_reload_interval_s`, 5 s): revocations need no redeploy. Rate
limits and CORS are not configurable through Serve (the replicas' gateway runs with none).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from starlette.responses import Response

from headroom.core.errors import HeadroomError
from headroom.gateway.app import GatewaySetup, gateway_setup
from headroom.gateway.asgi import error_body, presented_key
from headroom.gateway.auth import KeyStore, authorize, compile_paths, required_role
from headroom.gateway.grpc_auth import EXEMPT_RPCS, metadata_key
from headroom.gateway.middleware import GatewayConfig, exempt_matcher


def replica_gateway(api_keys_file: str) -> GatewaySetup:
    """The gateway a replica runs its HTTP app behind: the application's keys, or none."""
    return gateway_setup(Path(api_keys_file)) if api_keys_file else GatewaySetup()


class IngressAuth:
    """The ingress's key check (no keys file: everything passes). One per ingress replica."""

    def __init__(self, keys: KeyStore | None, config: GatewayConfig | None = None) -> None:
        self.keys = keys
        self.config = config or GatewayConfig(auth_enabled=keys is not None)
        self._exempt = exempt_matcher(self.config.exempt_paths)
        self._admin = compile_paths(self.config.admin_paths)
        self._checked_s = time.monotonic()

    @classmethod
    def of(cls, api_keys_file: str) -> IngressAuth:
        setup = replica_gateway(api_keys_file)
        return cls(setup.keys, setup.config)

    def http(self, path: str, headers: Sequence[tuple[bytes, bytes]]) -> Response | None:
        """The refusal of an HTTP request (as `headroom serve`'s gateway answers it), or None to serve it."""
        if self.keys is None or self._exempt(path):
            return None
        try:
            self._check(presented_key(list(headers)), path)
        except HeadroomError as exc:
            response = Response(error_body(exc, path), status_code=exc.http_status, media_type="application/json")
            if exc.http_status == 401:
                response.headers["WWW-Authenticate"] = 'Bearer realm="headroom"'
            return response
        return None

    def grpc(self, rpc: str, metadata: Sequence[tuple[str, str | bytes]] | None) -> None:
        """Raise the HeadroomError refusing a gRPC call (UNAUTHENTICATED, PERMISSION_DENIED), unless it may run."""
        if self.keys is None or rpc in EXEMPT_RPCS:
            return
        self._check(metadata_key(metadata), f"grpc:{rpc}")

    def _check(self, key: str | None, path: str) -> None:
        if self.keys is None:
            return
        now_s = time.monotonic()
        if now_s - self._checked_s >= self.config.keys_reload_interval_s:
            self._checked_s = now_s
            self.keys.reload_if_changed()
        authorize(self.keys.authenticate(key), required_role(path, self._admin))
