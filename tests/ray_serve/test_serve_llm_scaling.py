"""The LLM deployment scales up under load on a REAL local Ray cluster, and no accepted request is lost meanwhile.

smollm2 is deployed with headroom's autoscaler policy (`autoscaler` in the builder's args, as a router.yaml gives it)
between 1 and 2 LLM replicas, each holding `llm_capacity` 2 requests (Serve's `target_ongoing_requests` = 0.5 x 2).
Eight clients stream long answers back to back. Serve's controller starts the second replica while they run; each
client keeps going until answers come from both replicas, then stops. Every answer must be whole (`length`, all
its tokens, the same greedy text as a reference answer taken before the load) and none may fail: a request that
arrives while the new replica is starting waits in the handle's queue or goes to the old replica. Own module: the
cluster has to start with one LLM replica."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx

from headroom.ray_serve.app import LLM_DEPLOYMENT
from headroom.ray_serve.ingress import REPLICA_HEADER
from tests.ray_serve.conftest import APP, deploy

REPO = Path(__file__).resolve().parents[2] / "models"
BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "Count from one to one hundred."}],
        "max_tokens": 48, "temperature": 0, "stream": True, "ignore_eos": True}
CLIENTS = 8
DEADLINE_S = 240.0


def _running_replicas() -> int:
    from ray import serve

    status = serve.status().applications[APP].deployments[LLM_DEPLOYMENT]
    return int(status.replica_states.get("RUNNING", 0))


async def _stream(http: httpx.AsyncClient, url: str) -> tuple[int, str, str, str]:
    """(status, replica, text, finish_reason) of one streamed chat."""
    text, finish = "", ""
    async with http.stream("POST", url + "/v1/chat/completions", json=BODY) as response:
        replica = response.headers.get(REPLICA_HEADER, "")
        if response.status_code != 200:
            return response.status_code, replica, (await response.aread()).decode(), ""
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return 599, replica, json.dumps(event), ""
            for choice in event["choices"]:
                text += choice["delta"].get("content") or ""
                finish = choice.get("finish_reason") or finish
    return 200, replica, text, finish


def test_the_llm_deployment_scales_up_under_load_and_loses_nothing(serve_url: str) -> None:
    policy = {"min_replicas": 1, "max_replicas": 1, "window_s": 11.0, "warm_pool": 0, "cooldown_s": 600.0,
              "scale_down_stabilisation_s": 600.0}
    deploy(REPO, models=["smollm2"], llm_num_cpus=0.5, autoscaler=policy, llm_min_replicas=1, llm_max_replicas=2,
           llm_capacity=2, llm_timeout_s=300.0)
    assert _running_replicas() == 1

    async def run() -> tuple[tuple[int, str, str, str], list[tuple[int, str, str, str]], float]:
        async with httpx.AsyncClient(timeout=300.0) as http:
            reference = await _stream(http, serve_url)
            answers: list[tuple[int, str, str, str]] = []
            scaled_at: list[float] = []
            started = time.monotonic()

            async def client() -> None:
                while time.monotonic() - started < DEADLINE_S:
                    answers.append(await _stream(http, serve_url))
                    if not scaled_at and await asyncio.to_thread(_running_replicas) == 2:
                        scaled_at.append(time.monotonic() - started)
                    if len({a[1] for a in answers[-CLIENTS:]}) == 2:  # the latest answers come from both
                        return

            await asyncio.gather(*(client() for _ in range(CLIENTS)))
            return reference, answers, scaled_at[0] if scaled_at else -1.0

    reference, answers, scaled_after_s = asyncio.run(run())
    assert reference[0] == 200 and reference[3] == "length" and reference[2], reference
    assert scaled_after_s > 0, f"no second LLM replica within {DEADLINE_S} s"
    failed = [a for a in answers if a[0] != 200]
    assert not failed, failed[:3]
    wrong = [a for a in answers if a[3] != "length" or a[2] != reference[2]]
    assert not wrong, wrong[:2]
    assert len({a[1] for a in answers}) == 2, {a[1] for a in answers}  # both replicas answered
    assert _running_replicas() == 2
