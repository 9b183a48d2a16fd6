"""The GGUF conversion cache: stale conversions of the same file are removed, nothing else is."""

from __future__ import annotations

from pathlib import Path

from headroom.llm.weights import SOURCE_FILE, prune_stale_conversions


def _conversion(root: Path, name: str, source: str | None, done: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"x")
    if source is not None:
        (d / SOURCE_FILE).write_text(source)
    if done:
        (d / "done").write_text("ok\n")
    return d


def test_prune_removes_only_finished_older_conversions_of_the_same_file(tmp_path: Path) -> None:
    root = tmp_path / "llm"
    gguf = tmp_path / "pkg" / "Model.Q4.gguf"
    keep = _conversion(root, "Model.Q4-aaaa", str(gguf))
    stale = _conversion(root, "Model.Q4-bbbb", str(gguf))
    other_file = _conversion(root, "Model.Q4-cccc", str(tmp_path / "elsewhere" / "Model.Q4.gguf"))
    legacy = _conversion(root, "Model.Q4-dddd", None)  # made before the source was recorded
    in_progress = _conversion(root, "Model.Q4-eeee", str(gguf), done=False)
    other_model = _conversion(root, "Other-ffff", str(gguf))
    removed = prune_stale_conversions(root, gguf, keep)
    assert removed == [stale]
    assert not stale.exists()
    for survivor in (keep, other_file, legacy, in_progress, other_model):
        assert survivor.exists()
    assert prune_stale_conversions(root, gguf, keep) == []  # idempotent
