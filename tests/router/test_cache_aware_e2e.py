"""Cache-aware routing end to end: two real `headroom serve` replicas of smollm2 publish their KV blocks at
/v2/llm/prefix_blocks, and the router (tokenizer only, no weights) sends each request to the replica that holds
its prompt's prefix."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from headroom.llm.prefix_blocks import PATH, parse
from headroom.router.config import ProxyConfig
from headroom.router.fake_replica import serve_asgi
from headroom.router.prefix_index import PrefixIndexConfig
from headroom.router.prompt_hasher import load_prompt_hasher
from headroom.router.proxy import Router
from headroom.router.request_keys import PrefixKey
from headroom.router.upstream import Upstream
from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[2] / "models"
WORDS = ["river", "engineer", "cache", "token", "latency", "garden", "window", "careful", "quiet", "morning",
         "thread", "budget"]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningServer]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(run_server(REPO, tmp_path_factory.mktemp(f"r{i}"), ["--model", "smollm2"]))
               for i in range(2)]


def _chat(system: str, question: str) -> dict[str, object]:
    return {"model": "smollm2", "max_tokens": 2, "temperature": 0.0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}


def _system(seed: int) -> str:
    rng = random.Random(seed)
    return f"You are assistant {seed}. " + " ".join(rng.choices(WORDS, k=90))


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _published(client: httpx.AsyncClient, server: RunningServer) -> frozenset[int]:
    r = await client.get(server.url + PATH)
    assert r.status_code == 200
    return parse(r.content).models["smollm2"].hashes


async def test_requests_go_to_the_replica_holding_their_prefix(replicas: list[RunningServer]) -> None:
    hasher = await asyncio.to_thread(load_prompt_hasher, REPO, ["smollm2"])
    by_id = {f"r{i}": s for i, s in enumerate(replicas)}
    # routed_ttl_s=0: only what the replicas publish counts, not the router's own record of where it sent what
    config = ProxyConfig(policy="cache_aware", shedding=False, check_interval_s=0.1,
                         prefix_index=PrefixIndexConfig(routed_ttl_s=0.0))
    router = Router([Upstream(rid, s.url) for rid, s in by_id.items()], config, prompt_hasher=hasher)
    index = router.prefix
    assert index is not None

    def matched(rid: str, key: PrefixKey) -> bool:
        return index.match_blocks(rid, key, router.clock.now_s()) == len(key.block_hashes)

    async with serve_asgi(router.app, lifespan="on") as url, httpx.AsyncClient(timeout=120.0) as client:
        await _until(lambda: all(s.ready for s in router.snapshots()), "both replicas ready")
        # replicas without API keys run every request as the gateway's anonymous tenant, and say so
        await _until(lambda: index.tenant == "anonymous", "the replicas' tenant")
        first = _chat(_system(1), "What is a river?")
        key = hasher.key(orjson.dumps(first), "anonymous")
        assert key is not None and len(key.block_hashes) >= 6
        r = await client.post(url + "/v1/chat/completions", json=first)
        assert r.status_code == 200, r.text
        holder = r.headers["x-headroom-replica"]
        other = next(rid for rid in by_id if rid != holder)
        # the router's hashes of the prompt are the engine's own: the holder publishes every one of them
        assert set(key.block_hashes) <= await _published(client, by_id[holder])
        assert not set(key.block_hashes) & await _published(client, by_id[other])
        await _until(lambda: matched(holder, key), "the router to poll the holder's blocks")
        for i in range(3):  # same system prompt, other questions: all to the holder
            r = await client.post(url + "/v1/chat/completions", json=_chat(_system(1), f"Question {i}: why?"))
            assert r.status_code == 200 and r.headers["x-headroom-replica"] == holder

        # a second system prompt cached on the other replica only (sent to it directly, not through the router)
        second = _chat(_system(2), "What is a garden?")
        key2 = hasher.key(orjson.dumps(second), "anonymous")
        assert key2 is not None
        r = await client.post(by_id[other].url + "/v1/chat/completions", json=second)
        assert r.status_code == 200, r.text
        await _until(lambda: matched(other, key2), "the router to poll the other replica's blocks")
        for i in range(3):
            r = await client.post(url + "/v1/chat/completions", json=_chat(_system(2), f"Question {i}: how?"))
            assert r.status_code == 200 and r.headers["x-headroom-replica"] == other
        stats = (await client.get(url + "/router/stats")).json()
        assert stats["counters"]["requests"] == 7
