"""Where the LLM runs and in which dtype, decided without importing torch unless a GPU may be there.

`device: auto` (the shipped config) asks torch whether CUDA works only when the machine shows a GPU driver's
device files; on a machine without any, the answer is the CPU and the native runner starts without torch at all
(importing torch costs 1.4-1.9 s of CPU on a small machine, most of a cold start).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headroom.llm.config import EngineConfig

# device files a GPU driver creates (NVIDIA, AMD ROCm, WSL's GPU paravirtualisation); torch cannot see a GPU
# without one of them
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


@dataclass(frozen=True, slots=True)
class Placement:
    """The resolved device and dtype, by name (torch's names: "cpu" | "cuda"; "float32" | "bfloat16" | ...)."""

    device: str
    dtype: str


def gpu_driver_present(paths: tuple[str, ...] = GPU_DEVICE_FILES) -> bool:
    """Whether any GPU driver device file exists (cheap: no torch)."""
    return any(Path(p).exists() for p in paths)


def cuda_available() -> bool:
    """torch's answer, asked only when a GPU driver is present (importing torch is the expensive part)."""
    if not gpu_driver_present():
        return False
    import torch

    return bool(torch.cuda.is_available())


def resolve_placement(cfg: EngineConfig) -> Placement:
    """CPU fp32 by default, CUDA bf16 when asked for (or `auto` and present). `device: cuda` is checked by the
    torch runner (`runner.resolve_device`), which raises when torch sees no GPU."""
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and cuda_available())
    dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if use_cuda else "float32")
    return Placement("cuda" if use_cuda else "cpu", dtype)
