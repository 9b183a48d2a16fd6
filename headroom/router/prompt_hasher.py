"""Cache-aware routing, request side: a request's prompt as the engine's own KV block hashes.

The router loads each LLM model's tokenizer and chat template (the small files next to the weights, never the
weights), renders the request as the replica's OpenAI serving does (chat: the template over role/content,
encoded without special tokens; completion: a string encoded with them, or the token ids as sent), and
hashes the token ids in blocks of the model's `block_size_tokens` with `headroom.llm.block_hash`, under the
request's `cache_salt`. This is llm-d's precise prefix-cache scorer and Dynamo's KV router: tokenize in the
router, match against the hashes engines publish. A rendering that ever differed from the replica's would only
cost cache hits (the hashes would not match), never a wrong answer.

Tenants: the replica's gateway scopes the cache by tenant too. Replicas without API keys run every request as
their anonymous tenant and say which in their published blocks; the router hashes under it. With API keys on
the replicas, blocks never match and requests are routed by load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headroom.llm.block_hash import prefix_block_hashes, prefix_cache_key
from headroom.router.request_keys import PrefixKey, json_body

if TYPE_CHECKING:  # the tokenizer module imports torch; the router loads it only with cache_aware
    from headroom.llm.tokenizer import Tokenizer

#: at most this many leading prompt characters are tokenized (longer shared prefixes gain little more)
MAX_PROMPT_CHARS = 64 * 1024


@dataclass(frozen=True, slots=True)
class ModelTokenizer:
    """One model's tokenizer and KV block size."""

    tokenizer: Tokenizer
    block_size_tokens: int


class PromptHasher:
    """Turns request bodies into `PrefixKey`s for the models it has tokenizers for."""

    def __init__(self, models: Mapping[str, ModelTokenizer]) -> None:
        self.models = dict(models)

    def key(self, body: bytes, tenant: str = "") -> PrefixKey | None:
        """The request's key as a replica running it as `tenant` caches it; None when it names no known model
        or its prompt cannot be read."""
        doc = json_body(body)
        if doc is None:
            return None
        name = doc.get("model")
        if not isinstance(name, str):
            name = next(iter(self.models)) if len(self.models) == 1 else None
        model = self.models.get(name) if name else None
        if model is None or name is None:
            return None
        salt = doc.get("cache_salt")
        cache_key = prefix_cache_key(tenant, salt if isinstance(salt, str) else None)
        try:
            ids = _prompt_ids(model.tokenizer, doc)
            return None if ids is None else PrefixKey(name, tuple(prefix_block_hashes(ids, model.block_size_tokens,
                                                                                      cache_key)))
        except Exception:  # the template, tokenizer or hash failed on this input (token ids beyond int64, ...):
            return None  # route it by load; the replica answers it as it would without a router


def _text(content: object) -> str | None:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return None


def _prompt_ids(tok: Tokenizer, doc: Mapping[str, Any]) -> Sequence[int] | None:
    messages = doc.get("messages")
    if isinstance(messages, list):
        rendered = []
        for m in messages:
            text = _text(m.get("content")) if isinstance(m, dict) else None
            if text is None or not isinstance(m.get("role"), str):
                return None
            rendered.append({"role": m["role"], "content": text})
        return tok.encode(tok.apply_chat_template(rendered)[:MAX_PROMPT_CHARS], add_special_tokens=False)
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tok.encode(prompt[:MAX_PROMPT_CHARS])
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    return None


def load_prompt_hasher(model_repository: Path, models: Sequence[str] = ()) -> PromptHasher:
    """Tokenizers of the repository's LLM models (`models`: only these; empty = all). Reads each model's
    config.yaml and its tokenizer files (a GGUF's are extracted once into the cache, as `headroom serve` does)."""
    from headroom.llm.config import EngineConfig
    from headroom.llm.offline import DEFAULT_MODEL
    from headroom.llm.tokenizer import Tokenizer
    from headroom.llm.weights import gguf_cache, read_cached_config, resolve_model_path
    from headroom.models.config import load_model_config

    out: dict[str, ModelTokenizer] = {}
    for model_dir in sorted(p for p in model_repository.iterdir() if (p / "config.yaml").is_file()):
        if models and model_dir.name not in models:
            continue
        cfg = load_model_config(model_dir)
        if cfg.backend != "llm":
            continue
        params = dict(cfg.parameters)
        path = resolve_model_path(str(params.get("model") or params.get("gguf") or DEFAULT_MODEL))
        cache = params.get("cache_dir")
        if path.suffix == ".gguf":
            path = gguf_cache(path, Path(str(cache)).expanduser() / "llm" if cache else None, {})
        _, files = read_cached_config(path, {})
        name = str(params.get("served_model_name") or cfg.name)
        out[name] = ModelTokenizer(Tokenizer(files), EngineConfig.from_parameters(params).block_size_tokens)
    return PromptHasher(out)
