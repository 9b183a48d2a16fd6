"""The gateway: authentication, per-tenant rate limits, input limits, TLS/CORS settings and tracing.

Everything here sits in front of `headroom.server.http_app` as plain ASGI (see
`headroom.gateway.app.wrap_app`), so the server mounts it without changes to its handlers. TLS settings for
uvicorn and gRPC: `headroom.gateway.tls`.
"""
