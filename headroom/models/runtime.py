"""The `runtime:` section of a model's config.yaml: which engine executes the model and its knobs.

    runtime:                           # every key optional
      # torch backend
      mode: compile                    # eager (default) | compile (torch.compile)
      compile_backend: inductor        # inductor (C++ codegen; needs a C++ compiler) | aot_eager | eager
      compile_mode: default            # default | reduce-overhead | max-autotune-no-cudagraphs | max-autotune
      compile_dynamic: true            # symbolic batch/sequence sizes: no recompilation per batch size
      compile_cache: true              # keep the compiled artifacts under cache_dir; a restart reuses them
      precision: fp32                  # fp32 | bf16 (weights and activations in bfloat16, outputs back in fp32)
      # onnxruntime backend
      graph_optimization_level: all    # disable | basic | extended | all
      inter_op_threads: 1              # threads across independent operators (0 = onnxruntime decides)
      execution_provider: CPUExecutionProvider
      optimized_model_cache: true      # save the optimized graph once, load it (unoptimized) on later starts
      # both
      intra_op_threads: 2              # onnxruntime intra-op threads / torch.set_num_threads (process-wide)
      cache_dir: ~/.cache/headroom     # root of the compiled-artifact caches (default $HEADROOM_CACHE_DIR)
      compute_nice: 10                 # nice value of the model's threads (0-19; 0 = the event loop's priority):
                                       # under overload the loop still admits, rejects and answers health checks
                                       # (headroom.core.compute_priority)

Values left out fall back to the backend's `parameters` (the older spelling of the onnxruntime knobs) and
then to the defaults above. Validation raises ValueError naming the file and key.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headroom.core.compute_priority import DEFAULT_COMPUTE_NICE, check_nice

TORCH_MODES = ("eager", "compile")
TORCH_PRECISIONS = ("fp32", "bf16")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
GRAPH_OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")
TORCH_KEYS = ("mode", "compile_backend", "compile_mode", "compile_dynamic", "compile_cache", "precision")
ONNX_KEYS = ("graph_optimization_level", "inter_op_threads", "execution_provider", "optimized_model_cache")
SHARED_KEYS = ("intra_op_threads", "cache_dir", "compute_nice")


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """How the backend runs the model (see the module docstring for the YAML)."""

    mode: str = "eager"  # torch: eager | compile
    compile_backend: str = "inductor"  # torch.compile backend
    compile_mode: str = "default"  # torch.compile mode
    compile_dynamic: bool = True  # torch.compile(dynamic=...): one graph for every batch size >= 2
    compile_cache: bool = True  # torch: persist compiled artifacts under cache_dir and reuse them
    precision: str = "fp32"  # torch: fp32 | bf16 (module and float inputs cast; float outputs back to fp32)
    graph_optimization_level: str | None = None  # onnxruntime; None = parameters' value or "all"
    intra_op_threads: int | None = None  # onnxruntime intra-op / torch threads; None = parameters' or default
    inter_op_threads: int | None = None  # onnxruntime inter-op threads; None = parameters' value or 0
    execution_provider: str = "CPUExecutionProvider"  # onnxruntime execution provider
    optimized_model_cache: bool = False  # onnxruntime: cache the optimized graph under cache_dir
    cache_dir: str = ""  # cache root; "" = $HEADROOM_CACHE_DIR or ~/.cache/headroom
    compute_nice: int = DEFAULT_COMPUTE_NICE  # nice value of the model's load, batch and preprocess threads

    def cache_root(self) -> Path:
        """The directory compiled artifacts go under (created on first write, not here)."""
        root = self.cache_dir or os.environ.get("HEADROOM_CACHE_DIR") or str(Path.home() / ".cache" / "headroom")
        return Path(root).expanduser() / "runtimes"


def _bool(raw: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _choice(raw: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str | None, where: str) -> Any:
    value = raw.get(key, default)
    if value is not None and value not in choices:
        raise ValueError(f"{where}.{key}: {value!r} is not one of {', '.join(choices)}")
    return value


def _threads(raw: Mapping[str, Any], key: str, where: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{where}.{key}: expected an integer >= 0 (0 = the runtime decides), got {value!r}")
    return value


def parse_runtime(raw: Any, backend: str, where: str) -> RuntimeConfig:
    """Validate the `runtime:` mapping for a model of `backend`; raises ValueError naming the key."""
    if raw is None:
        return RuntimeConfig()
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: must be a mapping, e.g. {{mode: compile}} or {{graph_optimization_level: all}}")
    known = (*TORCH_KEYS, *ONNX_KEYS, *SHARED_KEYS)
    unknown = sorted(set(raw) - set(known))
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), known, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"{where}: unknown keys {unknown}{hint} (known: {sorted(known)})")
    foreign = {"torch": ONNX_KEYS, "onnxruntime": TORCH_KEYS}.get(backend, (*TORCH_KEYS, *ONNX_KEYS))
    misplaced = sorted(k for k in raw if k in foreign)
    if misplaced:
        owner = "torch" if misplaced[0] in TORCH_KEYS else "onnxruntime"
        raise ValueError(
            f"{where}: {misplaced} only apply to the {owner} backend, and this model's backend is {backend!r}; "
            f"remove them or change `backend:`"
        )
    cache_dir = raw.get("cache_dir", "")
    if not isinstance(cache_dir, str):
        raise ValueError(f"{where}.cache_dir: expected a directory path, got {cache_dir!r}")
    provider = raw.get("execution_provider", "CPUExecutionProvider")
    if not isinstance(provider, str) or not provider.endswith("ExecutionProvider"):
        raise ValueError(
            f"{where}.execution_provider: expected an onnxruntime provider name such as CPUExecutionProvider, "
            f"got {provider!r}"
        )
    return RuntimeConfig(
        mode=_choice(raw, "mode", TORCH_MODES, "eager", where),
        compile_backend=_choice(raw, "compile_backend", COMPILE_BACKENDS, "inductor", where),
        compile_mode=_choice(raw, "compile_mode", COMPILE_MODES, "default", where),
        compile_dynamic=_bool(raw, "compile_dynamic", True, where),
        compile_cache=_bool(raw, "compile_cache", True, where),
        precision=_choice(raw, "precision", TORCH_PRECISIONS, "fp32", where),
        graph_optimization_level=_choice(raw, "graph_optimization_level", GRAPH_OPTIMIZATION_LEVELS, None, where),
        intra_op_threads=_threads(raw, "intra_op_threads", where),
        inter_op_threads=_threads(raw, "inter_op_threads", where),
        execution_provider=provider,
        optimized_model_cache=_bool(raw, "optimized_model_cache", False, where),
        cache_dir=cache_dir,
        compute_nice=check_nice(raw.get("compute_nice", DEFAULT_COMPUTE_NICE), f"{where}.compute_nice"),
    )
