"""The router's prompt hasher on hostile and odd bodies: a key or None, never an exception."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from headroom.router.prompt_hasher import PromptHasher, load_prompt_hasher

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
