"""Model configuration: one frozen dataclass per concern, parsed from `models/<name>/config.yaml`.

Example (all keys but `backend`, `inputs` and `outputs` optional)::

    backend: onnxruntime          # onnxruntime | torch | python | llm (generative, see headroom.llm)
    max_batch_size: 32            # 0 = the model does not batch; shapes then include every dimension
    inputs:
      - {name: input, datatype: FP32, shape: [1, 8, 8]}   # without the batch dimension when batching
      # - {name: tokens, datatype: INT64, shape: [-1], allow_ragged_batch: true}  # see Model.batch_key
    outputs:
      - {name: probabilities, datatype: FP32, shape: [10]}
    dynamic_batching:
      mode: dynamic               # dynamic | static | adaptive | multistream
      max_queue_delay_ms: 2
      preferred_batch_sizes: [8, 16, 32]
      max_queue_size: 256
      default_timeout_ms: 5000
      priority_levels: 2
    instances: 1
    warmup: {batch_sizes: [1, 8, 32]}
    version_policy: {latest: 1}   # {latest: N} | {all: {}} | {specific: [1, 3]}  (Triton's names)
    pinned: false                 # with `serve --model-memory-budget-mb`: always resident, never evicted
    runtime: {mode: compile}      # engine knobs: see headroom.models.runtime
    parameters: {labels: labels.txt}   # backend-specific

The YAML edge validates with ValueError carrying the file and key, so a user knows what to fix.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from headroom.core.parsed_file import parse_file
from headroom.core.types import V2_TO_NUMPY
from headroom.models.runtime import RuntimeConfig, parse_runtime

BACKENDS = ("onnxruntime", "torch", "python", "llm")
BATCHING_MODES = ("dynamic", "static", "adaptive", "multistream")
TOP_LEVEL_KEYS = ("backend", "platform", "max_batch_size", "inputs", "outputs", "dynamic_batching", "instances",
                  "warmup", "version_policy", "pinned", "runtime", "parameters")
TENSOR_KEYS = ("name", "datatype", "shape", "allow_ragged_batch")
WARMUP_KEYS = ("batch_sizes",)


def refuse_unknown_keys(raw: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    """ValueError naming the first unknown key of `raw`, with the closest known key (difflib) as a hint."""
    names = list(known)
    for key in raw:
        if key in names:
            continue
        close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"{where}: unknown key '{key}'{hint} (known: {', '.join(names)})")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A declared input or output."""

    name: str  # tensor name used on the wire
    datatype: str  # V2 datatype name
    shape: tuple[int, ...]  # per-item shape (no batch dim when max_batch_size > 0); -1 = any size
    allow_ragged_batch: bool = False  # inputs: requests of other sizes may share a batch (the model pads)


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """How the scheduler groups requests for this model (see headroom.batching.policy)."""

    mode: str = "dynamic"  # dynamic | static | adaptive | multistream
    max_queue_delay_ms: float = 2.0  # dynamic: longest the oldest queued request waits for company
    preferred_batch_sizes: tuple[int, ...] = ()  # close early at the largest formable preferred size
    max_queue_size: int = 256  # admission control: requests beyond this get 503 + Retry-After
    default_timeout_ms: float = 30_000.0  # deadline for a request that names none
    priority_levels: int = 1  # number of priority levels (1 = highest); FIFO within a level
    static_timeout_ms: float = 100.0  # static mode: safety timeout when a full batch never forms
    # the latency objective: admission refuses (503) a request whose predicted delay exceeds it, and the
    # adaptive window respects it; None: admission uses default_timeout_ms, the adaptive window 100 ms
    slo_p99_ms: float | None = None
    # the share of the latency budget admission keeps back for what the server cannot time: the network hop,
    # the response's write and the client's own read (admission targets (1 - this) x the budget)
    slo_reserve_fraction: float = 0.1
    # refusal pacing (headroom.batching.refusal_pacing): while refusals outnumber admissions more than this to 1
    # over the last second (clients re-sending without waiting for Retry-After), refusals are held before they
    # are answered; 0 turns it off
    refusal_pacing_ratio: float = 8.0
    sync_deadline_ms: float = 33.0  # multistream: how long a frame waits for its missing streams
    expected_streams: tuple[str, ...] = ()  # multistream: stream ids a complete frame carries


@dataclass(frozen=True, slots=True)
class WarmupConfig:
    """Warmup run at load; the model is not ready until it finishes."""

    batch_sizes: tuple[int, ...] = (1,)  # each batch size is executed once with synthetic inputs


VERSION_POLICY_KINDS = ("latest", "all", "specific")


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """Which numeric version directories of a model are served (Triton's version_policy)."""

    kind: str = "latest"  # latest | all | specific
    num_versions: int = 1  # latest: how many of the highest-numbered versions to serve
    versions: tuple[int, ...] = ()  # specific: exactly these versions

    def select(self, available: tuple[int, ...]) -> tuple[int, ...]:
        """The versions to serve out of those present on disk, ascending."""
        ordered = tuple(sorted(available))
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return tuple(v for v in ordered if v in self.versions)
        return ordered[-self.num_versions :] if ordered else ()


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Everything the server needs to serve one model."""

    name: str  # model name (the directory name)
    backend: str  # onnxruntime | torch | python
    inputs: tuple[TensorSpec, ...]  # declared inputs
    outputs: tuple[TensorSpec, ...]  # declared outputs
    max_batch_size: int = 0  # 0 = no batching dimension
    batching: BatchingConfig = field(default_factory=BatchingConfig)  # scheduler settings
    instances: int = 1  # concurrent executions (threads) of this model
    warmup: WarmupConfig = field(default_factory=WarmupConfig)  # warmup settings
    parameters: Mapping[str, Any] = field(default_factory=dict)  # backend-specific settings
    platform: str = ""  # free text reported in metadata (e.g. "onnxruntime_onnx")
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)  # which versions are served
    pinned: bool = False  # under `serve --model-memory-budget-mb`: loaded at start, never evicted
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)  # engine + knobs (headroom.models.runtime)

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)


def _tensor_specs(raw: Any, where: str) -> tuple[TensorSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}: must be a non-empty list of {{name, datatype, shape}}")
    specs = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ValueError(f"{where}[{i}]: must be a mapping with name, datatype, shape")
        refuse_unknown_keys(item, TENSOR_KEYS, f"{where}[{i}]")
        name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}[{i}].name: a non-empty string is required")
        if datatype not in V2_TO_NUMPY:
            raise ValueError(f"{where}[{i}].datatype: {datatype!r} is not one of {', '.join(V2_TO_NUMPY)}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and (d > 0 or d == -1) for d in shape):
            raise ValueError(f"{where}[{i}].shape: a list of positive ints or -1 is required, got {shape!r}")
        ragged = item.get("allow_ragged_batch", False)
        if not isinstance(ragged, bool):
            raise ValueError(f"{where}[{i}].allow_ragged_batch: true or false, got {ragged!r}")
        specs.append(TensorSpec(name=name, datatype=str(datatype), shape=tuple(shape), allow_ragged_batch=ragged))
    return tuple(specs)


def _batching(raw: Any, where: str) -> BatchingConfig:
    if raw is None:
        return BatchingConfig()
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: must be a mapping")
    refuse_unknown_keys(raw, BatchingConfig.__dataclass_fields__, where)
    kwargs = dict(raw)
    for key in ("preferred_batch_sizes", "expected_streams"):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])
    cfg = BatchingConfig(**kwargs)
    if cfg.mode not in BATCHING_MODES:
        raise ValueError(f"{where}.mode: {cfg.mode!r} is not one of {', '.join(BATCHING_MODES)}")
    if cfg.max_queue_delay_ms < 0 or cfg.max_queue_size < 1 or cfg.priority_levels < 1:
        raise ValueError(f"{where}: max_queue_delay_ms >= 0, max_queue_size >= 1, priority_levels >= 1")
    if cfg.default_timeout_ms <= 0:
        raise ValueError(f"{where}.default_timeout_ms: must be > 0")
    if cfg.slo_p99_ms is not None and not cfg.slo_p99_ms > 0:
        raise ValueError(f"{where}.slo_p99_ms: must be > 0 ms when set")
    reserve = cfg.slo_reserve_fraction
    if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not 0.0 <= reserve <= 0.5:
        raise ValueError(f"{where}.slo_reserve_fraction: must be within 0..0.5, got {cfg.slo_reserve_fraction!r}")
    ratio = cfg.refusal_pacing_ratio
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio < math.inf:
        raise ValueError(f"{where}.refusal_pacing_ratio: must be a number >= 0 (0: off), got {ratio!r}")
    if any(b < 1 for b in cfg.preferred_batch_sizes):
        raise ValueError(f"{where}.preferred_batch_sizes: every size must be >= 1")
    return cfg


def _version_policy(raw: Any, where: str) -> VersionPolicy:
    if raw is None:
        return VersionPolicy()
    if not isinstance(raw, Mapping) or len(raw) != 1 or next(iter(raw)) not in VERSION_POLICY_KINDS:
        raise ValueError(
            f"{where}: write exactly one of {{latest: N}}, {{all: {{}}}} or {{specific: [1, 2]}}, got {raw!r}"
        )
    kind, value = next(iter(raw.items()))
    if kind == "latest":
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}.latest: the number of versions must be an int >= 1, got {value!r}")
        return VersionPolicy(kind="latest", num_versions=value)
    if kind == "specific":
        if not isinstance(value, list) or not value or not all(isinstance(v, int) and v >= 0 for v in value):
            raise ValueError(f"{where}.specific: a non-empty list of versions is needed, got {value!r}")
        return VersionPolicy(kind="specific", versions=tuple(value))
    return VersionPolicy(kind="all")


def parse_model_config(raw: Mapping[str, Any], name: str, where: str = "config.yaml") -> ModelConfig:
    """Validate a parsed YAML mapping into a ModelConfig; raises ValueError naming the bad key."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: the top level must be a mapping")
    refuse_unknown_keys(raw, TOP_LEVEL_KEYS, where)
    backend = raw.get("backend")
    if backend not in BACKENDS:
        raise ValueError(f"{where}.backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    max_batch_size = int(raw.get("max_batch_size", 0))
    if max_batch_size < 0:
        raise ValueError(f"{where}.max_batch_size: must be >= 0")
    batching = _batching(raw.get("dynamic_batching"), f"{where}.dynamic_batching")
    if any(b > max(max_batch_size, 1) for b in batching.preferred_batch_sizes):
        raise ValueError(f"{where}.dynamic_batching.preferred_batch_sizes: sizes must be <= max_batch_size")
    warm_raw = raw.get("warmup") or {}
    if not isinstance(warm_raw, Mapping):
        raise ValueError(f"{where}.warmup: must be a mapping such as {{batch_sizes: [1, 8]}}")
    refuse_unknown_keys(warm_raw, WARMUP_KEYS, f"{where}.warmup")
    warmup = WarmupConfig(batch_sizes=tuple(int(b) for b in warm_raw.get("batch_sizes", (1,))))
    instances = int(raw.get("instances", 1))
    if instances < 1:
        raise ValueError(f"{where}.instances: must be >= 1")
    pinned = raw.get("pinned", False)
    if not isinstance(pinned, bool):
        raise ValueError(f"{where}.pinned: true or false, got {pinned!r}")
    params = raw.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"{where}.parameters: must be a mapping")
    return ModelConfig(
        name=name,
        backend=str(backend),
        inputs=_tensor_specs(raw.get("inputs"), f"{where}.inputs"),
        outputs=_tensor_specs(raw.get("outputs"), f"{where}.outputs"),
        max_batch_size=max_batch_size,
        batching=batching,
        instances=instances,
        warmup=warmup,
        parameters=dict(params),
        platform=str(raw.get("platform", backend)),
        version_policy=_version_policy(raw.get("version_policy"), f"{where}.version_policy"),
        pinned=pinned,
        runtime=parse_runtime(raw.get("runtime"), str(backend), f"{where}.runtime"),
    )


def load_model_config(model_dir: Path) -> ModelConfig:
    """Read and validate `<model_dir>/config.yaml`."""
    path = model_dir / "config.yaml"
    raw = parse_file(
        path,
        yaml.safe_load,
        yaml.YAMLError,
        f"{path}: missing; every model directory needs a config.yaml",
        lambda exc: f"{path}: not valid YAML: {exc}",
    )
    return parse_model_config(raw, model_dir.name, str(path))
