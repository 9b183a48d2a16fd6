"""A tenant's LLM-token bucket holds over gRPC as over HTTP, through a real `headroom serve` with an API key and
`--llm-tokens-per-s`: a gRPC ModelInfer on the LLM reserves its estimate (prompt characters / 4 + max_tokens) when
its message is read and settles with what it generated, so gRPC is no way around the limit, and both transports
draw on one bucket. Before, the gRPC interceptor charged requests only: LLM tokens over gRPC were free."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str]]:
    tmp = tmp_path_factory.mktemp("llm-tokens")
    keys_file = tmp / "keys.yaml"
    out = subprocess.run([sys.executable, "-m", "headroom.cli.main", "keys", "create", "--tenant", "acme",
                          "--keys-file", str(keys_file)], capture_output=True, text=True, check=True)
    key = next(tok for tok in out.stdout.split() if tok.startswith("hr_"))
    args = ["--model", "smollm2", "--api-keys-file", str(keys_file), "--llm-tokens-per-s", "0.01",
            "--llm-token-burst", "150"]
    with run_server(REPO, tmp, args) as srv:
        yield srv, key


def _infer(server: RunningServer, key: str, max_tokens: int) -> str:
    text = tg.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hi"], dtype=object))
    result = tg.InferenceServerClient(server.grpc_target).infer(
        "smollm2", [text], parameters={"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
        headers={"x-api-key": key})
    return str(result.as_numpy("text_output")[0])


def test_grpc_llm_calls_draw_on_the_tenants_llm_token_bucket(limited: tuple[RunningServer, str]) -> None:
    server, key = limited
    with pytest.raises(InferenceServerException) as never:  # 601 tokens can never fit a burst of 150
        _infer(server, key, 600)
    assert never.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT) and "ever spend" in never.value.message()
    assert _infer(server, key, 100)  # 1 + 100 of 150 reserved, all 100 generated: 49 left
    with pytest.raises(InferenceServerException) as over:
        _infer(server, key, 100)
    assert over.value.status() == str(grpc.StatusCode.RESOURCE_EXHAUSTED), over.value
    assert "LLM tokens rate limit" in over.value.message()
    # one bucket for both transports: HTTP is over the limit too
    r = httpx.post(server.url + "/v1/completions", headers={"x-api-key": key}, timeout=60.0,
                   json={"model": "smollm2", "prompt": "hi", "max_tokens": 100})
    assert r.status_code == 429 and "retry-after" in r.headers, r.text
    assert _infer(server, key, 40)  # a smaller one still fits what is left
