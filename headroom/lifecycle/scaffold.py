"""Repository tooling behind `headroom models add | pull | list`: scaffold, copy and survey model directories.

    add_onnx(repo, "mnist", Path("mnist.onnx"))                 # inputs/outputs read from the ONNX graph
    add_python(repo, "echo", Path("echo.py"), inputs=[parse_tensor_spec("x:FP32:2")], outputs=[...])
    pull(repo, "digits")                                         # a packaged default, built locally
    pull(repo, "/data/models/resnet", name="resnet")             # a model directory on disk
    survey(repo)                                                 # one ModelSurvey per directory

Every written config is validated by loading it back (the same check `headroom serve` does), and nothing is
left behind when that fails.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from headroom.core.types import NUMPY_TO_V2, V2_TO_NUMPY
from headroom.lifecycle.defaults import DEFAULT_CONFIGS, build_default
from headroom.lifecycle.drift_feed import REFERENCE_FILE
from headroom.lifecycle.memory_budget import model_size_bytes
from headroom.models.config import TensorSpec
from headroom.models.repository import ModelEntry, scan_entry


@dataclass(frozen=True, slots=True)
class GraphSignature:
    """What an ONNX graph declares, in config.yaml terms."""

    inputs: tuple[TensorSpec, ...]  # per-item shapes (batch dimension removed when `batched`)
    outputs: tuple[TensorSpec, ...]  # same for outputs
    batched: bool  # True when every input and output has a symbolic (dynamic) leading dimension


@dataclass(frozen=True, slots=True)
class ModelSurvey:
    """One directory of a repository, as `headroom models list` shows it."""

    name: str  # the directory name
    entry: ModelEntry | None  # the validated entry (None when the config is invalid)
    error: str  # why it is invalid (empty when valid)
    size_bytes: int  # bytes on disk of the served versions (the memory-budget estimate)
    drift_reference: bool  # the served version ships drift_reference.npz


def parse_tensor_spec(text: str) -> TensorSpec:
    """`name:DATATYPE:d1,d2` (dims may be -1; `name:BYTES:1`) -> TensorSpec; ValueError says the format."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0] or parts[1] not in V2_TO_NUMPY:
        raise ValueError(f"tensor {text!r}: write name:DATATYPE:dims, e.g. x:FP32:3,224,224 "
                         f"(DATATYPE one of {', '.join(V2_TO_NUMPY)})")
    try:
        shape = tuple(int(d) for d in parts[2].split(","))
    except ValueError:
        raise ValueError(f"tensor {text!r}: dims must be integers separated by commas (-1 = any)") from None
    if not all(d > 0 or d == -1 for d in shape):
        raise ValueError(f"tensor {text!r}: dims must be positive or -1")
    return TensorSpec(parts[0], parts[1], shape)


def onnx_signature(path: Path) -> GraphSignature:
    """Read the graph's inputs (initializers excluded) and outputs with their element types and shapes."""
    import onnx
    from onnx import helper

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:
        raise ValueError(f"{path}: not a readable ONNX model: {exc}") from None
    weights = {init.name for init in graph.initializer}

    def spec(value: Any) -> tuple[TensorSpec, bool]:
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise ValueError(f"{path}: {value.name!r} is not a tensor; write config.yaml by hand")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        datatype = "BYTES" if dtype.kind in "OSU" else NUMPY_TO_V2.get(dtype)
        if datatype is None:
            raise ValueError(f"{path}: {value.name!r} has element type {dtype}, which has no V2 datatype")
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tensor.shape.dim]
        dynamic_lead = bool(tensor.shape.dim) and dims[0] == -1
        return TensorSpec(value.name, datatype, tuple(dims)), dynamic_lead

    ins = [spec(v) for v in graph.input if v.name not in weights]
    outs = [spec(v) for v in graph.output]
    batched = all(lead for _, lead in ins + outs)
    strip = (lambda s: TensorSpec(s.name, s.datatype, s.shape[1:])) if batched else (lambda s: s)
    return GraphSignature(tuple(strip(s) for s, _ in ins), tuple(strip(s) for s, _ in outs), batched)


def _specs(specs: Sequence[TensorSpec]) -> list[dict[str, object]]:
    return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]


def _install(model_dir: Path, config: dict[str, Any], version: int, files: dict[str, Path], force: bool) -> Path:
    """Write config.yaml and copy `files` into <model_dir>/<version>/, then validate; undo on failure."""
    if model_dir.exists() and not force:
        raise ValueError(f"{model_dir} already exists; pass --force to overwrite it or choose another --name")
    existed = model_dir.exists()
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    try:
        (model_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        for dest, src in files.items():
            shutil.copy(src, version_dir / dest)
        scan_entry(model_dir)
    except Exception:
        if not existed:
            shutil.rmtree(model_dir, ignore_errors=True)
        raise
    return model_dir


def add_onnx(repo: Path, name: str, onnx_file: Path, max_batch_size: int = 32, version: int = 1,
             force: bool = False) -> Path:
    """Scaffold `<repo>/<name>/` serving `onnx_file` with onnxruntime; inputs/outputs from the graph."""
    sig = onnx_signature(onnx_file)
    config: dict[str, Any] = {
        "backend": "onnxruntime", "platform": "onnxruntime_onnx",
        "max_batch_size": max_batch_size if sig.batched else 0,
        "inputs": _specs(sig.inputs), "outputs": _specs(sig.outputs),
        "dynamic_batching": {"max_queue_delay_ms": 2},
        "warmup": {"batch_sizes": [1]},
        "parameters": {"model_file": "model.onnx"},
    }
    return _install(repo / name, config, version, {"model.onnx": onnx_file}, force)


def add_python(repo: Path, name: str, source: Path, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
               class_name: str = "", max_batch_size: int = 8, version: int = 1, force: bool = False) -> Path:
    """Scaffold `<repo>/<name>/` serving the class in `source` (copied to <version>/model.py)."""
    if not inputs or not outputs:
        raise ValueError("a Python model needs at least one --input and one --output (name:DATATYPE:dims)")
    config: dict[str, Any] = {
        "backend": "python", "max_batch_size": max_batch_size,
        "inputs": _specs(inputs), "outputs": _specs(outputs),
        "dynamic_batching": {"max_queue_delay_ms": 2},
        "warmup": {"batch_sizes": [1]},
    }
    if class_name:
        config["parameters"] = {"class_name": class_name}
    return _install(repo / name, config, version, {"model.py": source}, force)


def pull(repo: Path, source: str, name: str = "", force: bool = False) -> tuple[Path, str]:
    """Install a model from a local directory (with config.yaml) or a packaged default; returns (dir, summary)."""
    path = Path(source)
    if path.is_dir():
        scan_entry(path)  # refuse a broken model before copying it
        dest = repo / (name or path.name)
        if dest.exists() and not force:
            raise ValueError(f"{dest} already exists; pass --force to overwrite it or choose another --name")
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(path, dest, symlinks=False)
        return dest, f"copied from {path}"
    if source not in DEFAULT_CONFIGS:
        raise ValueError(f"{source!r} is neither a model directory (with config.yaml) nor a packaged default "
                         f"({', '.join(DEFAULT_CONFIGS)})")
    dest = repo / (name or source)
    if dest.exists() and not force:
        raise ValueError(f"{dest} already exists; pass --force to overwrite it or choose another --name")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(DEFAULT_CONFIGS[source])
    summary = build_default(source, dest / "1")
    scan_entry(dest)
    return dest, summary


def survey(repo: Path) -> list[ModelSurvey]:
    """Every model directory of `repo`, valid or not, with its size and drift reference."""
    if not repo.is_dir():
        raise ValueError(f"model repository {repo} does not exist; create it or run `headroom models pull digits`")
    rows: list[ModelSurvey] = []
    for directory in sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        if not (directory / "config.yaml").exists():
            continue
        try:
            entry = scan_entry(directory)
        except ValueError as exc:
            rows.append(ModelSurvey(directory.name, None, str(exc), 0, False))
            continue
        size = sum(model_size_bytes(entry.version_dir(v)) for v in entry.versions)
        drift = any((entry.version_dir(v) / REFERENCE_FILE).is_file() for v in entry.versions)
        rows.append(ModelSurvey(entry.name, entry, "", size, drift))
    return rows
