"""Compressed request bodies against a real `headroom serve`: tritonclient's `request_compression_algorithm`.

tritonclient.http (sync and aio) gzips or zlib-deflates the whole infer body and sends `Content-Encoding`, with
`Inference-Header-Content-Length` counting the uncompressed JSON; the gateway decodes it before anything reads
the body. Also: a zip bomb is a 413 with the server's memory bound by `--max-body-mb` (and the server fine
afterwards), an OpenAI `/v1/embeddings` request with a gzip body, and gRPC's own compression (grpcio decodes it).
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.http.aio as tha

from tests.server.conftest import build_test_repository
from tests.support.server import TRUST_PYTHON, RunningServer, run_server

MODELS = Path(__file__).resolve().parents[2] / "models"
MAX_BODY_MB = 8
MiB = 1024 * 1024
X = np.array([[1.0, 2.0], [3.0, -4.5]], dtype=np.float32)
TEXT = np.array([[b"hello"], [b"\xffbytes"]], dtype=object)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = build_test_repository(tmp_path_factory.mktemp("compression-repo"))
    (repo / "minilm").symlink_to(MODELS / "minilm", target_is_directory=True)  # for /v1/embeddings
    args = [*TRUST_PYTHON, "--model", "echo", "--model", "text", "--model", "minilm",
            "--max-body-mb", str(MAX_BODY_MB)]
    with run_server(repo, tmp_path_factory.mktemp("compression-logs"), args) as running:
        yield running


def _inputs(mod: Any, binary: bool = True) -> list[Any]:
    x = mod.InferInput("x", list(X.shape), "FP32")
    x.set_data_from_numpy(X, binary_data=binary) if mod is th else x.set_data_from_numpy(X)
    return [x]


def _text(mod: Any) -> list[Any]:
    t = mod.InferInput("text", list(TEXT.shape), "BYTES")
    t.set_data_from_numpy(TEXT)
    return [t]


ALGORITHMS = ["gzip", "deflate"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("binary", [True, False])
def test_sync_http_client_compressed_infer(srv: RunningServer, algorithm: str, binary: bool) -> None:
    with th.InferenceServerClient(srv.http_target) as client:
        result = client.infer("echo", _inputs(th, binary), request_compression_algorithm=algorithm)
        np.testing.assert_array_equal(result.as_numpy("y"), X * 2)
        np.testing.assert_array_equal(result.as_numpy("batch"), [[2], [2]])
        # headroom answers uncompressed (HTTP lets a server ignore Accept-Encoding); the client copes
        result = client.infer("text", _text(th), request_compression_algorithm=algorithm,
                              response_compression_algorithm=algorithm)
        assert result.as_numpy("upper").tolist() == [[b"HELLO"], [b"\xffBYTES"]]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_aio_http_client_compressed_infer(srv: RunningServer, algorithm: str) -> None:
    client = tha.InferenceServerClient(srv.http_target)
    try:
        result = await client.infer("echo", _inputs(th), request_compression_algorithm=algorithm,
                                    response_compression_algorithm=algorithm)
        np.testing.assert_array_equal(result.as_numpy("y"), X * 2)
        result = await client.infer("text", _text(th), request_compression_algorithm=algorithm)
        assert result.as_numpy("upper").tolist() == [[b"HELLO"], [b"\xffBYTES"]]
    finally:
        await client.close()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_grpc_compression_is_decoded_by_grpcio(srv: RunningServer, algorithm: str) -> None:
    with tg.InferenceServerClient(srv.grpc_target) as client:
        result = client.infer("echo", _inputs(tg), compression_algorithm=algorithm)
        np.testing.assert_array_equal(result.as_numpy("y"), X * 2)


def test_embeddings_with_a_gzip_body(srv: RunningServer) -> None:
    doc = {"model": "minilm", "input": ["The quick brown fox.", "hi"]}
    plain = httpx.post(srv.url + "/v1/embeddings", json=doc, timeout=30)
    packed = httpx.post(srv.url + "/v1/embeddings", content=gzip.compress(json.dumps(doc).encode()),
                        headers={"content-type": "application/json", "content-encoding": "gzip"}, timeout=30)
    assert packed.status_code == 200, packed.text
    assert [d["embedding"] for d in packed.json()["data"]] == [d["embedding"] for d in plain.json()["data"]]
    assert packed.json()["usage"] == plain.json()["usage"]


def _bomb(zeros_mb: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + 15)
    block = bytes(MiB)
    return b"".join(packer.compress(block) for _ in range(zeros_mb)) + packer.flush()


def _status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def test_a_zip_bomb_is_413_and_the_server_stays_healthy(srv: RunningServer) -> None:
    bomb = _bomb(200)  # 200 MB of zeros in ~200 KB
    pid = srv.process.pid
    try:  # reset the server's peak RSS (Linux clear_refs 5) so the peak below is this request's
        Path(f"/proc/{pid}/clear_refs").write_bytes(b"5")
        baseline = _status_bytes(pid, "VmRSS")
    except OSError:
        baseline = _status_bytes(pid, "VmHWM")
    r = httpx.post(srv.url + "/v2/models/echo/infer", content=bomb,
                   headers={"content-type": "application/json", "content-encoding": "gzip"}, timeout=30)
    growth = _status_bytes(pid, "VmHWM") - baseline
    print(f"server: {len(bomb)} B bomb -> {r.status_code}; peak RSS growth {growth / MiB:.1f} MiB")
    assert r.status_code == 413 and r.headers["connection"] == "close"
    assert r.json() == {
        "error": f"the request body (Content-Encoding: gzip) decompresses to more than the limit of "
                 f"{MAX_BODY_MB * MiB} bytes; send less, or raise the server's body limit (--max-body-mb)",
        "reason": "payload_too_large"}
    assert growth < 50 * MiB
    assert httpx.get(srv.url + "/v2/health/ready").status_code == 200 and srv.alive()
    with th.InferenceServerClient(srv.http_target) as client:
        np.testing.assert_array_equal(
            client.infer("echo", _inputs(th), request_compression_algorithm="gzip").as_numpy("y"), X * 2)


def test_unsupported_and_corrupt_encodings_are_400(srv: RunningServer) -> None:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}).encode()
    url = srv.url + "/v2/models/echo/infer"
    r = httpx.post(url, content=body, headers={"content-encoding": "br"})
    assert r.status_code == 400 and r.json()["reason"] == "unsupported" and "gzip, deflate" in r.json()["error"]
    r = httpx.post(url, content=gzip.compress(body)[:-8], headers={"content-encoding": "gzip"})
    assert r.status_code == 400 and "Content-Encoding: gzip" in r.json()["error"]
    r = httpx.post(url, content=zlib.compress(body), headers={"content-encoding": "deflate"})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 4.0]
    r = httpx.post(url, content=body, headers={"content-encoding": "identity"})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 4.0]
