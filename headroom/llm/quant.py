"""Int8 weight quantisation for CPU: every `Linear` of a decoder becomes an FBGEMM dynamic-int8 linear.

Weights are quantised once, per output channel (symmetric, scale = max |w| / 127, `quantize_weight_int8`),
and prepacked for FBGEMM; activations are quantised on the fly per call (`reduce_range`, 7-bit, as AVX2
needs to avoid overflow). Decode on CPU is memory-bound (one fp32 token step reads every weight once:
~0.54 GB for SmolLM2-135M), so reading a quarter of the bytes is what makes int8 ~3x faster per matmul here.

The quantised weights of the *fused* model (`int8_state_dict`) are cached next to a converted GGUF
(`model.int8.safetensors`, keys `headroom.int8.<linear>.weight` / `.scale` / `.bias`); `prepare_int8` then
builds the int8 linears from them without concatenating or quantising fp32 weights at start-up. Cached and
on-the-fly quantisation run the same function, so both give identical outputs.

Small decode steps skip these modules: `headroom.llm.kernels.int8_decode` runs them in one C call on the same int8
weights (`qweight`/`scales`), with activations quantised per row (`decode_backend`).

Caveats (why it is opt-in, `weight_dtype: int8` or `int8_on_cpu`): outputs differ slightly from fp32
(greedy text may diverge after some tokens), and activation scales are per call (the whole flat batch), so a
sequence's logits depend a little on what else is in the step: outputs are not bit-identical across batch
compositions, prefix-cache hits (fewer rows prefilled) or preemption by recompute. The embedding stays fp32
(a lookup reads one row); a tied `lm_head` gets its own int8 copy. (`torch._weight_int8pack_mm`, weight-only
int8 with fp32 activations, was measured 6-100x slower than this on the AVX2 CPU, and 2-10x slower with bf16
activations beyond batch 1.)
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from headroom.llm.model import EXTRA_PREFIX, DecoderForCausalLM, Linear

INT8_PREFIX = EXTRA_PREFIX + "int8."  # checkpoint keys of cached int8 linears: INT8_PREFIX + "<linear>.weight"


def quantize_weight_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: (int8 [N, K], fp32 scales [N]) with weight ~= int8 * scale[:, None]."""
    w = weight.detach().float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.div(w, scales[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scales.contiguous()


class Int8DynamicLinear(nn.Module):
    """`y = x @ W^T + b` with W stored as prepacked per-channel int8 (FBGEMM), x quantised per call."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        q, scales = quantize_weight_int8(weight)
        self._init_packed(q, scales, bias)

    @classmethod
    def from_int8(cls, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> Int8DynamicLinear:
        """From `quantize_weight_int8`'s output (e.g. read back from the cache)."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self._init_packed(qweight, scales, bias)
        return self

    def _init_packed(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        zero_points = torch.zeros(q.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # quantized-tensor creation is flagged deprecated; FBGEMM still serves it
            warnings.simplefilter("ignore")
            qweight = torch._make_per_channel_quantized_tensor(q, scales.double(), zero_points, 0)
            b = None if bias is None else bias.detach().float().contiguous()
            self._packed = torch.ops.quantized.linear_prepack(qweight, b)
        self.in_features = q.shape[1]  # input width
        self.out_features = q.shape[0]  # output width
        # the plain int8 weights, scales and bias too, for the C decode step (headroom.llm.kernels.int8_decode);
        # read from the int8 cache they are views of the memory-mapped file (page cache, not process memory)
        self.qweight = q.contiguous()  # [out, in] int8
        self.scales = scales.float().contiguous()  # [out] fp32
        self.bias_fp32 = b  # [out] fp32 or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # the decoder's flat batch: no reshapes (each costs as much as a small kernel here)
            flat: torch.Tensor = torch.ops.quantized.linear_dynamic(x, self._packed, True)
            return flat
        shape = x.shape
        out: torch.Tensor = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]), self._packed, True)
        return out.view(*shape[:-1], self.out_features)


def _check_cpu_fp32(model: nn.Module) -> None:
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32:
        raise ValueError(
            f"weight_dtype: int8 needs a float32 model on CPU (got {param.dtype} on {param.device}); "
            "use device: cpu with dtype: auto/float32, or weight_dtype: auto"
        )
    if "fbgemm" not in torch.backends.quantized.supported_engines and "x86" not in (
        torch.backends.quantized.supported_engines
    ):
        raise ValueError("this torch build has no FBGEMM/x86 quantized engine; use weight_dtype: auto")


def _linears(model: nn.Module) -> list[tuple[nn.Module, str, str, torch.Tensor, torch.Tensor | None]]:
    """(parent, attribute, qualified name, weight, bias) for every Linear under `model`."""
    return [
        (
            parent,
            name,
            f"{prefix}.{name}" if prefix else name,
            child.weight,
            child.bias if isinstance(child.bias, torch.Tensor) else None,
        )
        for prefix, parent in model.named_modules()
        for name, child in parent.named_children()
        if isinstance(child, Linear | nn.Linear)
    ]


def quantize_linears_int8(model: nn.Module) -> int:
    """Replace every `Linear` (our checkpoint linear or `nn.Linear`) under `model` in place; returns how many.

    Only for fp32 models on CPU: raises ValueError otherwise, saying what to change.
    """
    _check_cpu_fp32(model)
    targets = _linears(model)
    for parent, name, _, weight, bias in targets:
        setattr(parent, name, Int8DynamicLinear(weight, bias))
    return len(targets)


def int8_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The quantised weights of every Linear under a (fused) model, as checkpoint tensors to cache."""
    out: dict[str, torch.Tensor] = {}
    for _, _, qual, weight, bias in _linears(model):
        q, scales = quantize_weight_int8(weight)
        out[f"{INT8_PREFIX}{qual}.weight"], out[f"{INT8_PREFIX}{qual}.scale"] = q, scales
        if bias is not None:
            out[f"{INT8_PREFIX}{qual}.bias"] = bias.detach().float().contiguous()
    return out


def prepare_int8(model: DecoderForCausalLM, cached: Mapping[str, torch.Tensor]) -> int:
    """Fuse projections and make every Linear int8, in place; returns how many linears came from `cached`
    (`headroom.int8.*` tensors: `model.extra_tensors`). Fused projections found in the cache are built
    directly (no fp32 concatenation); anything missing is fused and quantised from the fp32 weights."""
    _check_cpu_fp32(model)
    suffix = ".weight"
    names = sorted(
        {k[len(INT8_PREFIX) : -len(suffix)] for k in cached if k.startswith(INT8_PREFIX) and k.endswith(suffix)}
    )

    def build(name: str) -> Int8DynamicLinear:
        return Int8DynamicLinear.from_int8(
            cached[f"{INT8_PREFIX}{name}.weight"],
            cached[f"{INT8_PREFIX}{name}.scale"],
            cached.get(f"{INT8_PREFIX}{name}.bias"),
        )

    # FBGEMM's prepacking is most of an int8 cold start (~0.95 s for SmolLM2, 0.35 s of it the lm_head) and
    # releases the GIL: one thread per CPU (measured 0.54-0.69 s on 2)
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        built = dict(zip(names, pool.map(build, names), strict=True))
    model.fuse_projections(built)
    for parent, name, qual, weight, bias in _linears(model):
        mod = built.get(qual)
        if mod is not None and (mod.out_features, mod.in_features) == tuple(weight.shape):
            setattr(parent, name, mod)
        else:
            setattr(parent, name, Int8DynamicLinear(weight, bias))
    return len(built)
