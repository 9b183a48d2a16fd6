"""Native loading: the GGUF's own blocks under HF names (equal to the fp32 conversion once dequantised), memory-
mapped, no fp32 copy made (a fresh process's peak RSS), and the modes `weight_dtype` picks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from headroom.llm.config import EngineConfig
from headroom.llm.native_weights import load_native
from headroom.llm.offline import DEFAULT_MODEL, weight_mode
from headroom.llm.weights import LoadedCheckpoint, resolve_model_path

REPO = Path(__file__).resolve().parents[2]


def test_blocks_dequantise_to_the_fp32_reference_weights(smollm2: LoadedCheckpoint) -> None:
    native = load_native(DEFAULT_MODEL)
    assert native.weight_format == "gguf:Q4_1+Q8_0"
    assert native.matrices["lm_head.weight"] is native.matrices["model.embed_tokens.weight"]  # tied: one tensor
    q = native.matrices["model.layers.0.self_attn.q_proj.weight"]
    assert (q.fmt, q.rows, q.cols) == ("Q4_1", 576, 576)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.7.self_attn.k_proj.weight",
                 "model.layers.29.mlp.down_proj.weight", "model.embed_tokens.weight"):  # fmt: skip
        assert np.array_equal(native.matrices[name].dequantize(), smollm2.state_dict[name].numpy()), name
    for name, vec in native.vectors.items():
        assert np.array_equal(vec, smollm2.state_dict[name].numpy()), name
    up = native.matrices["model.layers.3.mlp.up_proj.weight"].data
    assert isinstance(up.base, np.memmap) or isinstance(up, np.memmap)  # a view of the file, not a copy


def test_weight_mode_native_for_gguf_on_cpu_else_fp32(tmp_path: Path) -> None:
    gguf = resolve_model_path(DEFAULT_MODEL)
    cpu = "cpu"
    assert weight_mode(EngineConfig(), cpu, gguf) == "native"
    assert weight_mode(EngineConfig(weight_dtype="fp32"), cpu, gguf) == "fp32"
    assert weight_mode(EngineConfig(), cpu, tmp_path) == "fp32"  # an HF directory
    assert weight_mode(EngineConfig(), "cuda", gguf) == "fp32"  # bf16 on a GPU, as before
    with pytest.raises(ValueError, match="CPU only"):
        weight_mode(EngineConfig(weight_dtype="native"), "cuda", gguf)
    with pytest.raises(ValueError, match=r"GGUF files only.*weight_dtype: fp32"):
        load_native(str(tmp_path))
    with pytest.raises(ValueError, match="weight_dtype 'int8'"):
        EngineConfig(weight_dtype="int8").validate()


def test_fresh_process_serving_natively_never_holds_an_fp32_copy() -> None:
    """Peak RSS of a process that loads the default and generates stays far below the weights' fp32 size
    (`VmHWM`: the process's own high-water mark; `ru_maxrss` would carry the forking pytest's across exec)."""
    code = (
        "import json\n"
        "from headroom.llm.offline import LLM\n"
        "from headroom.llm.request import SamplingParams\n"
        "def kib(key):\n"
        "    return int(open('/proc/self/status').read().split(key + ':')[1].split()[0]) * 1024\n"
        "before = kib('VmHWM')\n"
        "llm = LLM(kv_cache_memory_mb=16, num_threads=1)\n"
        "out = llm.generate(['Once upon a time'], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))\n"
        "peak = kib('VmHWM')\n"
        "print(json.dumps({'before': before, 'peak': peak, 'fmt': llm.load_report.weight_format,"
        " 'stages': dict(llm.load_report.stages_s), 'tokens': len(out[0].outputs[0].token_ids)}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO, check=True
    )
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    native = load_native(DEFAULT_MODEL)
    fp32_bytes = 4 * sum(q.rows * q.cols for q in {id(q): q for q in native.matrices.values()}.values())
    assert fp32_bytes > 500e6  # SmolLM2 dequantised: ~540 MB
    grown = got["peak"] - got["before"]
    print(f"peak RSS {got['peak'] / 2**20:.0f} MiB, +{grown / 2**20:.0f} MiB for load + generate; {got['stages']}")
    assert got["fmt"] == "gguf:Q4_1+Q8_0" and got["tokens"] == 4
    assert grown < fp32_bytes / 2  # the mapped file (98 MB) + a small K/V pool + working memory
