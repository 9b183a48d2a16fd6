"""Which key a request routes by: a session header or the OpenAI `user` field (affinity), the prompt (prefix)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import orjson

#: cache_aware places a prefix no replica holds by its first this many blocks (64 tokens at 16 per block: about
#: the 256 characters `prefix` hashes), so prompts that share them land together and new ones spread evenly
PLACEMENT_BLOCKS = 4
#: Bodies larger than this are not parsed for a routing key (route them by load instead).
MAX_KEY_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class PrefixKey:
    """What cache-aware routing knows about one request (`headroom.router.prompt_hasher` makes it)."""

    model: str  # the served model name the request asks for
    block_hashes: tuple[int, ...]  # its prompt's leading full-block hashes (the engine's), in order

    def placement_key(self, blocks: int = PLACEMENT_BLOCKS) -> str | None:
        """Where a prefix no replica holds goes: the chained hash of its first `blocks` blocks (it covers them
        all), the model too; None for a prompt shorter than one block."""
        if not self.block_hashes:
            return None
        return f"{self.model}:{self.block_hashes[min(blocks, len(self.block_hashes)) - 1]:016x}"


#: what `choose` routes one request by: a session key or prompt text, a prompt's block hashes, or nothing
RouteKey = str | PrefixKey | None


def json_body(body: bytes) -> dict[str, object] | None:
    """The body as a JSON object, or None (not JSON, not an object, or too large to parse for a key)."""
    if not body or len(body) > MAX_KEY_BODY_BYTES or body[:1] not in (b"{", b" ", b"\n"):
        return None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _prompt_text(doc: Mapping[str, object]) -> str | None:
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        return ",".join(str(p) for p in prompt) if all(isinstance(p, int) for p in prompt) else str(prompt[0])
    messages = doc.get("messages")
    if isinstance(messages, list):
        parts = [str(m.get("content", "")) for m in messages if isinstance(m, dict)]
        return "\n".join(parts) if parts else None
    return None


def request_key(policy: str, headers: Mapping[str, str], body: bytes, affinity_header: str) -> str | None:
    """The key `choose` needs for `policy`, or None (other policies, or nothing to key on)."""
    if policy == "affinity":
        header = headers.get(affinity_header)
        if header:
            return header
        doc = json_body(body)
        user = doc.get("user") if doc else None
        return user if isinstance(user, str) and user else None
    if policy == "prefix":
        doc = json_body(body)
        return _prompt_text(doc) if doc else None
    return None
