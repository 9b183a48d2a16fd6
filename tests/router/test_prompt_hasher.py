"""The router's prompt hasher on hostile and odd bodies (a key or None, never an exception), and on what a chat
template renders beyond role and content (tools, tool-call turns), checked against a real replica's blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from headroom.llm.prefix_blocks import PATH, parse
from headroom.router.prompt_hasher import PromptHasher, load_prompt_hasher
from tests.llm.test_tools import TEMPLATE, TOOLS
from tests.support.server import run_server

REPO = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="module")
def hasher() -> PromptHasher:
    return load_prompt_hasher(REPO, ["smollm2"])


@pytest.mark.parametrize("body", [
    b"", b"not json", b"[1, 2]", b'{"model": "other", "prompt": "hi"}',
    b'{"prompt": [18446744073709551615' + b', 1' * 40 + b']}',  # beyond int64 in a full block
    b'{"prompt": [1, 2, 99999999999999999999999]}', b'{"prompt": [true, false]}', b'{"prompt": {"a": 1}}',
    b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}',
    b'{"messages": [{"role": 1, "content": "hi"}]}', b'{"messages": ["hi"]}',
])
def test_unhashable_bodies_give_no_key(hasher: PromptHasher, body: bytes) -> None:
    assert hasher.key(body, "anonymous") is None


def test_keys_follow_the_prompt_model_and_salt(hasher: PromptHasher) -> None:
    text = "one two three four five six seven eight nine ten " * 10
    plain = hasher.key(orjson.dumps({"model": "smollm2", "prompt": text}), "anonymous")
    assert plain is not None and plain.model == "smollm2" and len(plain.block_hashes) >= 4
    assert hasher.key(orjson.dumps({"prompt": text}), "anonymous") == plain  # one model: it is the default
    salted = hasher.key(orjson.dumps({"prompt": text, "cache_salt": "s"}), "anonymous")
    assert salted is not None and not set(salted.block_hashes) & set(plain.block_hashes)
    ids = hasher.key(orjson.dumps({"prompt": list(range(100))}), "anonymous")
    assert ids is not None and len(ids.block_hashes) == 6  # (100 - 1) // 16 full blocks
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
    assert hasher.key(orjson.dumps(chat), "anonymous") == hasher.key(
        orjson.dumps({"messages": [{"role": "user", "content": text}]}), "anonymous")  # text parts = the string


# --- what the chat template renders beyond role/content: tools and tool-call turns ---------------------------
ASK = [{"role": "user", "content": "What is the weather in Paris? " + "Answer briefly and precisely. " * 4}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
TOOL_TURNS = [*ASK, {"role": "assistant", "content": None, "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]


def _tools_repo(root: Path) -> Path:
    """smollm2 under a chat template that renders tools and tool-call turns (tests/llm/test_tools.py's)."""
    config = yaml.safe_load((REPO / "smollm2" / "config.yaml").read_text())
    config["parameters"].update(chat_template=TEMPLATE, kv_cache_memory_mb=64, warmup_tokens=1)
    (root / "smollm2").mkdir(parents=True)
    (root / "smollm2" / "config.yaml").write_text(yaml.safe_dump(config))
    return root


@pytest.fixture(scope="module")
def tools_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tools_repo(tmp_path_factory.mktemp("tools") / "repo")


def _key(hasher: PromptHasher, body: dict[str, Any]) -> tuple[int, ...]:
    key = hasher.key(orjson.dumps({"model": "smollm2", **body}), "anonymous")
    assert key is not None, body
    return key.block_hashes


def test_tools_and_tool_turns_change_the_key_and_output_constraints_do_not(tools_repo: Path) -> None:
    hasher = load_prompt_hasher(tools_repo)
    plain = _key(hasher, {"messages": ASK})
    with_tools = _key(hasher, {"messages": ASK, "tools": TOOLS})
    one_tool = _key(hasher, {"messages": ASK, "tools": TOOLS[:1]})
    # the template renders the tools before the messages: every block differs
    assert len({plain, with_tools, one_tool}) == 3 and not set(plain) & set(with_tools)
    # tool_choice and response_format constrain the output, not the prompt: the replica caches the same blocks
    assert _key(hasher, {"messages": ASK, "tools": TOOLS, "tool_choice": "required"}) == with_tools
    assert _key(hasher, {"messages": ASK, "response_format": {"type": "json_object"}}) == plain
    turns = _key(hasher, {"messages": TOOL_TURNS, "tools": TOOLS})
    other_call = [*TOOL_TURNS[:1], {**TOOL_TURNS[1], "tool_calls": [
        {**CALL, "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}]}, TOOL_TURNS[2]]
    assert turns != _key(hasher, {"messages": other_call, "tools": TOOLS})  # the call's arguments are rendered
    assert turns[:len(with_tools) - 1] == with_tools[:-1]  # the shared part of the prompt: the same blocks
    # what the replica refuses (a call never answered) gets no key: routed by load
    assert hasher.key(orjson.dumps({"messages": TOOL_TURNS[:2], "tools": TOOLS}), "anonymous") is None


def test_tools_for_a_template_that_does_not_render_them_get_no_key(hasher: PromptHasher) -> None:
    # SmolLM2's own template renders no tools: the replica answers 400, so there is nothing to route by
    assert hasher.key(orjson.dumps({"messages": ASK, "tools": TOOLS}), "anonymous") is None
    assert hasher.key(orjson.dumps({"messages": TOOL_TURNS}), "anonymous") is None
    assert hasher.key(orjson.dumps({"messages": ASK, "response_format": {"type": "json_object"}}),
                      "anonymous") == hasher.key(orjson.dumps({"messages": ASK}), "anonymous")


def test_the_keys_are_the_blocks_a_real_replica_caches_for_tool_requests(tools_repo: Path, tmp_path: Path) -> None:
    """A real `headroom serve` (the tools template) publishes every block the router hashes for a request with
    tools and one with tool-call turns; the request's messages alone (what the router hashed before) match none."""
    hasher = load_prompt_hasher(tools_repo)
    with run_server(tools_repo, tmp_path, ["--grpc-port", "-1"]) as server, httpx.Client(timeout=300.0) as http:
        for body in ({"messages": ASK, "tools": TOOLS, "tool_choice": "none"},
                     {"messages": TOOL_TURNS, "tools": TOOLS, "tool_choice": "none"}):
            request = {"model": "smollm2", "max_tokens": 1, "temperature": 0, **body}
            r = http.post(server.url + "/v1/chat/completions", json=request)
            assert r.status_code == 200, r.text
            published = parse(http.get(server.url + PATH).content).models["smollm2"].hashes
            key = _key(hasher, body)
            assert len(key) >= 4 and set(key) <= published, body
        assert not set(_key(hasher, {"messages": ASK})) & published
