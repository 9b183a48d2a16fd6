"""The native GGUF block-quant GEMM (`native_gemm.c`) from Python: instruction-set selection and one matmul.

The library is compiled for the x86-64 baseline; each call names the path it runs (`ISA_NAMES`): `scalar`
(portable), `avx2` (AVX2 + F16C) or `avx512vnni` (AVX-512 VNNI with VL/BW). `resolve_isa` picks the best the CPU
supports (cpuid), or the one forced by an argument or by `$HEADROOM_KERNEL_ISA` (`scalar|avx2|avx512vnni|auto`);
forcing a path the CPU lacks is a ValueError. Every path gives the same bits as
`headroom.llm.quant_blocks.reference_matmul`.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

import numpy as np

from headroom.llm.quant_blocks import QTensor

ISA_NAMES = ("scalar", "avx2", "avx512vnni")  # index = the C HR_ISA_* code
ISA_ENV = "HEADROOM_KERNEL_ISA"  # forces a path (or "auto")
FORMAT_CODES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 4}  # the C HR_* codes
MAX_COLS = 16384  # widest input a native linear accepts (HR_MAX_COLS)
_I = ctypes.c_int64


class CQTensor(ctypes.Structure):
    """`hr_qtensor`: one weight matrix's format, shape and bytes."""

    _fields_ = [("fmt", _I), ("rows", _I), ("cols", _I), ("data", ctypes.c_void_p), ("packed", ctypes.c_void_p)]


def c_qtensor(t: QTensor, packed: np.ndarray | None = None) -> CQTensor:
    """The C view of a QTensor (its `data`, and `packed` from `pack_tensor`, must outlive the view)."""
    if t.cols > MAX_COLS:
        raise ValueError(f"native kernels take at most {MAX_COLS} input features, got {t.cols}")
    packed_ptr = None if packed is None else packed.ctypes.data
    return CQTensor(FORMAT_CODES[t.fmt], t.rows, t.cols, t.data.ctypes.data, packed_ptr)


def pack_tensor(lib: ctypes.CDLL, t: QTensor, isa: str) -> np.ndarray | None:
    """`t`'s blocks in the layout the SIMD paths read fastest (native_pack.c: AVX2 and AVX-512 VNNI, Q4_0 / Q4_1 /
    Q8_0; the same byte count, one pass), or None where the path reads the GGUF layout directly (scalar, F16 / F32)."""
    size_fn = lib.hr_packed_bytes
    size_fn.argtypes, size_fn.restype = [_I, _I, _I], _I
    size = size_fn(FORMAT_CODES[t.fmt], t.rows, t.cols)
    if isa not in ("avx2", "avx512vnni") or size < 0:
        return None
    out = np.empty(size, dtype=np.uint8)
    fn = lib.hr_pack_tensor
    fn.argtypes, fn.restype = [ctypes.POINTER(CQTensor), ctypes.c_void_p], ctypes.c_int
    if fn(ctypes.byref(c_qtensor(t)), out.ctypes.data) != 0:
        raise ValueError(f"hr_pack_tensor refused {t.fmt} {t.rows}x{t.cols}")
    return out


def supported_isas(lib: ctypes.CDLL) -> tuple[str, ...]:
    """The paths this CPU runs, slowest first."""
    fn = lib.hr_native_isa_supported
    fn.argtypes, fn.restype = [_I], ctypes.c_int
    return tuple(name for code, name in enumerate(ISA_NAMES) if fn(code))


def resolve_isa(lib: ctypes.CDLL, requested: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """`requested`, else `$HEADROOM_KERNEL_ISA`, else `auto` (the fastest the CPU supports)."""
    choice = requested or (os.environ if env is None else env).get(ISA_ENV, "") or "auto"
    have = supported_isas(lib)
    if choice == "auto":
        return have[-1]
    if choice not in ISA_NAMES:
        raise ValueError(f"{ISA_ENV}={choice!r}: expected one of auto, {', '.join(ISA_NAMES)}")
    if choice not in have:
        raise ValueError(f"kernel path {choice!r} is not supported by this CPU (it runs {', '.join(have)})")
    return choice


def native_gemm(
    lib: ctypes.CDLL, w: QTensor, x: np.ndarray, isa: str, num_threads: int = 1, act_bits: int = 8, pack: bool = True
) -> np.ndarray:
    """y [M, w.rows] = x [M, w.cols] @ W^T on path `isa` with `act_bits` (8, 16 or 32 = fp32) block activations
    (bit-identical to quant_blocks.reference_matmul); `pack`: give the path its packed layout (pack_tensor)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.cols:
        raise ValueError(f"x must be [M, {w.cols}], got {x.shape}")
    y = np.empty((x.shape[0], w.rows), dtype=np.float32)
    packed = pack_tensor(lib, w, isa) if pack else None
    spec = c_qtensor(w, packed)
    fn = lib.hr_native_gemm
    fn.argtypes = [ctypes.POINTER(CQTensor), ctypes.c_void_p, _I, ctypes.c_void_p, _I, _I, _I]
    fn.restype = ctypes.c_int
    rc = fn(ctypes.byref(spec), x.ctypes.data, x.shape[0], y.ctypes.data, ISA_NAMES.index(isa), num_threads, act_bits)
    if rc == -1:
        raise MemoryError("hr_native_gemm: out of memory")
    if rc != 0:
        raise ValueError(
            f"hr_native_gemm refused {w.fmt} {w.rows}x{w.cols} on {isa!r} with {num_threads} threads, "
            f"{act_bits}-bit activations"
        )
    return y
