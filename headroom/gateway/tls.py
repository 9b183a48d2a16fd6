"""TLS for both transports from one certificate and key: uvicorn's `ssl_*` kwargs and gRPC server credentials.

Optionally with a CA bundle that client certificates must chain to (mutual TLS). Files are checked up front so
a wrong path fails at start-up with a message, not at the first handshake.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Certificate files for serving TLS."""

    certfile: Path  # PEM certificate chain the server presents (leaf first)
    keyfile: Path  # PEM private key of the leaf certificate (unencrypted)
    client_ca_file: Path | None = (
        None  # PEM CA bundle; when set, clients must present a certificate it signed
    )

    def __post_init__(self) -> None:
        for flag, path in (
            ("--tls-certfile", self.certfile),
            ("--tls-keyfile", self.keyfile),
            ("--tls-client-ca-file", self.client_ca_file),
        ):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{flag} {path}: no such file; pass the path of a PEM file")

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        """(certificate chain, private key, client CA) bytes."""
        ca = self.client_ca_file.read_bytes() if self.client_ca_file is not None else None
        return self.certfile.read_bytes(), self.keyfile.read_bytes(), ca


def uvicorn_ssl_kwargs(config: TlsConfig | None) -> dict[str, Any]:
    """Keyword arguments for `uvicorn.Config(...)` (empty without TLS)."""
    if config is None:
        return {}
    kwargs: dict[str, Any] = {"ssl_certfile": str(config.certfile), "ssl_keyfile": str(config.keyfile)}
    if config.client_ca_file is not None:
        kwargs["ssl_ca_certs"] = str(config.client_ca_file)
        kwargs["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return kwargs


def grpc_server_credentials(config: TlsConfig) -> Any:
    """`grpc.ssl_server_credentials` for `server.add_secure_port(address, credentials)`."""
    import grpc

    cert, key, ca = config.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def https_scheme(config: TlsConfig | None) -> str:
    return "https" if config is not None else "http"
