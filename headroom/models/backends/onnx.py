"""The `onnxruntime` backend: one InferenceSession per loaded version, inputs and outputs mapped by name.

Parameters (all optional)::

    model_file: model.onnx            # relative to the version directory, absolute, or package:
    intra_op_threads: 0               # threads inside one operator (0 = onnxruntime decides)
    inter_op_threads: 0               # threads across independent operators (0 = onnxruntime decides)
    graph_optimization_level: all     # disable | basic | extended | all
    allow_spinning: true              # idle intra-op threads spin for work (lower latency, burns CPU)
"""

from __future__ import annotations

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


class OnnxModel(Model):
    """Runs an ONNX file with onnxruntime on the CPU."""

    _session: Any = None
    _output_names: list[str]

    def load(self, ctx: LoadContext) -> None:
        params = self.config.parameters
        where = f"model {self.config.name!r} ({ctx.version_dir})"
        path = resolve_artifact(str(params.get("model_file", "model.onnx")), ctx.version_dir, where)
        level_name = str(params.get("graph_optimization_level", "all"))
        if level_name not in _OPT_LEVELS:
            raise ModelLoadError(
                f"{where}.parameters.graph_optimization_level: {level_name!r} is not one of {', '.join(_OPT_LEVELS)}"
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = int_parameter(params, "intra_op_threads", 0, where)
        options.inter_op_num_threads = int_parameter(params, "inter_op_threads", 0, where)
        options.graph_optimization_level = _OPT_LEVELS[level_name]
        spinning = params.get("allow_spinning", True)
        if not isinstance(spinning, bool):
            raise ModelLoadError(f"{where}.parameters.allow_spinning: expected true or false, got {spinning!r}")
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        with ctx.stage("read_weights"):
            data = path.read_bytes()
        with ctx.stage("build_session"):
            try:
                session = ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])
            except Exception as exc:
                raise ModelLoadError(f"{path}: onnxruntime cannot load it: {exc}") from None
        self._check_names(session, path)
        self._session = session
        self._output_names = [o.name for o in session.get_outputs()]

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
