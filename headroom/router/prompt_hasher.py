"""Cache-aware routing, request side: a request's prompt as the engine's own KV block hashes.

The router loads each LLM model's tokenizer and chat template (the small files next to the weights, never the
weights; the model's `parameters.chat_template` when its config.yaml sets one, as `headroom serve` does), renders
the request as the replica's OpenAI serving does (chat: the server's own functions, `template_messages` and
`chat_prompt_ids`, over everything the template renders: roles and contents, an assistant's `tool_calls`, a tool
message's `tool_call_id`, and the request's `tools` when the template renders tools; completion: a string encoded
with special tokens, or the token ids as sent), and hashes the token ids in blocks of the model's
`block_size_tokens` with `headroom.llm.block_hash`, under the request's `cache_salt`. This is llm-d's precise
prefix-cache scorer and Dynamo's KV router: tokenize in the router, match against the hashes engines publish. A
rendering that ever differed from the replica's would only cost cache hits (the hashes would not match), never a
wrong answer. `response_format`, `tool_choice` and the sampling fields constrain the output, not the prompt: they
leave the key unchanged, as they leave the replica's cached blocks (the same prompt under another schema reuses
them). A request the replica would refuse (tools for a template that does not render them, tool turns it cannot
take, a malformed message) gets no key.

Tenants: the replica's gateway scopes the cache by tenant too. Replicas without API keys run every request as
their anonymous tenant and say which in their published blocks; the router hashes under it. With API keys on
the replicas, blocks never match and requests are routed by load.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from headroom.llm.block_hash import prefix_block_hashes, prefix_cache_key
from headroom.llm.chat_messages import ToolTurns, probe_tool_turns, template_messages
from headroom.llm.openai_protocol import Message
from headroom.router.request_keys import PrefixKey, json_body

if TYPE_CHECKING:  # the tokenizer module imports torch; the router loads it only with cache_aware
    from headroom.llm.tokenizer import Tokenizer

#: a template that renders neither an assistant's tool_calls nor a tool's result (the hasher of a test tokenizer)
NO_TOOL_TURNS = ToolTurns(calls=False, results=False)
#: at most this many leading prompt characters are tokenized (longer shared prefixes gain little more)
MAX_PROMPT_CHARS = 64 * 1024


@dataclass(frozen=True, slots=True)
class ModelTokenizer:
    """One model's tokenizer and KV block size, and what its chat template renders of tools (`of` probes it)."""

    tokenizer: Tokenizer
    block_size_tokens: int
    tool_turns: ToolTurns = NO_TOOL_TURNS  # what it renders of an assistant's tool_calls and a tool's result
    renders_tools: bool = False  # the template renders a request's `tools`

    @classmethod
    def of(cls, tokenizer: Tokenizer, block_size_tokens: int) -> ModelTokenizer:
        """As the replica's serving sees the template (`OpenAIServing.attach`, `structured_output`)."""
        from headroom.llm.structured_output import template_supports_tools

        return cls(tokenizer, block_size_tokens, probe_tool_turns(tokenizer.apply_chat_template),
                   template_supports_tools(tokenizer.files.chat_template))


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
            ids = _prompt_ids(model, name, doc)
            return None if ids is None else PrefixKey(name, tuple(prefix_block_hashes(ids, model.block_size_tokens,
                                                                                      cache_key)))
        except Exception:  # the template, tokenizer or hash failed on this input (token ids beyond int64, ...):
            return None  # route it by load; the replica answers it as it would without a router


def _prompt_ids(model: ModelTokenizer, name: str, doc: Mapping[str, Any]) -> Sequence[int] | None:
    tok = model.tokenizer
    messages = doc.get("messages")
    if isinstance(messages, list):
        return _chat_ids(model, name, messages, doc.get("tools"))
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tok.encode(prompt[:MAX_PROMPT_CHARS])
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    return None


def _chat_ids(model: ModelTokenizer, name: str, messages: list[Any], tools: object) -> Sequence[int] | None:
    """The chat's prompt ids as `OpenAIServing.create_chat_completion` renders them; raises (no key) where the
    replica answers 400."""
    from headroom.llm.tokenizer import chat_prompt_ids

    if tools is not None and not (model.renders_tools and isinstance(tools, list)):
        return None  # the replica refuses tools its template does not render (400)
    typed = _messages_adapter().validate_python(messages)  # the request model's Message: its 400s raise here
    rendered = template_messages(typed, model.tool_turns, name)
    return chat_prompt_ids(model.tokenizer, rendered, tools, MAX_PROMPT_CHARS)


@functools.cache
def _messages_adapter() -> TypeAdapter[list[Message]]:
    return TypeAdapter(list[Message])


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
        template = params.get("chat_template")  # the template the replica renders instead of the model's own
        if isinstance(template, str):
            files = replace(files, chat_template=template)
        name = str(params.get("served_model_name") or cfg.name)
        out[name] = ModelTokenizer.of(Tokenizer(files), EngineConfig.from_parameters(params).block_size_tokens)
    return PromptHasher(out)
