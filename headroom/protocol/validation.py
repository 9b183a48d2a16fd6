"""Check a decoded request against the model's declared inputs and outputs (transport-independent).

Rules: every declared input is present exactly once and nothing else is; datatypes match exactly; when the
model batches (`max_batch_size > 0`) each input has one extra leading dimension, the batch, which is the same
for every input and lies in [1, max_batch_size]; other dimensions match the config, where -1 accepts any size.
Requested outputs must be declared outputs.
"""

from __future__ import annotations

from headroom.core.errors import InvalidRequest
from headroom.core.types import InferenceRequest
from headroom.models.config import ModelConfig, TensorSpec


def _expected_shape(spec: TensorSpec, batching: bool) -> str:
    dims = ["-1" if d == -1 else str(d) for d in spec.shape]
    return "[" + ", ".join(["batch", *dims] if batching else dims) + "]"


def batch_size_of(request: InferenceRequest, config: ModelConfig) -> int:
    """How many batch items the request carries (1 for a model that does not batch)."""
    if config.max_batch_size <= 0 or not request.inputs:
        return 1
    return request.inputs[0].shape[0]


def _declared(config: ModelConfig) -> str:
    batching = config.max_batch_size > 0
    return ", ".join(f"{s.name} ({s.datatype} {_expected_shape(s, batching)})" for s in config.inputs)


def check_input(config: ModelConfig, name: str, datatype: str, shape: tuple[int, ...]) -> None:
    """Raise InvalidRequest unless one input's name, datatype and shape fit the config.

    The decoders call this as soon as an input's header is read, before its data is decoded, so nothing is
    allocated for a shape the model cannot take.
    """
    spec = config.input(name)
    model = f"model {config.name!r}"
    batching = config.max_batch_size > 0
    if spec is None:
        raise InvalidRequest(f"{model}: unknown input {name!r}; it expects {_declared(config)}")
    if datatype != spec.datatype:
        raise InvalidRequest(f"{model}, input {name!r}: datatype {datatype} but the model expects {spec.datatype}")
    dims = shape
    if batching:
        if len(dims) != len(spec.shape) + 1:
            raise InvalidRequest(f"{model}, input {name!r}: shape {list(shape)!r:.200} but the model "
                                 f"expects {_expected_shape(spec, batching)}")
        if not 1 <= dims[0] <= config.max_batch_size:
            raise InvalidRequest(
                f"{model}, input {name!r}: batch dimension {dims[0]} must be between 1 and "
                f"max_batch_size {config.max_batch_size}; split larger requests"
            )
        dims = dims[1:]
    if len(dims) != len(spec.shape) or any(d != s and s != -1 for d, s in zip(dims, spec.shape, strict=True)):
        raise InvalidRequest(f"{model}, input {name!r}: shape {list(shape)!r:.200} but the model "
                             f"expects {_expected_shape(spec, batching)}")


def validate_against(request: InferenceRequest, config: ModelConfig) -> None:
    """Raise InvalidRequest unless the request's inputs and outputs fit the model's config."""
    # Error messages are built only when a check fails: this runs on every request.
    model = f"model {config.name!r}"
    given = {t.name for t in request.inputs}
    for declared_spec in config.inputs:
        if declared_spec.name not in given:
            raise InvalidRequest(f"{model}: missing input {declared_spec.name!r}; it expects {_declared(config)}")
    batch: int | None = None
    for tensor in request.inputs:
        check_input(config, tensor.name, tensor.datatype, tensor.shape)
        if config.max_batch_size > 0:
            if batch is not None and tensor.shape[0] != batch:
                raise InvalidRequest(f"{model}, input {tensor.name!r}: batch dimension {tensor.shape[0]} differs "
                                     f"from other inputs' {batch}")
            batch = tensor.shape[0]
    for output in request.outputs:
        if config.output(output.name) is None:
            names = ", ".join(s.name for s in config.outputs)
            raise InvalidRequest(f"{model}: unknown output {output.name!r}; it has {names}")
