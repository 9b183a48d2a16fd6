"""headroom on Ray Serve, end to end on a REAL local Ray cluster (127.0.0.1, 2 CPUs) started by the test: Serve's
HTTP proxy -> the ingress -> a DeploymentHandle -> a headroom DataPlane in each model replica.

* a request through Serve answers exactly as `headroom serve` (a real process) answers it, errors included;
* multiplexing: with one model per replica, each of two models settles on its own replica and both answer;
* headroom's affinity policy as Serve's request router: one session key always reaches one replica;
* a model replica actor killed under load loses no accepted request (the ingress retries on the survivor);
* API keys (`api_keys_file`) are required over HTTP and gRPC as `headroom serve --api-keys-file` requires them.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from headroom.gateway.auth import create_key
from headroom.ray_serve.app import MODELS_DEPLOYMENT
from headroom.ray_serve.ingress import REPLICA_HEADER, STATS_PATH
from tests.ray_serve.conftest import deploy
from tests.server.conftest import build_test_repository
from tests.support.server import run_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with the digits CNN (onnxruntime) and the noop model (returns its input)."""
    root = tmp_path_factory.mktemp("serve-repo")
    (root / "digits").symlink_to(ROOT / "models" / "digits")
    (root / "noop").symlink_to(ROOT / "benchmarks" / "models" / "noop")
    return root


def digits_body(seed: int) -> dict[str, Any]:
    data = np.random.default_rng(seed).integers(0, 17, size=64).astype(float).tolist()
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": data}]}


def noop_body(i: int) -> dict[str, Any]:
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3], "data": [i, i + 1, i + 2]}]}


def _outputs(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    return list(r.json()["outputs"])


def test_serve_answers_as_headroom_serve_does(repo: Path, serve_url: str, tmp_path: Path) -> None:
    deploy(repo, replicas=1, router="serve", max_body_bytes=4096)
    bad = [("/v2/models/nope/infer", {"inputs": []}),  # unknown model: 404 before the body is read
           ("/v2/models/digits/infer", {"inputs": [{"name": "input", "datatype": "INT8", "shape": [1, 1, 8, 8],
                                                     "data": [0] * 64}]}),  # wrong datatype: 400
           ("/v2/models/noop/infer", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3],
                                                   "data": [1, 2]}]})]  # data does not fill the shape: 400
    with run_server(repo, tmp_path, ["--grpc-port", "-1"]) as server, httpx.Client(timeout=60.0) as client:
        for seed in range(3):
            via_serve = client.post(f"{serve_url}/v2/models/digits/infer", json=digits_body(seed))
            via_headroom = client.post(f"{server.url}/v2/models/digits/infer", json=digits_body(seed))
            assert _outputs(via_serve) == _outputs(via_headroom)
            assert via_serve.json()["model_version"] == via_headroom.json()["model_version"] == "1"
            assert via_serve.headers[REPLICA_HEADER]
        assert _outputs(client.post(f"{serve_url}/v2/models/noop/infer", json=noop_body(4)))[0]["data"] == [4, 5, 6]
        for path, body in bad:
            a, b = client.post(serve_url + path, json=body), client.post(server.url + path, json=body)
            assert (a.status_code, a.json()["reason"]) == (b.status_code, b.json()["reason"]), (a.text, b.text)
            assert a.status_code in (400, 404) and a.json()["error"]
        garbage = client.post(f"{serve_url}/v2/models/noop/infer", content=b"{not json")
        assert garbage.status_code == 400 and garbage.json()["reason"] == "invalid_request"
        big = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 2000], "data": [1.5] * 2000}]}
        too_big = client.post(f"{serve_url}/v2/models/noop/infer", json=big)  # over max_body_bytes=4096
        assert too_big.status_code == 413 and too_big.json()["reason"] == "payload_too_large"
        bad_timeout = client.post(f"{serve_url}/v2/models/noop/infer", json=noop_body(1),
                                  headers={"x-request-timeout-ms": "soon"})
        assert bad_timeout.status_code == 400 and bad_timeout.json()["error"]
        assert client.get(f"{serve_url}/v2/models/noop/infer").status_code == 405
        assert client.get(f"{serve_url}/v2/nothing").status_code == 404
        assert _outputs(client.post(f"{serve_url}/v2/models/noop/infer", json=noop_body(5)))[0]["data"] == [5, 6, 7]


def _grpc_digits(client: triton_grpc.InferenceServerClient, seed: int) -> np.ndarray:
    data = np.asarray(digits_body(seed)["inputs"][0]["data"], dtype=np.float32).reshape(1, 1, 8, 8)
    tensor = triton_grpc.InferInput("input", [1, 1, 8, 8], "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer("digits", [tensor])
    out: np.ndarray = result.as_numpy("probabilities")
    return out


def _grpc_status(call: Callable[[], object]) -> str:
    with pytest.raises(InferenceServerException) as failed:
        call()
    return str(failed.value.status())


def test_kserve_v2_grpc_through_serves_grpc_proxy(repo: Path, serve_addresses: tuple[str, str],
                                                   tmp_path: Path) -> None:
    """tritonclient's gRPC client against Serve's gRPC proxy: ModelInfer reaches a model replica through the
    ingress and answers as `headroom serve`'s gRPC does, errors with the same codes."""
    deploy(repo, replicas=1, router="serve")
    via_serve = triton_grpc.InferenceServerClient(serve_addresses[1])
    with run_server(repo, tmp_path) as server:
        via_headroom = triton_grpc.InferenceServerClient(server.grpc_target)
        assert via_serve.is_server_live() and via_serve.is_server_ready() and via_serve.is_model_ready("digits")
        assert not via_serve.is_model_ready("nope")
        for seed in range(2):
            assert np.array_equal(_grpc_digits(via_serve, seed), _grpc_digits(via_headroom, seed))
        missing = triton_grpc.InferInput("input", [1, 3], "FP32")
        missing.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
        for client in (via_serve, via_headroom):
            assert _grpc_status(lambda c=client: c.infer("nope", [missing])) == "StatusCode.NOT_FOUND"
            assert _grpc_status(lambda c=client: c.infer("digits", [missing])) == "StatusCode.INVALID_ARGUMENT"
        # metadata and Triton's config come from the ingress's repository scan, equal to headroom serve's
        for name in ("digits", "noop"):
            assert via_serve.get_model_metadata(name, as_json=True) == via_headroom.get_model_metadata(name,
                                                                                                    as_json=True)
            assert via_serve.get_model_config(name, as_json=True) == via_headroom.get_model_config(name, as_json=True)
        assert via_serve.get_model_metadata("digits", "1").versions == ["1"]
        for call in (lambda c: c.get_model_metadata("nope"), lambda c: c.get_model_config("digits", "9")):
            assert _grpc_status(lambda f=call: f(via_serve)) == _grpc_status(lambda f=call: f(via_headroom)) == (
                "StatusCode.NOT_FOUND")
        with httpx.Client(timeout=60.0) as http:  # the V2 HTTP routes too
            serve_url = serve_addresses[0]
            for path in ("/v2/models/digits", "/v2/models/digits/versions/1", "/v2/models/digits/config",
                         "/v2/models/noop/ready", "/v2/models/nope", "/v2/models/digits/versions/9/config"):
                a, b = http.get(serve_url + path), http.get(server.url + path)
                assert a.status_code == b.status_code and (a.status_code != 200 or a.json() == b.json()), (
                    path, a.text, b.text)
        assert _grpc_status(lambda: via_serve.get_inference_statistics("digits")) == "StatusCode.UNIMPLEMENTED"


def test_api_keys_are_required_over_http_and_grpc_as_by_headroom_serve(
        repo: Path, serve_addresses: tuple[str, str], tmp_path: Path) -> None:
    """`api_keys_file` on a real cluster: the ingress refuses a request without a valid key (401, gRPC
    UNAUTHENTICATED), health stays open, and a keyed request runs through the replica, whose own gateway loaded
    the same keys file."""
    keys = tmp_path / "keys.json"
    key = create_key(keys, "acme")
    deploy(repo, replicas=1, router="serve", models=["noop"], api_keys_file=str(keys))
    serve_url, grpc_target = serve_addresses
    with httpx.Client(timeout=60.0) as client:
        bare = client.post(f"{serve_url}/v2/models/noop/infer", json=noop_body(1))
        assert bare.status_code == 401 and bare.json()["reason"] == "unauthenticated", bare.text
        assert bare.headers["www-authenticate"] == 'Bearer realm="headroom"'
        wrong = client.post(f"{serve_url}/v1/embeddings", json={"model": "noop", "input": ["x"]},
                            headers={"authorization": "Bearer hr_0000_wrong"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"  # OpenAI's shape
        assert client.get(f"{serve_url}/v2/health/ready").status_code == 200
        keyed = client.post(f"{serve_url}/v2/models/noop/infer", json=noop_body(1), headers={"x-api-key": key})
        assert _outputs(keyed)[0]["data"] == [1, 2, 3]
        # forwarded to the model replica's own HTTP app: its gateway accepts the key (noop is no embedding model)
        forwarded = client.post(f"{serve_url}/v1/embeddings", json={"model": "noop", "input": ["x"]},
                                headers={"authorization": f"Bearer {key}"})
        assert forwarded.status_code not in (401, 403) and forwarded.json()["error"], forwarded.text
    via_serve = triton_grpc.InferenceServerClient(grpc_target)
    tensor = triton_grpc.InferInput("input", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    assert via_serve.is_server_ready()  # health RPCs need no key
    assert _grpc_status(lambda: via_serve.infer("noop", [tensor])) == "StatusCode.UNAUTHENTICATED"
    answer = via_serve.infer("noop", [tensor], headers={"x-api-key": key})
    assert answer.as_numpy("output").shape == (1, 3)


def _replica_of(client: httpx.Client, url: str, model: str, body: dict[str, Any]) -> str:
    r = client.post(f"{url}/v2/models/{model}/infer", json=body)
    assert r.status_code == 200, r.text
    return r.headers[REPLICA_HEADER]


def _homes(client: httpx.Client, url: str, rounds: int = 6, attempts: int = 150) -> tuple[str, str]:
    """Alternate noop and digits requests until each has answered from one replica `rounds` times in a row:
    (noop's replica, digits' replica), on two different replicas. Serve learns which replica holds which model
    asynchronously, and a replica that has to load a model it lacks evicts the other, so the first rounds may move
    models around (or keep both on one replica, reloading at every request, until Serve's view catches up)."""
    streak, last = 0, ("", "")
    for i in range(attempts):
        now = (_replica_of(client, url, "noop", noop_body(i)), _replica_of(client, url, "digits", digits_body(i)))
        streak = streak + 1 if now == last and now[0] != now[1] else 1  # two models, one per replica: apart
        last = now
        if streak >= rounds:
            return last
    raise AssertionError(f"noop and digits never settled on fixed replicas in {attempts} rounds (last: {last})")


def test_rate_limits_and_cors_hold_behind_serves_own_http_proxy(repo: Path, serve_url: str) -> None:
    """The ingress's gateway (`GatewayCall`) through Serve's real proxy: a preflight is answered with the allowed
    origin, and the anonymous tenant's request bucket (burst 2, ~0 refill) refuses the third request with 429."""
    deploy(repo, models=["noop"], rate_limit_rps=0.001, rate_limit_burst=2, cors_origins=["http://dash.local"])
    with httpx.Client(timeout=60.0) as client:
        preflight = client.options(f"{serve_url}/v2/models/noop/infer", headers={
            "origin": "http://dash.local", "access-control-request-method": "POST"})
        assert preflight.status_code == 200, preflight.text
        assert preflight.headers["access-control-allow-origin"] == "http://dash.local"
        answers = [client.post(f"{serve_url}/v2/models/noop/infer", json=noop_body(i),
                               headers={"origin": "http://dash.local"}) for i in range(3)]
        assert [r.status_code for r in answers] == [200, 200, 429], [r.text for r in answers]
        assert answers[0].headers["access-control-allow-origin"] == "http://dash.local"
        assert answers[2].json()["reason"] == "rate_limited" and float(answers[2].headers["retry-after"]) > 60
        assert client.get(f"{serve_url}/v2/health/ready").status_code == 200  # probes are never limited


def test_models_are_multiplexed_one_per_replica(repo: Path, serve_url: str) -> None:
    deploy(repo, replicas=2, multiplex=True, max_models_per_replica=1, router="peak_ewma")
    with httpx.Client(timeout=60.0) as client:
        noop, digits = _homes(client, serve_url)
        # one model per replica: a replica holding both would have evicted one of them at every other request
        assert noop != digits
        assert _outputs(client.post(f"{serve_url}/v2/models/noop/infer", json=noop_body(7)))[0]["data"] == [7, 8, 9]


def test_headroom_affinity_policy_routes_a_session_to_one_replica(repo: Path, serve_url: str) -> None:
    deploy(repo, replicas=2, multiplex=False, router="affinity")
    with httpx.Client(timeout=60.0) as client:
        homes: dict[str, set[str]] = {}
        for round_ in range(3):
            for k in range(12):
                r = client.post(f"{serve_url}/v2/models/noop/infer", json=noop_body(round_),
                                headers={"x-session-id": f"user-{k}"})
                assert r.status_code == 200, r.text
                homes.setdefault(f"user-{k}", set()).add(r.headers[REPLICA_HEADER])
    assert all(len(replicas) == 1 for replicas in homes.values()), homes  # sticky per session
    assert len(set().union(*homes.values())) == 2  # rendezvous hashing spreads the 12 sessions over both
    # /metrics: each replica's own page, labelled with its id (each scrape routed to exactly that replica)
    answered = Counter(next(iter(replicas)) for replicas in homes.values())
    samples = [s for f in text_string_to_metric_families(httpx.get(serve_url + "/metrics", timeout=60.0).text)
               for s in f.samples]
    counted: Counter[str] = Counter()
    for s in samples:
        if s.name == "headroom_requests_total" and s.labels["model"] == "noop":
            counted[s.labels["replica"]] += int(s.value)
    assert counted == Counter({rid: 3 * n for rid, n in answered.items()})  # 3 rounds per session
    assert {s.labels["replica"] for s in samples if s.name == "headroom_serve_replica_up" and s.value == 1} == set(
        answered)


def slow_body(i: int, delay_ms: float) -> dict[str, Any]:
    return {"inputs": [{"name": "delay_ms", "datatype": "FP32", "shape": [1, 1], "data": [delay_ms]},
                       {"name": "tag", "datatype": "INT64", "shape": [1, 1], "data": [i]}]}


async def _load(url: str, n: int, concurrency: int, delay_ms: float,
                first: asyncio.Future[str]) -> list[httpx.Response]:
    """`n` requests to the slow model, `concurrency` at a time; `first` gets the replica of the first answer."""
    sem = asyncio.Semaphore(concurrency)

    async with httpx.AsyncClient(timeout=120.0) as client:
        async def one(i: int) -> httpx.Response:
            async with sem:
                r = await client.post(f"{url}/v2/models/slow/infer", json=slow_body(i, delay_ms))
            if not first.done():
                first.set_result(r.headers.get(REPLICA_HEADER, ""))
            return r

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def _kill_replica(unique_id: str) -> None:
    import ray

    names = [a for a in ray.util.list_named_actors(all_namespaces=True)
             if MODELS_DEPLOYMENT in a["name"] and a["name"].endswith(unique_id)]
    assert len(names) == 1, names
    ray.kill(ray.get_actor(names[0]["name"], namespace=names[0]["namespace"]), no_restart=True)


def test_throughput_scales_from_one_to_two_replicas(serve_url: str, tmp_path: Path) -> None:
    """A latency-bound model (sleeps 200 ms, one request at a time per replica), 16 requests 4 at a time: two
    replicas answer them in about half the time one does, so Serve spreads the load over both through headroom's
    router and nothing in the proxy -> ingress -> handle path is the bottleneck."""
    repo = build_test_repository(tmp_path / "repo")

    def rate(replicas: int) -> tuple[float, set[str]]:
        deploy(repo, replicas=replicas, multiplex=False, router="least_outstanding", replica_capacity=1,
               trusted_backends=["python"], models=["slow"])

        async def run() -> tuple[list[httpx.Response], float]:
            loop = asyncio.get_running_loop()
            await _load(serve_url, 2, 2, 0.0, loop.create_future())  # warm the path up (connections, handles)
            started = loop.time()
            answers = await _load(serve_url, 16, 4, 200.0, loop.create_future())
            return answers, loop.time() - started

        answers, elapsed_s = asyncio.run(run())
        assert [r.status_code for r in answers] == [200] * 16, [r.text for r in answers if r.status_code != 200][:2]
        return 16 / elapsed_s, {r.headers[REPLICA_HEADER] for r in answers}

    one, one_ids = rate(1)
    two, two_ids = rate(2)
    assert len(one_ids) == 1 and len(two_ids) == 2
    assert one < 1000 / 200 * 1.05  # one replica: at most 5 req/s by construction
    assert two >= 1.6 * one, (one, two)


def test_a_replica_killed_under_load_loses_no_accepted_request(serve_url: str, tmp_path: Path) -> None:
    """Two replicas each hold two requests of a 400 ms model (one running, one queued); one is killed mid-run.
    The requests it held fail with ActorDiedError in the ingress, which sends them again: every request gets its
    answer."""
    repo = build_test_repository(tmp_path / "repo")  # Python-backend test models, `slow` among them
    deploy(repo, replicas=2, multiplex=False, router="least_outstanding", replica_capacity=2, max_attempts=5,
           retry_backoff_s=0.1, trusted_backends=["python"], models=["slow"], load_allowance_s=0.0)

    async def run() -> tuple[list[httpx.Response], str]:
        first: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        load = asyncio.create_task(_load(serve_url, 24, 4, 400.0, first))
        victim = await asyncio.wait_for(first, 120.0)
        # 4 clients keep both replicas full (capacity 2: one request running, one queued): the victim that just
        # answered is running the next one and holds another
        await asyncio.to_thread(_kill_replica, victim)
        return await asyncio.wait_for(load, 240.0), victim

    responses, victim = asyncio.run(run())
    failed = [(r.status_code, r.text) for r in responses if r.status_code != 200]
    assert not failed, failed[:5]
    for i, r in enumerate(responses):
        assert r.json()["outputs"][0]["data"] == [i]
    stats = httpx.get(serve_url + STATS_PATH, timeout=30.0).json()
    # the kill hit requests in flight on the victim, and every one of them was answered by another try
    assert stats["replica_lost_retries"] >= 1 and stats["retries_exhausted"] == 0, stats
    assert all(r.headers[REPLICA_HEADER] != victim for r in responses[-4:])  # the last ones: never the victim
    # a request that outlives its own timeout gets one 504 (from the replica's deadline or the ingress's bound)
    late = httpx.post(f"{serve_url}/v2/models/slow/infer", json=slow_body(99, 2000.0), timeout=60.0,
                      headers={"x-request-timeout-ms": "300"})
    assert late.status_code == 504 and late.json()["reason"] == "deadline_exceeded", late.text
    after = httpx.post(f"{serve_url}/v2/models/slow/infer", json=slow_body(100, 0.0), timeout=60.0)
    assert after.status_code == 200 and after.json()["outputs"][0]["data"] == [100]
