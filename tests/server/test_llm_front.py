"""An LLM directory added to the repository after start (server/llm_front.py), through a real `headroom serve`:
poll mode picks it up without a restart (and a second one beside it: dispatch by `model`, both in `/metrics`),
explicit mode loads it with tritonclient; the server stays ready meanwhile. Clients: tritonclient (HTTP and gRPC),
the `openai` SDK, plain HTTP for `/metrics`."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.support.server import RunningServer, run_server

MODELS = Path(__file__).resolve().parents[2] / "models"
PROMPT = "One, two, three,"


def _until(check: Callable[[], bool], what: str, srv: RunningServer, timeout_s: float = 240.0) -> None:
    """Poll `check()` (each call a request to the server) until true, at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)  # between polls of a condition, not a wait for one
    raise AssertionError(f"{what} did not happen within {timeout_s} s; server log:\n{srv.log()[-3000:]}")


def _repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    shutil.copytree(MODELS / "digits", repo / "digits")
    return repo


def _add_llm(repo: Path, name: str, served: str) -> None:
    config = yaml.safe_load((MODELS / "smollm2" / "config.yaml").read_text())
    config["parameters"].update(served_model_name=served, kv_cache_memory_mb=48, warmup_tokens=1)
    (repo / f".{name}").mkdir()  # written complete, then renamed: the poller never sees half a directory
    (repo / f".{name}" / "config.yaml").write_text(yaml.safe_dump(config))
    (repo / f".{name}").rename(repo / name)


def _prompt() -> list[tg.InferInput]:
    inp = tg.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
    return [inp]


def _chat(client: openai.OpenAI, model: str) -> str:
    out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a colour."}],
                                         max_tokens=4, temperature=0)
    return out.choices[0].message.content or ""


def test_poll_mode_serves_llm_directories_added_after_start(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    args = ["--model-control-mode", "poll", "--repository-poll-secs", "0.2"]
    with run_server(repo, tmp_path, args) as srv:
        http, rpc = th.InferenceServerClient(srv.http_target), tg.InferenceServerClient(srv.grpc_target)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.NotFoundError) as err:  # no LLM yet: OpenAI's 404
            _chat(client, "smollm2")
        assert err.value.response.json()["error"]["code"] == "model_not_found"
        not_llm = httpx.post(srv.url + "/v2/models/digits/generate", json={"text_input": "x"}, timeout=60)
        assert not_llm.status_code == 400 and "not a generative model" in not_llm.text

        _add_llm(repo, "smollm2", "smollm2")
        _until(lambda: http.is_model_ready("smollm2"), "serving the added LLM", srv)
        assert http.is_server_ready() and http.is_model_ready("digits")
        text = bytes(rpc.infer("smollm2", _prompt(), parameters={"max_tokens": 3, "temperature": 0.0})
                     .as_numpy("text_output")[0]).decode()
        generated = httpx.post(srv.url + "/v2/models/smollm2/generate", timeout=60,
                               json={"text_input": PROMPT, "parameters": {"max_tokens": 3, "temperature": 0}})
        assert text and generated.json()["text_output"] == text
        first = _chat(client, "smollm2")
        assert first

        _add_llm(repo, "second", "smollm2-b")  # a second LLM beside the first: dispatch by model, one /metrics
        _until(lambda: http.is_model_ready("second"), "serving the second LLM", srv)
        assert _chat(client, "smollm2-b") == first == _chat(client, "smollm2")  # same weights, greedy
        assert {m.id for m in client.models.list().data} == {"smollm2", "smollm2-b"}
        with pytest.raises(openai.NotFoundError):
            _chat(client, "nope")
        families = {f.name: f for f in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text)}
        for name in ("vllm:e2e_request_latency_seconds", "headroom_llm_e2e_request_latency_seconds"):
            models = {s.labels["model_name"] for s in families[name].samples}
            assert models == {"smollm2", "smollm2-b"}, (name, models)
        index = {r["name"]: r["state"] for r in http.get_model_repository_index()}
        assert index == {"digits": "READY", "smollm2": "READY", "second": "READY"}
        assert srv.alive()


def test_explicit_mode_loads_an_llm_directory_added_after_start(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    with run_server(repo, tmp_path, ["--model-control-mode", "explicit", "--load-model", "digits"]) as srv:
        http, rpc = th.InferenceServerClient(srv.http_target), tg.InferenceServerClient(srv.grpc_target)
        _add_llm(repo, "smollm2", "smollm2")
        assert not http.is_model_ready("smollm2")  # explicit: nothing loads by itself
        rpc.load_model("smollm2")
        assert http.is_model_ready("smollm2") and http.is_server_ready()
        out = rpc.infer("smollm2", _prompt(), parameters={"max_tokens": 2, "temperature": 0.0})
        assert bytes(out.as_numpy("text_output")[0]).decode()
        rpc.unload_model("smollm2")
        assert not http.is_model_ready("smollm2")
        assert httpx.post(srv.url + "/v1/completions", timeout=60,
                          json={"model": "smollm2", "prompt": "hi"}).status_code == 404
        http.load_model("smollm2")  # and back, through the HTTP client
        assert http.is_model_ready("smollm2") and srv.alive()
        _add_llm(repo, "copy", "smollm2")  # the same OpenAI name twice: refused, nothing left behind
        with pytest.raises(InferenceServerException, match="served_model_name 'smollm2' is already served"):
            http.load_model("copy")
        assert not http.is_model_ready("copy") and http.is_model_ready("smollm2") and http.is_server_ready()


def test_merged_registries_expose_one_family_per_name() -> None:
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    from headroom.server.llm_front import MergedRegistries

    main, merged = CollectorRegistry(), MergedRegistries()
    main.register(merged)
    for model in ("a", "b"):
        own = CollectorRegistry()
        Counter("tokens", "Tokens.", ["model_name"], registry=own).labels(model).inc(2)
        merged.add(own)
    text = generate_latest(main).decode()
    assert text.count("# TYPE tokens_total counter") == 1  # one family, both models' samples in it
    family = next(f for f in text_string_to_metric_families(text) if f.name == "tokens")
    totals = {s.labels["model_name"]: s.value for s in family.samples if s.name == "tokens_total"}
    assert totals == {"a": 2.0, "b": 2.0}
