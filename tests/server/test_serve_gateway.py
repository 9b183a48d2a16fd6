"""`headroom serve` with the gateway turned on by its flags: API keys over HTTP and gRPC, admin-only
management, per-tenant rate limits. (The gateway's own behaviour is tested in tests/gateway/.)"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from tests.support.server import TRUST_PYTHON, run_server

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}


def _create_key(keys_file: Path, tenant: str, role: str) -> str:
    out = subprocess.run([sys.executable, "-m", "headroom.cli.main", "keys", "create", "--tenant", tenant,
                          "--role", role, "--keys-file", str(keys_file)], capture_output=True, text=True, check=True)
    return next(tok for tok in out.stdout.split() if tok.startswith("hr_"))


def test_api_keys_roles_and_rate_limits_through_headroom_serve(test_repo: Path, tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.yaml"
    user = _create_key(keys_file, "acme", "user")
    admin = _create_key(keys_file, "ops", "admin")
    assert user not in keys_file.read_text()  # only hashes are stored
    args = ["--model", "echo", "--api-keys-file", str(keys_file), "--rate-limit-rps", "2",
            "--rate-limit-burst", "3", *TRUST_PYTHON]
    with run_server(test_repo, tmp_path, args) as srv:
        url = f"{srv.url}/v2/models/echo/infer"
        assert httpx.get(srv.url + "/v2/health/ready").status_code == 200  # health needs no key
        anonymous = httpx.post(url, json=BODY)
        assert anonymous.status_code == 401 and anonymous.json()["reason"] == "unauthenticated"
        ok = httpx.post(url, json=BODY, headers={"Authorization": f"Bearer {user}"})
        assert ok.status_code == 200, ok.text
        forbidden = httpx.post(srv.url + "/v2/repository/models/echo/unload",
                               headers={"Authorization": f"Bearer {user}"})
        assert forbidden.status_code == 403
        statuses = [httpx.post(url, json=BODY, headers={"X-API-Key": user}).status_code for _ in range(8)]
        assert 429 in statuses  # burst of 3 at 2/s
        limited = next(r for r in (httpx.post(url, json=BODY, headers={"X-API-Key": user}) for _ in range(5))
                       if r.status_code == 429)
        assert "Retry-After" in limited.headers
        # Another tenant is not affected by acme's bucket.
        assert httpx.post(url, json=BODY, headers={"X-API-Key": admin}).status_code == 200

        client = triton_grpc.InferenceServerClient(srv.grpc_target)
        inp = triton_grpc.InferInput("x", [1, 2], "FP32")
        inp.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
        with pytest.raises(InferenceServerException) as denied:
            client.infer("echo", [inp])
        assert "UNAUTHENTICATED" in str(denied.value.status())
        result = client.infer("echo", [inp], headers={"authorization": f"Bearer {admin}"})
        np.testing.assert_array_equal(result.as_numpy("y"), [[2.0, 4.0]])
        assert user not in srv.log() and admin not in srv.log()


def _read_until_closed(sock: socket.socket, limit_s: float) -> bytes:
    sock.settimeout(limit_s)
    chunks = []
    while True:
        chunk = sock.recv(65536)  # raises TimeoutError if the server never hangs up
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def test_slow_headers_get_408_and_the_connection_closed(test_repo: Path, tmp_path: Path) -> None:
    """Slowloris before the body: half a request line and one header, then silence; and a connection that
    never sends anything. Both are answered 408 and closed by the server; a prompt request still works."""
    with run_server(test_repo, tmp_path, ["--model", "echo", "--headers-timeout-s", "1", *TRUST_PYTHON]) as srv:
        with socket.create_connection(("127.0.0.1", srv.http_port)) as slow:
            slow.sendall(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n")
            received = _read_until_closed(slow, 30.0)
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), received[:200]
        assert "slow client" in json.loads(body)["error"]
        with socket.create_connection(("127.0.0.1", srv.http_port)) as silent:
            assert _read_until_closed(silent, 30.0).startswith(b"HTTP/1.1 408")
        # a kept-alive connection: the deadline applies per request, not to the whole connection
        with httpx.Client(base_url=srv.url) as client:
            assert client.post("/v2/models/echo/infer", json=BODY).status_code == 200
            time.sleep(1.5)  # longer than the headers deadline, shorter than uvicorn's keep-alive (5 s)
            assert client.post("/v2/models/echo/infer", json=BODY).status_code == 200
        assert httpx.get(srv.url + "/v2/health/ready").status_code == 200
