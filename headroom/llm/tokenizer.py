"""Tokenizer and chat template from the model's files (no hub access), plus incremental detokenisation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from headroom.llm.weights import TokenizerFiles
from headroom.protocol.openai_errors import FieldError


class Tokenizer:
    """Encodes prompts, renders chats with the model's Jinja2 template, decodes outputs."""

    def __init__(self, files: TokenizerFiles) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer as HFTokenizer

        self._tok = HFTokenizer.from_file(str(files.tokenizer_json))
        self.files = files
        self.eos_token_id = self._tok.token_to_id(files.eos_token) if files.eos_token else None
        self.bos_token_id = self._tok.token_to_id(files.bos_token) if files.bos_token else None
        self._template = None
        if files.chat_template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_exception  # HF templates refuse a conversation with it
            self._template = env.from_string(files.chat_template)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.files.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """Render a chat (with OpenAI's `tools`, for templates that render them); without a template, a plain
        `role: content` transcript."""
        if self._template is None:
            lines = [f"{m['role']}: {m['content']}" for m in messages]
            return "\n".join(lines) + ("\nassistant:" if add_generation_prompt else "")
        return str(
            self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.files.bos_token,
                eos_token=self.files.eos_token,
                **({"tools": list(tools)} if tools is not None else {}),
            )
        )


def render_chat(tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """`apply_chat_template` for a request: a conversation the template refuses (its `raise_exception`, or a
    value it cannot render) is a 400 naming `messages`, with the template's message."""
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, tools=tools)
    except (TemplateError, TypeError, ValueError) as exc:
        raise FieldError("messages", f"the model's chat template cannot render these messages: {exc}") from None


def chat_prompt_ids(tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] | None = None, max_chars: int | None = None) -> list[int]:
    """A chat request's prompt token ids: `render_chat`, encoded without special tokens (the template adds its
    own). The OpenAI serving and the router's prompt hasher both call this, so the router's block hashes are the
    engine's; `max_chars` (the router's) bounds the rendered text that is encoded."""
    text = render_chat(tokenizer, messages, tools)
    return tokenizer.encode(text if max_chars is None else text[:max_chars], add_special_tokens=False)


def _raise_exception(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)


class IncrementalDetokenizer:
    """Text of a growing token list; holds back a trailing incomplete UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.text = ""  # stable text emitted so far

    def update(self, output_ids: Sequence[int]) -> str:
        """Return the newly stable text after the output grew."""
        full = self.tokenizer.decode(output_ids)
        if full.endswith("\ufffd"):
            return ""
        delta = full[len(self.text) :] if full.startswith(self.text) else full
        self.text = full
        return delta
