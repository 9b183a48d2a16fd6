"""`tokenizer.json` straight from a GGUF's byte-level BPE vocabulary, without importing transformers.

A GGUF first start used to spend 6-20 s here in transformers' GGUF tokenizer converter (most of it importing
transformers). For the byte-level BPE vocabularies whose pre-tokenizer is GPT-2's own regex (`tokenizer.ggml.model
== "gpt2"` with `tokenizer.ggml.pre` in `PLAIN_BYTE_LEVEL`, e.g. SmolLM2's "smollm"), this builds the same
tokenizer with the `tokenizers` library alone (~0.5 s): BPE over the vocabulary (tokens spelled in GPT-2's byte
alphabet) and merges, ByteLevel pre-tokenizer and decoder, and the tokens the file marks CONTROL (type 3) as
special added tokens, USER_DEFINED (type 4) as plain added ones, exactly as transformers does
(`tests/llm/test_gguf_tokenizer.py` compares the two JSON files). Any other vocabulary returns None: the caller
then uses transformers' converter.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from headroom.llm.gguf_file import GGUFFile

TOKENIZER_ARRAYS = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"})
PLAIN_BYTE_LEVEL = ("smollm", "gpt-2")  # `tokenizer.ggml.pre` values that mean GPT-2's ByteLevel regex
_CONTROL, _USER_DEFINED = 3, 4


@cache
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (`bytes_to_unicode`)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def byte_level_tokenizer_json(gguf: GGUFFile) -> str | None:
    """The tokenizer as `tokenizer.json` text, or None when this GGUF's vocabulary is not plain byte-level BPE
    (`gguf` must have been read with `full_arrays=TOKENIZER_ARRAYS`)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens: list[str] | None = gguf.get("tokenizer.ggml.tokens")
    merges: list[str] | None = gguf.get("tokenizer.ggml.merges")
    if gguf.get("tokenizer.ggml.model") != "gpt2" or gguf.get("tokenizer.ggml.pre") not in PLAIN_BYTE_LEVEL:
        return None
    if not tokens or not merges:
        return None
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {
        tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8")): i
        for i, tok in enumerate(tokens)
    }
    split = [m.split(" ") for m in merges]
    if any(len(p) != 2 for p in split):
        return None
    pairs = [(a, b) for a, b in split]
    bpe = models.BPE(
        vocab=vocab, merges=pairs, dropout=None, unk_token=None, continuing_subword_prefix="",
        end_of_word_suffix="", fuse_unk=False, byte_fallback=False,
    )  # fmt: skip
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    # the stub of decoders.ByteLevel lacks the keyword arguments the library takes (and transformers writes)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)  # type: ignore[call-arg]
    tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    types: list[int] = gguf.get("tokenizer.ggml.token_type") or []
    control = [t for t, ty in zip(tokens, types, strict=False) if ty == _CONTROL and set(t) <= alphabet]
    if control:
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, ty in zip(tokens, types, strict=False) if ty == _USER_DEFINED and t in vocab]
    if user:
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    return str(tok.to_str())


def special_token_text(gguf: GGUFFile, key: str) -> str:
    """The text of the token whose id `tokenizer.ggml.<key>` names ("" when absent)."""
    tokens: list[str] | None = gguf.get("tokenizer.ggml.tokens")
    token_id: Any = gguf.get(f"tokenizer.ggml.{key}")
    if tokens is None or token_id is None or not 0 <= int(token_id) < len(tokens):
        return ""
    return tokens[int(token_id)]
