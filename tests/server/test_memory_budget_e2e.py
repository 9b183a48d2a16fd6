"""`headroom serve --model-memory-budget-mb`: a real server multiplexes models through a tiny budget."""

from __future__ import annotations

import asyncio
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from headroom.cli import models as models_cli
from headroom.server.app import Server, ServerConfig
from tests.support.server import TRUST_PYTHON, run_server

# Each model adds its own offset and records every load in its version directory.
ADDER = """
import time
import numpy as np

class Adder:
    def load(self, context):
        self.offset = float(context.config.parameters["offset"])
        time.sleep(float(context.config.parameters["load_s"]))  # a slow load: longer than the request timeout
        with open(context.version_dir / "loads.txt", "a") as f:
            f.write("load\\n")

    def predict(self, inputs):
        return {"y": inputs["x"] + self.offset}
"""
WEIGHT_BYTES = 1 << 20  # each model "weighs" 1 MiB on disk; the budget fits the pinned one plus one other
MODELS = {"alpha": 1.0, "beta": 2.0, "gamma": 3.0, "pinned": 100.0}
LOAD_S = {"gamma": 0.4}  # gamma loads slower than its 200 ms request timeout: the swap-in must not count


def _repository(root: Path) -> Path:
    for name, offset in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.yaml").write_text(textwrap.dedent(f"""
            backend: python
            max_batch_size: 8
            inputs: [{{name: x, datatype: FP32, shape: [2]}}]
            outputs: [{{name: y, datatype: FP32, shape: [2]}}]
            dynamic_batching: {{max_queue_delay_ms: 1, default_timeout_ms: {200 if name == "gamma" else 30000}}}
            pinned: {"true" if name == "pinned" else "false"}
            parameters: {{offset: {offset}, load_s: {LOAD_S.get(name, 0.0)}}}
        """))
        (root / name / "1" / "model.py").write_text(textwrap.dedent(ADDER))
        (root / name / "1" / "weights.bin").write_bytes(b"\0" * WEIGHT_BYTES)
    return root


def _infer(url: str, model: str, value: float) -> list[float]:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [value, value]}]}
    response = httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    data: list[float] = response.json()["outputs"][0]["data"]
    return data


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _loads(repo: Path, name: str) -> int:
    path = repo / name / "1" / "loads.txt"
    return len(path.read_text().split()) if path.exists() else 0


@pytest.mark.timeout(300)
def test_three_models_alternate_through_a_budget_that_holds_one_of_them(tmp_path: Path) -> None:
    repo = _repository(tmp_path / "repo")
    budget_mb = 2.5  # pinned (1 MiB + model.py) + one more; never two of alpha/beta/gamma
    args = ["--grpc-port", "-1", "--model-memory-budget-mb", str(budget_mb), "--model-control-mode", "explicit",
            *TRUST_PYTHON]
    with run_server(repo, tmp_path, args) as srv:
        index = {row["name"]: row for row in httpx.post(srv.url + "/v2/repository/index", timeout=10).json()}
        assert index["pinned"]["state"] == "READY" and index["alpha"]["state"] == "READY"  # ready = initial set
        assert index["beta"]["state"] == "UNAVAILABLE" and "not resident" in index["beta"]["reason"]
        metadata = httpx.get(srv.url + "/v2/models/beta", timeout=10)  # answered from config.yaml
        assert metadata.status_code == 200 and metadata.json()["inputs"][0]["name"] == "x"
        assert httpx.get(srv.url + "/v2/models/beta/ready", timeout=10).status_code != 200

        for round_ in range(3):  # sequential, alternating: every request but the first swaps a model in
            for i, name in enumerate(("alpha", "beta", "gamma", "pinned")):
                x = float(10 * round_ + i)
                assert _infer(srv.url, name, x) == [x + MODELS[name]] * 2

        jobs = [(name, float(i)) for i in range(8) for name in ("alpha", "beta", "gamma")]
        with ThreadPoolExecutor(max_workers=6) as pool:  # concurrent and interleaved: all must succeed
            results = list(pool.map(lambda job: _infer(srv.url, *job), jobs))
        assert results == [[x + MODELS[name]] * 2 for name, x in jobs]

        metrics = _samples(srv.url)
        evictions = {name: metrics.get(("headroom_model_evictions_total", (("model", name),)), 0.0)
                     for name in MODELS}
        assert evictions["pinned"] == 0.0 and _loads(repo, "pinned") == 1  # pinned: loaded once, never evicted
        assert sum(evictions.values()) >= 8
        swap_ins = sum(metrics.get(("headroom_model_swap_in_seconds_count", (("model", n),)), 0.0) for n in MODELS)
        assert swap_ins == sum(_loads(repo, n) for n in ("alpha", "beta", "gamma")) - 1  # alpha's first load
        assert 0 < metrics[("headroom_model_resident_bytes", ())] <= budget_mb * 2**20
        assert metrics[("headroom_model_memory_budget_bytes", ())] == budget_mb * 2**20
        outcomes = {labels: v for (name, labels), v in metrics.items() if name == "headroom_requests_total"}
        assert all(dict(labels)["outcome"] == "success" for labels in outcomes)

        assert httpx.get(srv.url + "/v2/health/ready", timeout=10).status_code == 200  # evictions: still ready

        def state(name: str) -> str:
            rows = httpx.post(srv.url + "/v2/repository/index", timeout=10).json()
            return next(str(r["state"]) for r in rows if r["name"] == name)

        resident = next(n for n in ("alpha", "beta", "gamma") if state(n) == "READY")
        other = next(n for n in ("alpha", "beta", "gamma") if n != resident)
        assert httpx.post(f"{srv.url}/v2/repository/models/{other}/load", timeout=60).status_code == 200
        assert state(other) == "READY" and state(resident) == "UNAVAILABLE"  # explicit load: through the budget
        assert httpx.post(f"{srv.url}/v2/repository/models/{other}/unload", timeout=60).status_code == 200
        assert state(other) == "UNAVAILABLE"
        assert _infer(srv.url, other, 5.0) == [5.0 + MODELS[other]] * 2  # the next request brings it back

        listing = CliRunner().invoke(models_cli.app, ["list", "--model-repository", str(repo), "--url", srv.url],
                                     env={"COLUMNS": "250"})
        assert listing.exit_code == 0, listing.output
        rows = {line.split()[1]: line for line in listing.output.splitlines() if line.startswith("│")}
        assert "yes" in rows["pinned"] and "READY v1" in rows["pinned"]
        assert sum("not resident" in rows[n] for n in ("alpha", "beta", "gamma")) == 2  # one of them is loaded


def test_pinned_models_that_do_not_fit_are_a_startup_error(tmp_path: Path) -> None:
    repo = _repository(tmp_path / "repo")
    config = ServerConfig(model_repository=repo, http_port=0, grpc_port=-1, model_memory_budget_bytes=1 << 19,
                          trusted_backends=frozenset({"python"}))
    with pytest.raises(ValueError, match=r"pinned models \['pinned'\].*--model-memory-budget-mb"):
        asyncio.run(Server(config).run())  # `headroom serve` prints this message and exits with status 2
