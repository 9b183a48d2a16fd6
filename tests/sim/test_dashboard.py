"""The dashboard routes: the static page and the playground API, through Starlette's test client."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from headroom.dashboard.playground import PRESETS, PlaygroundRequest, run_playground
from headroom.dashboard.routes import dashboard_routes


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(Starlette(routes=dashboard_routes()))


def test_page_is_self_contained(client: TestClient) -> None:
    r = client.get("/dashboard")
    assert r.status_code == 200
    html = r.text
    for control in ('id="server"', 'id="batching"', 'id="replicas"', 'id="autoscale"', 'id="qps"',
                    'id="simulate"', 'id="m-p99"', 'id="hist"', 'data-preset="autoscale_25qps"'):
        assert control in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")  # nothing fetched from elsewhere
    assert "https://" not in html


def test_presets_and_simulate(client: TestClient) -> None:
    presets = client.get("/dashboard/api/presets").json()
    assert set(presets["presets"]) == set(PRESETS)
    r = client.post("/dashboard/api/simulate", json={"server": "vllm", "batching": "continuous", "replicas": 2,
                                                      "autoscale": False, "qps": 12, "duration_s": 60})
    assert r.status_code == 200
    data = r.json()
    m = data["metrics"]
    assert m["completed"] > 500
    assert 0 < m["p50_latency_s"] <= m["p95_latency_s"] <= m["p99_latency_s"]
    h = data["histogram"]
    assert sum(h["counts"]) == m["completed"]
    assert h["colours"][0] == "#2e9e5b" and h["colours"][-1] == "#d64545"


def test_bad_input_is_a_400(client: TestClient) -> None:
    r = client.post("/dashboard/api/simulate", json={"server": "nope"})
    assert r.status_code == 400
    assert "vllm" in r.json()["error"]
    assert client.post("/dashboard/api/simulate", json={"replicas": 0}).status_code == 400


def _preset(name: str) -> dict[str, object]:
    return run_playground(PlaygroundRequest(**{k: v for k, v in PRESETS[name].items() if k != "note"}))


def test_the_pages_three_experiments() -> None:
    static, cont, scaled = _preset("static_30qps"), _preset("continuous_30qps"), _preset("autoscale_25qps")
    sm, cm = static["metrics"], cont["metrics"]
    assert isinstance(sm, dict) and isinstance(cm, dict)
    # (1) static at 30 QPS: head-of-line blocking, P99 explodes; (2) continuous: busy GPU, far lower P99.
    assert cm["p99_latency_s"] < 0.2 * sm["p99_latency_s"]
    assert cm["utilisation"] > 0.9
    # (3) autoscale from 1 replica at 25 QPS grows to 2-3 replicas.
    assert 2 <= int(str(scaled["max_replicas"])) <= 3
