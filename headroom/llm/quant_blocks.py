"""GGUF block quantisation: the numpy REFERENCE of the arithmetic the native C kernels do (the contract).

Weight layouts (one row = `cols` values = `cols / 32` blocks, stored back to back; a matrix is `rows` such rows,
row-major, i.e. out x in). `d`, `m` are little-endian IEEE fp16:

- `Q4_0` (18 bytes/block): `d`, then 16 bytes `qs`; value j (< 16) = ((qs[j] & 15) - 8) * d, value j + 16 =
  ((qs[j] >> 4) - 8) * d.
- `Q4_1` (20 bytes/block): `d`, `m`, then 16 bytes `qs` with the same nibble order; value = nibble * d + m.
- `Q8_0` (34 bytes/block): `d`, then 32 int8 `qs`; value = q * d.
- `F16` / `F32`: plain values (no blocks; `cols` any size).

Activations (`quantize_activations`): each row of x, in blocks of 32 (llama.cpp's q8_0 / q8_1, AVX variant):
`amax = max |x|` over the block, `d = amax / 127`, `id = 127 / amax` (0 when amax is 0 or 127 / amax overflows;
then d = 0 too), `q = rint(x * id)` ROUNDED TO NEAREST, TIES TO EVEN (llama.cpp's AVX code, `_mm256_round_ps`;
its scalar reference rounds ties away from zero: they differ only on exact .5 ties), clamped to [-127, 127];
`s = d * (float)sum(q)` (used by Q4_1). d and s stay fp32 (llama.cpp rounds them to fp16).
With `bits=16` (the step's lm_head and down_proj inputs) the same with 32767 in place of 127 and int16 q.

`reference_matmul` y[m, n] = x[m] . W[n], with every op in fp32 and no FMA contraction:
1. per block b: the EXACT int32 dot `isum` of the weight block's integers and q (Q4_0: (nibble - 8) * q; Q4_1:
   nibble * q; Q8_0: q_w * q); `(float)isum` is exact for 8-bit q, rounded to nearest even for 16-bit q
   (|isum| < 2^31);
2. `v = (d_w * d_x) * (float)isum`, then for Q4_1 `v = v + m_w * s_x` (each a single rounded fp32 op, in this
   order);
3. eight fp32 lane accumulators, all starting at +0.0: block b is added into lane `b % 8`
   (`acc[b % 8] = acc[b % 8] + v`), blocks in increasing order;
4. `y = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))` (the AVX horizontal-sum tree).

F16 / F32 weights take x unquantised: step 2 is `v = x[k] * w[k]` per element k, accumulated into lane `k % 8`,
then the same tree. So do block formats with `act_bits=32` (fp32 inputs: the step's former down_proj mode), on
w = `dequantize(...)`.
A row's result depends only on that row of x and that row of W: never on how many rows a step has, how they are
tiled, or how many threads run (batch invariance).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QK = 32  # values per quantised block
ACT_QMAX = {8: 127, 16: 32767}  # activation bits -> largest |q|
LANES = 8  # fp32 accumulators per output (step 3)
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}  # bytes per 32-value block
ELEMENT_BYTES = {"F32": 4, "F16": 2}  # bytes per value of the unblocked formats
FORMATS = ("F32", "F16", "Q4_0", "Q4_1", "Q8_0")


def row_bytes(fmt: str, cols: int) -> int:
    """Bytes one row of `cols` values takes; raises ValueError for an unknown format or a ragged block row."""
    if fmt in ELEMENT_BYTES:
        return cols * ELEMENT_BYTES[fmt]
    if fmt not in BLOCK_BYTES:
        raise ValueError(f"unsupported weight format {fmt!r}; supported: {', '.join(FORMATS)}")
    if cols % QK:
        raise ValueError(f"{fmt} rows need a multiple of {QK} columns, got {cols}")
    return cols // QK * BLOCK_BYTES[fmt]


@dataclass(frozen=True, slots=True)
class QTensor:
    """A weight matrix `rows` x `cols` (out x in) in a GGUF format, rows stored back to back (`data` may be a
    view into a memory map; 1-D or [rows, row_bytes])."""

    fmt: str  # one of FORMATS
    rows: int  # output features
    cols: int  # input features
    data: np.ndarray  # uint8, rows * row_bytes(fmt, cols) bytes, C-contiguous

    def __post_init__(self) -> None:
        if self.rows < 1 or self.cols < 1:
            raise ValueError(f"QTensor needs rows, cols >= 1, got {self.rows} x {self.cols}")
        need = self.rows * row_bytes(self.fmt, self.cols)
        if self.data.dtype != np.uint8 or self.data.nbytes != need or not self.data.flags.c_contiguous:
            raise ValueError(
                f"QTensor {self.fmt} {self.rows}x{self.cols} needs {need} contiguous uint8 bytes, "
                f"got {self.data.nbytes} bytes of {self.data.dtype}"
            )

    @property
    def row_bytes(self) -> int:
        """Bytes per row."""
        return row_bytes(self.fmt, self.cols)

    def dequantize(self) -> np.ndarray:
        """fp32 [rows, cols]."""
        return dequantize(self.fmt, self.data, self.rows, self.cols)


def _blocks(fmt: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """raw as [rows, blocks, bytes per block]."""
    return (
        np.ascontiguousarray(raw)
        .reshape(-1)
        .view(np.uint8)
        .reshape(rows, row_bytes(fmt, cols) // BLOCK_BYTES[fmt], BLOCK_BYTES[fmt])
    )


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at byte `at` of every block, as fp32 [rows, blocks] (exact)."""
    return np.ascontiguousarray(b[..., at : at + 2]).view("<f2")[..., 0].astype(np.float32)


def block_integers(fmt: str, raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The integers of a block format as int32 [rows, blocks, 32] (Q4_0 already minus 8), d and m as fp32
    [rows, blocks] (m is 0 except for Q4_1)."""
    b = _blocks(fmt, raw, rows, cols)
    d = _f16(b, 0)
    m = np.zeros_like(d)
    if fmt == "Q8_0":
        return b[..., 2:].view(np.int8).astype(np.int32), d, m
    start = 4 if fmt == "Q4_1" else 2
    qs = b[..., start : start + 16]
    nib = np.concatenate((qs & 15, qs >> 4), axis=-1).astype(np.int32)
    if fmt == "Q4_1":
        m = _f16(b, 2)
        return nib, d, m
    return nib - 8, d, m


def dequantize(fmt: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Weights as fp32 [rows, cols]: value = q * d (+ m for Q4_1: one fp32 multiply, then one add)."""
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if flat.nbytes != rows * row_bytes(fmt, cols):
        raise ValueError(f"{fmt} {rows}x{cols} needs {rows * row_bytes(fmt, cols)} bytes, got {flat.nbytes}")
    if fmt == "F32":
        out: np.ndarray = flat.view("<f4").astype(np.float32).reshape(rows, cols)
        return out
    if fmt == "F16":
        out = flat.view("<f2").astype(np.float32).reshape(rows, cols)
        return out
    q, d, m = block_integers(fmt, flat, rows, cols)
    out = q.astype(np.float32) * d[..., None]
    if fmt == "Q4_1":
        out = out + m[..., None]
    return out.reshape(rows, cols)


@dataclass(frozen=True, slots=True)
class QuantizedActivations:
    """x [M, K] per row in blocks of 32: q int8 (or int16) [M, blocks, 32], d and s fp32 [M, blocks]."""

    q: np.ndarray  # int8 values in [-127, 127] (int16 in [-32767, 32767] for 16 bits)
    d: np.ndarray  # block scale: x ~= q * d
    s: np.ndarray  # d * (float)sum(q) over the block


def quantize_activations(x: np.ndarray, bits: int = 8) -> QuantizedActivations:
    """Quantise each row of fp32 x [M, K] (K a multiple of 32) to `bits` (8 or 16) as the module docstring says."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK:
        raise ValueError(f"activations must be [M, K] with K a multiple of {QK}, got {x.shape}")
    if bits not in ACT_QMAX:
        raise ValueError(f"activation bits must be one of {sorted(ACT_QMAX)}, got {bits}")
    qmax = np.float32(ACT_QMAX[bits])
    xb = x.reshape(x.shape[0], -1, QK)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        amax = np.abs(xb).max(axis=-1)
        inv = np.where(amax > 0, qmax / amax, np.float32(0.0)).astype(np.float32)
        inv = np.where(np.isinf(inv), np.float32(0.0), inv).astype(np.float32)
        d = np.where(inv > 0, amax / qmax, np.float32(0.0)).astype(np.float32)
        q = np.clip(np.rint(xb * inv[..., None]), -qmax, qmax).astype(np.int8 if bits == 8 else np.int16)
    s = d * q.astype(np.int32).sum(axis=-1).astype(np.float32)
    return QuantizedActivations(q=q, d=d, s=s.astype(np.float32))


def lane_sum(acc: np.ndarray) -> np.ndarray:
    """The fixed horizontal sum of the last axis (8 fp32 lanes): ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))."""
    s = [acc[..., i] + acc[..., i + 4] for i in range(4)]
    out: np.ndarray = ((s[0] + s[2]) + (s[1] + s[3])).astype(np.float32)
    return out


def reference_matmul(
    fmt: str, raw: np.ndarray, rows: int, cols: int, x: np.ndarray, act_bits: int = 8
) -> np.ndarray:
    """y [M, rows] = x [M, cols] @ W^T with exactly the kernels' arithmetic (module docstring); block formats
    quantise x to `act_bits` (8 or 16) or take it as fp32 (32)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != cols:
        raise ValueError(f"x must be [M, {cols}], got {x.shape}")
    if act_bits not in (*ACT_QMAX, 32):
        raise ValueError(f"act_bits must be 8, 16 or 32, got {act_bits}")
    acc = np.zeros((x.shape[0], rows, LANES), dtype=np.float32)
    if fmt in ELEMENT_BYTES or act_bits == 32:
        w = dequantize(fmt, raw, rows, cols)
        for k in range(cols):
            acc[..., k % LANES] += x[:, k, None] * w[None, :, k]
        return lane_sum(acc)
    qw, dw, mw = block_integers(fmt, raw, rows, cols)
    act = quantize_activations(x, act_bits)
    qx = act.q.astype(np.int64)
    for b in range(cols // QK):
        isum = np.einsum("mk,nk->mn", qx[:, b], qw[:, b]).astype(np.int32).astype(np.float32)  # int32, then rint
        v = (dw[None, :, b] * act.d[:, b, None]) * isum
        if fmt == "Q4_1":
            v = v + mw[None, :, b] * act.s[:, b, None]
        acc[..., b % LANES] += v
    return lane_sum(acc)


def quantize_weights(fmt: str, w: np.ndarray) -> np.ndarray:
    """fp32 [rows, cols] -> raw bytes of `fmt` (llama.cpp's reference quantisers; for tests and tiny models)."""
    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    if fmt == "F32":
        return w.astype("<f4").reshape(-1).view(np.uint8).copy()
    if fmt == "F16":
        return w.astype("<f2").reshape(-1).view(np.uint8).copy()
    out = np.zeros((rows, row_bytes(fmt, cols) // BLOCK_BYTES[fmt], BLOCK_BYTES[fmt]), dtype=np.uint8)
    wb = w.reshape(rows, -1, QK)
    with np.errstate(divide="ignore", invalid="ignore"):
        if fmt == "Q8_0":
            d = np.abs(wb).max(-1) / 127
            q = np.clip(np.rint(np.where(d[..., None] > 0, wb / d[..., None], 0)), -127, 127).astype(np.int8)
            out[..., 0:2] = d.astype("<f2")[..., None].view(np.uint8)
            out[..., 2:] = q.view(np.uint8)
        elif fmt == "Q4_0":
            idx = np.abs(wb).argmax(-1)
            mx = np.take_along_axis(wb, idx[..., None], -1)[..., 0]
            d = mx / -8
            q = np.clip(np.floor(np.where(d[..., None] != 0, wb / d[..., None], 0) + 8.5), 0, 15).astype(np.uint8)
            out[..., 0:2] = d.astype("<f2")[..., None].view(np.uint8)
            out[..., 2:] = q[..., :16] | (q[..., 16:] << 4)
        elif fmt == "Q4_1":
            lo, hi = wb.min(-1), wb.max(-1)
            d = (hi - lo) / 15
            q = np.clip(np.floor(np.where(d[..., None] > 0, (wb - lo[..., None]) / d[..., None], 0) + 0.5), 0, 15)
            q = q.astype(np.uint8)
            out[..., 0:2] = d.astype("<f2")[..., None].view(np.uint8)
            out[..., 2:4] = lo.astype("<f2")[..., None].view(np.uint8)
            out[..., 4:] = q[..., :16] | (q[..., 16:] << 4)
        else:
            raise ValueError(f"unsupported weight format {fmt!r}; supported: {', '.join(FORMATS)}")
    return out.reshape(-1)
