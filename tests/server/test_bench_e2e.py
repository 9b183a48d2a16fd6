"""`headroom bench` end to end against a real `headroom serve`: V2 HTTP, V2 gRPC, image, OpenAI embeddings
and chat. Behaviour only (every request answered, stages and server metrics read); speed lives in benchmarks/."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = ["--model", "digits", "--model", "minilm", "--model", "smollm2"]
    with run_server(REPO, tmp_path_factory.mktemp("bench"), args) as srv:
        yield srv


def bench(target: str, out: Path, *args: str) -> dict[str, object]:
    cmd = [sys.executable, "-m", "headroom.cli.main", "bench", "run", target, "--duration", "2", "--rate", "5",
           "--confidence", "0", "--late-threshold-ms", "2000", "--quiet", "--json", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(json.loads(out.read_text()))


def _ok(result: dict[str, object], *, streaming: bool = False, stages: bool = True) -> None:
    counts = result["counts"]
    assert isinstance(counts, dict)
    assert counts["completed"] >= 5 and counts["errors"] == 0, counts
    latency = result["latency_ms"]
    assert isinstance(latency, dict) and latency["p99_ms"] > 0
    if stages:  # the server's Server-Timing breakdown was read
        assert result["server_timing_ms"], result["server_timing_ms"]
    if streaming:
        ttft = result["ttft_ms"]
        assert isinstance(ttft, dict) and ttft["p50_ms"] > 0


@pytest.mark.parametrize(("protocol", "model", "extra"), [
    ("v2-http", "digits", []),
    ("v2-grpc", "digits", []),
    ("v2-http", "minilm", ["--workload", "sentences"]),
    ("v2-grpc", "minilm", ["--workload", "sentences"]),
    ("openai-embeddings", "minilm", []),
    ("openai-chat", "smollm2", ["--max-tokens", "4"]),
])
def test_bench_against_headroom(served: RunningServer, tmp_path: Path, protocol: str, model: str,
                                extra: list[str]) -> None:
    target = served.grpc_target if protocol == "v2-grpc" else served.url
    result = bench(target, tmp_path / "r.json", "-m", model, "-p", protocol, *extra)
    _ok(result, streaming=protocol == "openai-chat", stages=protocol not in ("openai-chat", "v2-grpc"))


def test_bench_image_route(served: RunningServer, tmp_path: Path) -> None:
    result = bench(f"{served.url}/v2/models/digits/classify", tmp_path / "img.json", "-m", "digits",
                   "-p", "image")
    _ok(result)
