"""The shipped repository (native SmolLM2, onnxruntime digits and minilm) is served by the real `headroom serve`
without ever importing torch (importing it costs 1.4-1.9 s of CPU: most of a cold start on a small machine)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.support.server import run_server
from tests.support.torch_watch_serve import MARKER

REPO = Path(__file__).resolve().parents[2] / "models"


def test_the_default_repository_serves_without_torch(tmp_path: Path) -> None:
    with run_server(REPO, tmp_path, ["--grpc-port", "-1"], module="tests.support.torch_watch_serve") as srv:
        client = OpenAI(base_url=srv.url + "/v1", api_key="unused")
        messages = [{"role": "user", "content": "Name a colour."}]
        greedy = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=4,  # type: ignore[arg-type]
                                                temperature=0, logprobs=True, top_logprobs=2)
        sampled = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=4,  # type: ignore[arg-type]
                                                 temperature=0.8, top_p=0.9, seed=5)
        assert greedy.choices[0].message.content and sampled.choices[0].message.content
        emb = httpx.post(srv.url + "/v1/embeddings", json={"model": "minilm", "input": ["hello world"]}, timeout=60)
        assert emb.status_code == 200 and len(emb.json()["data"][0]["embedding"]) == 384
        process = srv.process
    assert process.returncode is not None
    lines = [line for line in srv.log().splitlines() if line.startswith(MARKER)]
    if not lines:
        pytest.fail(f"the server did not exit cleanly (no {MARKER} line):\n{srv.log()[-3000:]}")
    assert lines[-1] == f"{MARKER}False"
