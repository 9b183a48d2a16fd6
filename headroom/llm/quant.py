"""Int8 weight quantisation for CPU: every `Linear` of a decoder becomes an FBGEMM dynamic-int8 linear.

Weights are quantised once, per output channel (symmetric, scale = max |w| / 127), and prepacked for FBGEMM;
activations are quantised on the fly per call (`reduce_range`, 7-bit, as AVX2 needs to avoid overflow).
Decode on CPU is memory-bound (one fp32 token step reads every weight once: ~0.54 GB for SmolLM2-135M), so
reading a quarter of the bytes is what makes int8 ~3x faster per matmul here.

Caveats (why it is opt-in, `weight_dtype: int8`): outputs differ slightly from fp32 (greedy text may diverge
after some tokens), and activation scales are per call (the whole flat batch), so a sequence's logits depend
a little on what else is in the step: outputs are not bit-identical across batch compositions or after
preemption by recompute. The embedding stays fp32 (a lookup reads one row); a tied `lm_head` gets its own
int8 copy.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from headroom.llm.model import Linear


class Int8DynamicLinear(nn.Module):
    """`y = x @ W^T + b` with W stored as prepacked per-channel int8 (FBGEMM), x quantised per call."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        w = weight.detach().float().contiguous()
        scales = (w.abs().amax(dim=1).clamp(min=1e-12) / 127.0).double()
        zero_points = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # quantized-tensor creation is flagged deprecated; FBGEMM still serves it
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(w, scales, zero_points, 0, torch.qint8)
            b = None if bias is None else bias.detach().float().contiguous()
            self._packed = torch.ops.quantized.linear_prepack(qweight, b)
        self.in_features = w.shape[1]  # input width
        self.out_features = w.shape[0]  # output width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out: torch.Tensor = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]), self._packed, True)
        return out.view(*shape[:-1], self.out_features)


def quantize_linears_int8(model: nn.Module) -> int:
    """Replace every `Linear` (our checkpoint linear or `nn.Linear`) under `model` in place; returns how many.

    Only for fp32 models on CPU: raises ValueError otherwise, saying what to change.
    """
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
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, Linear | nn.Linear)
    ]
    for parent, name, child in targets:
        bias = child.bias if isinstance(child.bias, torch.Tensor) else None
        setattr(parent, name, Int8DynamicLinear(child.weight, bias))
    return len(targets)
