"""The direct byte-level tokenizer builder gives transformers' GGUF converter's tokenizer.json, byte for byte in
JSON, and a fresh cache is made without importing transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from headroom.llm.gguf_file import read_gguf
from headroom.llm.gguf_tokenizer import TOKENIZER_ARRAYS, byte_level_tokenizer_json, special_token_text
from headroom.llm.offline import DEFAULT_MODEL
from headroom.llm.weights import resolve_model_path

REPO = Path(__file__).resolve().parents[2]


def test_smollm2_tokenizer_equals_transformers_gguf_converter() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    path = resolve_model_path(DEFAULT_MODEL)
    gguf = read_gguf(path, TOKENIZER_ARRAYS)
    ours = byte_level_tokenizer_json(gguf)
    assert ours is not None
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert json.loads(ours) == json.loads(theirs.backend_tokenizer.to_str())
    assert special_token_text(gguf, "bos_token_id") == theirs.bos_token == "<|im_start|>"
    assert special_token_text(gguf, "eos_token_id") == theirs.eos_token == "<|im_end|>"


def test_other_vocabularies_are_left_to_transformers() -> None:
    gguf = read_gguf(resolve_model_path(DEFAULT_MODEL))  # without the arrays: nothing to build from
    assert byte_level_tokenizer_json(gguf) is None


def test_first_start_builds_the_cache_without_transformers(tmp_path: Path) -> None:
    code = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from headroom.llm.native_weights import load_native\n"
        "t = time.monotonic()\n"
        f"ckpt = load_native({DEFAULT_MODEL!r}, Path({str(tmp_path)!r}))\n"
        "print(json.dumps({'s': time.monotonic() - t, 'transformers': 'transformers' in sys.modules,"
        " 'stages': ckpt.stages_s}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                          check=True)  # fmt: skip
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"first load into an empty cache: {got['s']:.2f} s, {got['stages']}")
    assert not got["transformers"] and "convert_tokenizer" in got["stages"]
    (cache,) = tmp_path.glob("SmolLM2-135M-Instruct.Q4_1-*")
    assert {"tokenizer.json", "tokenizer_config.json", "config.json", "done"} <= {f.name for f in cache.iterdir()}
    assert not (cache / "model.safetensors").exists()  # the fp32 copy is only for weight_dtype: fp32
