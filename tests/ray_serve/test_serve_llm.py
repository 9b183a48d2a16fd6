"""The LLM (smollm2) and embeddings (minilm) on Ray Serve, end to end on a REAL local Ray cluster started by the
test, with the official openai SDK: Serve's HTTP proxy -> the ingress -> a streaming DeploymentHandle -> headroom's
own routes in an LLM replica (its engine) or a model replica (its data plane). Greedy text, streamed or not, is what
a real `headroom serve` process answers; so are the generate routes, embeddings and errors. `/metrics` merges
every replica's page, labelled per replica. Both deployments autoscale (Serve's own deployment config says so),
and a stream whose LLM replica is killed mid-answer ends with OpenAI's error event (last: it kills the replica)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton_grpc
from prometheus_client.parser import text_string_to_metric_families

from headroom.ray_serve.app import LLM_DEPLOYMENT, MODELS_DEPLOYMENT
from headroom.ray_serve.ingress import REPLICA_HEADER, STATS_PATH
from tests.ray_serve.conftest import APP, deploy
from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[2] / "models"
MESSAGES = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def served(serve_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, RunningServer]]:
    """(Serve's URL with smollm2 + minilm deployed, a `headroom serve` process serving the same models)."""
    deploy(REPO, models=["smollm2", "minilm"], router="prefix", llm_num_cpus=0.5, autoscale=True, min_replicas=1,
           max_replicas=2, llm_max_replicas=2, llm_timeout_s=120.0)
    with run_server(REPO, tmp_path_factory.mktemp("headroom"), ["--model", "smollm2", "--model", "minilm"]) as server:
        yield serve_url, server


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120.0)


def _chat(client: openai.OpenAI, stream: bool) -> str:
    if not stream:
        done = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=16, temperature=0)  # type: ignore[arg-type]
        return done.choices[0].message.content or ""
    chunks = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=16, temperature=0,  # type: ignore[arg-type]
                                            stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_chat_and_completions_through_serve_equal_headroom_serve(served: tuple[str, RunningServer]) -> None:
    serve_url, server = served
    via_serve, via_headroom = _client(serve_url), _client(server.url)
    expected = _chat(via_headroom, stream=False)
    assert expected  # greedy decoding: the same text every time, on any replica
    assert _chat(via_serve, stream=False) == expected
    assert _chat(via_serve, stream=True) == expected  # streamed chunk by chunk through Serve
    prompt = "The capital of France is"
    a = via_serve.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0)
    b = via_headroom.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text and a.usage == b.usage
    assert {m.id for m in via_serve.models.list()} == {m.id for m in via_headroom.models.list()} == {
        "smollm2", "minilm"}


def test_errors_through_serve_are_headroom_serves(served: tuple[str, RunningServer]) -> None:
    serve_url, server = served
    for url in (serve_url, server.url):
        with pytest.raises(openai.BadRequestError) as bad:  # the same validation, in OpenAI's error shape
            _client(url).chat.completions.create(model="smollm2", messages=MESSAGES, temperature=-1)  # type: ignore[arg-type]
        assert bad.value.status_code == 400 and "temperature" in str(bad.value.body)
    with httpx.Client(timeout=60.0) as http:
        unknown = [http.post(u + "/v1/chat/completions", json={"model": "gpt-9", "messages": MESSAGES})
                   for u in (serve_url, server.url)]
        assert unknown[0].status_code == unknown[1].status_code == 404
        assert unknown[0].json() == unknown[1].json()
        garbage = http.post(serve_url + "/v1/completions", content=b"{not json")
        assert garbage.status_code == 400 and garbage.json()["error"]["message"]
        assert http.get(serve_url + "/v1/chat/completions").status_code == 405
        late = http.post(serve_url + "/v1/chat/completions", json={"model": "smollm2", "messages": MESSAGES},
                         headers={"x-request-timeout-ms": "soon"})  # refused by the ingress, in OpenAI's shape
        assert late.status_code == 400 and late.json()["error"]["message"]


def test_generate_routes_and_embeddings_through_serve(served: tuple[str, RunningServer]) -> None:
    serve_url, server = served
    body = {"text_input": "The capital of France is", "parameters": {"max_tokens": 8, "temperature": 0}}
    with httpx.Client(timeout=120.0) as http:
        a = http.post(serve_url + "/v2/models/smollm2/generate", json=body)
        b = http.post(server.url + "/v2/models/smollm2/generate", json=body)
        assert a.status_code == 200 and a.json() == b.json() and a.headers[REPLICA_HEADER]
        with http.stream("POST", serve_url + "/v2/models/smollm2/generate_stream", json=body) as events:
            assert events.headers["content-type"].startswith("text/event-stream")
            texts = [json.loads(line[5:])["text_output"] for line in events.iter_lines() if line.startswith("data:")]
        assert "".join(texts) == a.json()["text_output"] and len(texts) > 1
        wrong = http.post(serve_url + "/v2/models/minilm/generate", json=body)
        assert wrong.status_code == 400 and "/infer" in wrong.json()["error"]
    texts = ["a cat sat on the mat", "quarterly revenue grew"]
    e1 = _client(serve_url).embeddings.create(model="minilm", input=texts)
    e2 = _client(server.url).embeddings.create(model="minilm", input=texts)
    assert np.allclose([d.embedding for d in e1.data], [d.embedding for d in e2.data], atol=1e-5)
    assert e1.usage.prompt_tokens == e2.usage.prompt_tokens > 0


def test_llm_metadata_and_config_through_serve_equal_headroom_serves(served: tuple[str, RunningServer]) -> None:
    """The LLM's V2 metadata and Triton config (decoupled, text_input/text_output) from the ingress's repository
    scan, as `headroom serve` answers them; an LLM has no versions (404)."""
    serve_url, server = served
    with httpx.Client(timeout=60.0) as http:
        for path in ("/v2/models/smollm2", "/v2/models/smollm2/config", "/v2/models/smollm2/ready",
                     "/v2/models/smollm2/versions/1"):
            a, b = http.get(serve_url + path), http.get(server.url + path)
            assert a.status_code == b.status_code and (a.status_code != 200 or a.json() == b.json()), (path, a.text)
        config = http.get(serve_url + "/v2/models/smollm2/config").json()
    assert config["model_transaction_policy"] == {"decoupled": True}


def test_metrics_merge_every_replicas_page_labelled_per_replica(served: tuple[str, RunningServer]) -> None:
    serve_url, _ = served
    _client(serve_url).completions.create(model="smollm2", prompt="Hello", max_tokens=2, temperature=0)
    page = httpx.get(serve_url + "/metrics", timeout=60.0)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
    samples = [s for f in text_string_to_metric_families(page.text) for s in f.samples]
    up = {(s.labels["deployment"], s.labels["replica"]): s.value for s in samples
          if s.name == "headroom_serve_replica_up"}
    assert {d for d, _ in up} == {LLM_DEPLOYMENT, MODELS_DEPLOYMENT} and all(v == 1.0 for v in up.values()), up
    llm_replica = next(r for d, r in up if d == LLM_DEPLOYMENT)
    generated = [s for s in samples if s.name == "headroom_llm_e2e_request_latency_seconds_count"
                 and s.labels["replica"] == llm_replica]
    assert generated and generated[0].value >= 1  # the engine's own families, from that replica's registry
    assert any(s.name == "headroom_serve_ingress_events_total" and s.labels["event"] == "requests" and s.value >= 1
               for s in samples)


def _grpc_text(target: str) -> str:
    prompt = triton_grpc.InferInput("text_input", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"One, two, three,"], dtype=object))
    result = triton_grpc.InferenceServerClient(target).infer("smollm2", [prompt], parameters={
        "max_tokens": 6, "temperature": 0.0})
    return bytes(result.as_numpy("text_output")[0]).decode()


def test_llm_model_infer_through_serves_grpc_proxy(served: tuple[str, RunningServer],
                                                    serve_addresses: tuple[str, str]) -> None:
    """tritonclient's gRPC ModelInfer on the LLM (text_input -> text_output) through Serve's gRPC proxy, the
    ingress and the LLM replica's own gRPC generate path: the greedy text of `headroom serve`'s gRPC."""
    _, server = served
    expected = _grpc_text(server.grpc_target)
    assert expected and _grpc_text(serve_addresses[1]) == expected


def test_both_deployments_reach_serve_with_their_autoscaling_config(served: tuple[str, RunningServer]) -> None:
    """What Serve's controller holds for the application (its deployment details), not what headroom rendered:
    the LLM deployment autoscales between its own bounds on headroom's policy (0.5 of llm_capacity 32). Scaling
    up under load: test_serve_llm_scaling.py."""
    from ray import serve
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()["applications"][APP]["deployments"]
    llm = details[LLM_DEPLOYMENT]["deployment_config"]
    assert llm["max_ongoing_requests"] == 32
    scaling = llm["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["max_replicas"], scaling["target_ongoing_requests"]) == (1, 2, 16.0)
    assert scaling["upscale_delay_s"] == 0.0 and scaling["look_back_period_s"] == 15.0
    models = details[MODELS_DEPLOYMENT]["deployment_config"]["autoscaling_config"]
    assert (models["min_replicas"], models["max_replicas"], models["target_ongoing_requests"]) == (1, 2, 4.0)
    status = serve.status().applications[APP].deployments[LLM_DEPLOYMENT]
    assert status.status == "HEALTHY" and status.replica_states.get("RUNNING") == 1


def _kill_llm_replica() -> None:
    import ray

    names = [a for a in ray.util.list_named_actors(all_namespaces=True) if f"#{LLM_DEPLOYMENT}#" in a["name"]]
    assert len(names) == 1, names
    ray.kill(ray.get_actor(names[0]["name"], namespace=names[0]["namespace"]), no_restart=True)


def test_a_stream_whose_llm_replica_dies_ends_with_an_openai_error_event(served: tuple[str, RunningServer]) -> None:
    """Last in this module: it kills the LLM replica (Serve starts another). The stream has sent text; the
    ingress cannot retry it, so it ends it with OpenAI's error event, which the openai SDK raises as APIError."""
    serve_url, _ = served
    stream = _client(serve_url).chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=1024, temperature=0, stream=True,  # type: ignore[arg-type]
        extra_body={"ignore_eos": True})  # a long answer: the kill lands mid-stream
    text = ""
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if not text:
                    _kill_llm_replica()
                text += chunk.choices[0].delta.content
    assert text, "no text before the kill"
    body = err.value.body
    assert isinstance(body, dict) and "lost mid-answer" in body["message"] and body["code"] == "engine_unavailable"
    stats = httpx.get(serve_url + STATS_PATH, timeout=30.0).json()
    assert stats["streams_broken"] >= 1, stats
