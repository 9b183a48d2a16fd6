"""TLS round trips with a freshly generated CA and server certificate: HTTPS (uvicorn) and gRPC (grpc.aio)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from pathlib import Path

import grpc
import httpx
import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from headroom.gateway.app import GatewaySetup, wrap_app
from headroom.gateway.tls import TlsConfig, grpc_server_credentials, https_scheme, uvicorn_ssl_kwargs
from tests.support.server import free_port


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_pki(tmp: Path) -> tuple[Path, Path, Path]:
    """(CA cert, server cert, server key) PEM files; the server cert is valid for 127.0.0.1 and localhost."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("headroom test CA"))
        .issuer_name(_name("headroom test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return ca_path, cert_path, key_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"hello": request.state.tenant, "scheme": request.url.scheme})


async def test_https_round_trip_verified_against_the_generated_ca(pki: tuple[Path, Path, Path]) -> None:
    ca, cert, key = pki
    tls = TlsConfig(cert, key)
    app = wrap_app(Starlette(routes=[Route("/hello", hello)]), GatewaySetup())
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", **uvicorn_ssl_kwargs(tls)
        )
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        url = f"{https_scheme(tls)}://127.0.0.1:{port}/hello"
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca))) as client:
            r = await client.get(url)
        assert r.status_code == 200 and r.json() == {"hello": "anonymous", "scheme": "https"}
        async with httpx.AsyncClient(verify=True) as client:  # the system CAs do not know our CA
            with pytest.raises(httpx.ConnectError):
                await client.get(url)
    finally:
        server.should_exit = True
        await task


async def test_grpc_tls_round_trip(pki: tuple[Path, Path, Path]) -> None:
    ca, cert, key = pki

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"echo:" + request

    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port("127.0.0.1:0", grpc_server_credentials(TlsConfig(cert, key)))
    await server.start()
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as channel:
            reply = await channel.unary_unary("/test.Echo/Call")(b"ping", timeout=10)
        assert reply == b"echo:ping"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:  # plaintext is not served
            with pytest.raises(grpc.aio.AioRpcError):
                await channel.unary_unary("/test.Echo/Call")(b"ping", timeout=5)
    finally:
        await server.stop(0)


def test_tls_config_checks_files(tmp_path: Path, pki: tuple[Path, Path, Path]) -> None:
    _, cert, key = pki
    with pytest.raises(ValueError, match="--tls-keyfile"):
        TlsConfig(cert, tmp_path / "missing.key")
    assert uvicorn_ssl_kwargs(None) == {}
    mutual = uvicorn_ssl_kwargs(TlsConfig(cert, key, client_ca_file=cert))
    assert mutual["ssl_cert_reqs"] == ssl.CERT_REQUIRED and mutual["ssl_ca_certs"] == str(cert)
