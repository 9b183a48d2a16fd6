"""torch.compile for the torch backend, with its compiled artifacts cached across restarts.

PyTorch's inductor keeps its on-disk caches in one process-wide directory (TORCHINDUCTOR_CACHE_DIR, read
from the environment; torch itself writes the variable back). Rather than mutate the environment per model,
headroom uses torch 2.13's portable "mega-cache": after a model is compiled, `torch.compiler.
save_cache_artifacts()` serialises the artifacts (inductor FX graphs, AOT-autograd entries) into one blob,
written to `<cache root>/torch/<model>-<key>.bin`; on a later start `torch.compiler.load_cache_artifacts()`
puts them back into inductor's caches before compiling, so inductor skips code generation and the C++ build.
The key covers the model, its module class, the weights file's size and mtime, torch's version, the
compile settings and torch's thread count (inductor's CPU kernels are generated for it). Delete the file
to force a fresh compilation.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import torch

from headroom.models.artifacts import ModelLoadError
from headroom.models.runtime import RuntimeConfig


def compiler_available() -> str | None:
    """None when inductor can build CPU kernels here, else why not (it needs a C++ compiler)."""
    if not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")):
        return "no C++ compiler found (inductor builds CPU kernels with g++ or clang++); install one"
    return None


def artifact_path(runtime: RuntimeConfig, model_name: str, parts: tuple[str, ...]) -> Path:
    """Where the compiled artifacts of this model under these settings are cached."""
    key = hashlib.sha256(
        "|".join((*parts, torch.__version__, runtime.compile_backend, runtime.compile_mode,
                  str(runtime.compile_dynamic), f"threads={torch.get_num_threads()}")).encode()
    )
    return runtime.cache_root() / "torch" / f"{model_name}-{key.hexdigest()[:16]}.bin"


def file_fingerprint(path: Path) -> str:
    """Cheap identity of a weights file or directory: name, size and mtime of each file."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)


def compile_module(module: torch.nn.Module, runtime: RuntimeConfig, where: str) -> torch.nn.Module:
    """torch.compile the module (compilation itself is lazy: it happens at the first call)."""
    if runtime.compile_backend == "inductor":
        missing = compiler_available()
        if missing is not None:
            raise ModelLoadError(f"{where}.runtime.mode: compile with the inductor backend is impossible: {missing}; "
                                 f"or set `compile_backend: aot_eager`, or `mode: eager`")
    mode = None if runtime.compile_mode == "default" else runtime.compile_mode
    compiled: torch.nn.Module = torch.compile(  # type: ignore[assignment]
        module, backend=runtime.compile_backend, mode=mode, dynamic=runtime.compile_dynamic
    )
    return compiled


def load_artifacts(path: Path) -> bool:
    """Hot-load cached compiled artifacts; False when there are none (or they are unreadable)."""
    if not path.is_file():
        return False
    try:
        return torch.compiler.load_cache_artifacts(path.read_bytes()) is not None
    except Exception:  # a corrupt or foreign file only costs a fresh compilation
        return False


def save_artifacts(path: Path) -> bool:
    """Write every compiled artifact of this process to `path` (atomically); False when there was none."""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None or not saved[0]:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_bytes(saved[0])
    os.replace(partial, path)
    return True
