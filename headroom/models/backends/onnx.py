"""The `onnxruntime` backend: one InferenceSession per loaded version, inputs and outputs mapped by name.

Knobs come from the model's `runtime:` section (headroom.models.runtime) or, in the older spelling, from
`parameters` (all optional)::

    model_file: model.onnx            # relative to the version directory, absolute, or package:
    intra_op_threads: 0               # threads inside one operator (0 = onnxruntime decides)
    inter_op_threads: 0               # threads across independent operators (> 1 turns on ORT_PARALLEL)
    graph_optimization_level: all     # disable | basic | extended | all
    allow_spinning: true              # idle intra-op threads spin for work (lower latency, burns CPU)

`runtime: {optimized_model_cache: true}` saves the optimized graph (SessionOptions.optimized_model_filepath)
under `<cache root>/onnx/` the first time, keyed by the model bytes, the settings, onnxruntime's version and
the CPU (architecture, model and flags: level `all` emits CPU-specific kernels); later loads read that file
with graph optimizations off (they are already applied). `OnnxModel.optimized_graph_cache` says which
happened ("miss (written)" or "hit"); the `build_session` cold-start stage shows the time saved.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from headroom.core.errors import InvalidRequest
from headroom.models.artifacts import ModelLoadError, int_parameter, resolve_artifact
from headroom.models.base import Arrays, LoadContext, Model

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def optimized_graph_path(cache_root: Path, model_name: str, data: bytes, settings: str) -> Path:
    """Where the optimized graph of these model bytes under these settings is cached.

    The key covers what changes the optimized graph: the model bytes, the optimization level and
    provider, onnxruntime's version and the CPU architecture (level `all` emits CPU-specific kernels).
    """
    key = hashlib.sha256(data)
    key.update(f"{settings}|ort={ort.__version__}|{platform.machine()}|{cpu_signature()}".encode())
    return cache_root / "onnx" / f"{model_name}-{key.hexdigest()[:16]}.onnx"


def cpu_signature() -> str:
    """The CPU model and instruction-set flags (Linux /proc/cpuinfo; "" elsewhere): kernels depend on them."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:16]


class OnnxModel(Model):
    """Runs an ONNX file with onnxruntime on the CPU."""

    _session: Any = None
    _output_names: list[str]
    #: what the optimized-graph cache did at the last load: "", "miss (written)", "hit"
    optimized_graph_cache: str = ""

    def _session_options(self, where: str) -> tuple[Any, str, str]:
        """SessionOptions from runtime + parameters, the level's name and the execution provider."""
        params, runtime = self.config.parameters, self.config.runtime
        level_name = runtime.graph_optimization_level or str(params.get("graph_optimization_level", "all"))
        if level_name not in _OPT_LEVELS:
            raise ModelLoadError(
                f"{where}.parameters.graph_optimization_level: {level_name!r} is not one of {', '.join(_OPT_LEVELS)}"
            )
        provider = runtime.execution_provider
        available = ort.get_available_providers()
        if provider not in available:
            raise ModelLoadError(
                f"{where}.runtime.execution_provider: {provider!r} is not available in this onnxruntime build "
                f"(available: {', '.join(available)}); install the matching onnxruntime package or use "
                f"CPUExecutionProvider"
            )
        options = ort.SessionOptions()
        intra = runtime.intra_op_threads
        inter = runtime.inter_op_threads
        options.intra_op_num_threads = intra if intra is not None else int_parameter(
            params, "intra_op_threads", 0, where)
        options.inter_op_num_threads = inter if inter is not None else int_parameter(
            params, "inter_op_threads", 0, where)
        if options.inter_op_num_threads > 1:  # inter-op threads only work in parallel execution mode
            options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        options.graph_optimization_level = _OPT_LEVELS[level_name]
        spinning = params.get("allow_spinning", True)
        if not isinstance(spinning, bool):
            raise ModelLoadError(f"{where}.parameters.allow_spinning: expected true or false, got {spinning!r}")
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        return options, level_name, provider

    def load(self, ctx: LoadContext) -> None:
        params = self.config.parameters
        where = f"model {self.config.name!r} ({ctx.version_dir})"
        path = resolve_artifact(str(params.get("model_file", "model.onnx")), ctx.version_dir, where)
        options, level_name, provider = self._session_options(where)
        with ctx.stage("read_weights"):
            data = path.read_bytes()
        cached: Path | None = None
        if self.config.runtime.optimized_model_cache:
            cached = optimized_graph_path(self.config.runtime.cache_root(), self.config.name, data,
                                          f"{level_name}|{provider}")
        with ctx.stage("build_session"):
            session = self._build_session(data, options, provider, cached, path)
        self._check_names(session, path)
        self._session = session
        self._output_names = [o.name for o in session.get_outputs()]

    def _build_session(self, data: bytes, options: Any, provider: str, cached: Path | None, path: Path) -> Any:
        """The session from the source bytes, or from the cached optimized graph when there is one."""
        hit = cached is not None and cached.is_file()
        partial: Path | None = None
        if cached is not None and hit:
            # already optimized: skip the optimizer (that is what the cache saves) and load the saved graph
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        elif cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_name(f".{cached.name}.{os.getpid()}.partial")
            options.optimized_model_filepath = str(partial)
        try:
            session = ort.InferenceSession(str(cached) if hit else data, sess_options=options, providers=[provider])
        except Exception as exc:
            hint = "; delete this cached file to rebuild it" if hit else ""
            raise ModelLoadError(f"{cached if hit else path}: onnxruntime cannot load it: {exc}{hint}") from None
        if partial is not None and cached is not None:
            os.replace(partial, cached)  # atomic: a concurrent or interrupted load never leaves half a file
        self.optimized_graph_cache = "hit" if hit else "miss (written)" if partial is not None else ""
        return session

    def _check_names(self, session: Any, path: object) -> None:
        graph_inputs = {i.name for i in session.get_inputs()}
        graph_outputs = {o.name for o in session.get_outputs()}
        wanted_inputs = {t.name for t in self.config.inputs}
        if self.model_inputs_match_config and wanted_inputs != graph_inputs:
            raise ModelLoadError(
                f"{path}: the graph's inputs are {sorted(graph_inputs)} but config.yaml declares "
                f"{sorted(wanted_inputs)}; rename the inputs in config.yaml to match the graph"
            )
        missing = {t.name for t in self.config.outputs} - graph_outputs
        if self.model_outputs_match_config and missing:
            raise ModelLoadError(
                f"{path}: config.yaml declares outputs {sorted(missing)} that the graph does not produce "
                f"(it produces {sorted(graph_outputs)}); fix the output names in config.yaml"
            )

    #: Subclasses whose preprocess/postprocess rename tensors turn these checks off.
    model_inputs_match_config = True
    model_outputs_match_config = True

    def predict(self, batch: Arrays) -> Arrays:
        if self._session is None:
            raise RuntimeError(f"model {self.config.name!r} used before load()")
        feeds = {name: np.ascontiguousarray(value) for name, value in batch.items()}
        try:
            results = self._session.run(self._output_names, feeds)
        except Exception as exc:  # onnxruntime raises its own types for shape/dtype mismatches
            raise InvalidRequest(f"model {self.config.name!r} rejected the batch: {exc}") from None
        return dict(zip(self._output_names, results, strict=True))

    def unload(self) -> None:
        self._session = None
