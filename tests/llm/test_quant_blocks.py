"""The numpy block-quant reference (headroom.llm.quant_blocks): layouts against the `gguf` package's own
dequantiser, activation quantisation, and the matmul's arithmetic against a float64 product."""

from __future__ import annotations

import numpy as np
import pytest

from headroom.llm import quant_blocks as qb

gguf_quants = pytest.importorskip("gguf.quants")
from gguf.constants import GGMLQuantizationType  # noqa: E402


@pytest.mark.parametrize("fmt", qb.FORMATS)
def test_dequantize_matches_gguf(fmt: str) -> None:
    rng = np.random.default_rng(0)
    rows, cols = 5, 96
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    raw = qb.quantize_weights(fmt, w)
    ours = qb.dequantize(fmt, raw, rows, cols)
    theirs = gguf_quants.dequantize(raw.reshape(rows, -1), GGMLQuantizationType[fmt]).astype(np.float32)
    np.testing.assert_array_equal(ours, theirs.reshape(rows, cols))
    assert float(np.abs(ours - w).max()) < (0.3 if fmt.startswith("Q4") else 0.03)


def test_qtensor_validates_size_and_format() -> None:
    raw = qb.quantize_weights("Q4_1", np.ones((2, 64), dtype=np.float32))
    t = qb.QTensor("Q4_1", 2, 64, raw)
    assert t.row_bytes == 40 and t.dequantize().shape == (2, 64)
    with pytest.raises(ValueError, match="needs 80"):
        qb.QTensor("Q4_1", 2, 64, raw[:-1])
    with pytest.raises(ValueError, match="multiple of 32"):
        qb.row_bytes("Q8_0", 33)
    with pytest.raises(ValueError, match="unsupported"):
        qb.row_bytes("Q5_K", 32)


def test_activation_quantisation_rounds_ties_to_even_and_handles_zeros() -> None:
    x = np.zeros((2, 32), dtype=np.float32)
    x[0, 0] = 127.0
    x[0, 1] = 2.5  # a tie: 2
    x[0, 2] = -3.5  # a tie: -4
    act = qb.quantize_activations(x)
    assert act.q[0, 0, :3].tolist() == [127, 2, -4]
    assert act.d[0, 0] == np.float32(1.0) and act.s[0, 0] == np.float32(125.0)
    assert act.d[1, 0] == 0 and not act.q[1].any()  # an all-zero block: scale 0, values 0
    wide = qb.quantize_activations(x, bits=16)
    assert wide.q.dtype == np.int16 and wide.q[0, 0, :3].tolist() == [32767, 645, -903]  # 2.5 * 258.0 -> 645
    with pytest.raises(ValueError, match="bits"):
        qb.quantize_activations(x, bits=4)


def test_sixteen_bit_activations_are_closer_to_the_float_product() -> None:
    rng = np.random.default_rng(2)
    raw = qb.quantize_weights("Q4_1", rng.standard_normal((16, 256)).astype(np.float32))
    x = rng.standard_normal((4, 256)).astype(np.float32)
    exact = x.astype(np.float64) @ qb.dequantize("Q4_1", raw, 16, 256).astype(np.float64).T
    err8 = np.abs(qb.reference_matmul("Q4_1", raw, 16, 256, x) - exact).max()
    err16 = np.abs(qb.reference_matmul("Q4_1", raw, 16, 256, x, act_bits=16) - exact).max()
    assert err16 < err8 / 50


@pytest.mark.parametrize("fmt", qb.FORMATS)
def test_reference_matmul_close_to_float_product(fmt: str) -> None:
    rng = np.random.default_rng(1)
    rows, cols, m = 7, 160, 3
    raw = qb.quantize_weights(fmt, rng.standard_normal((rows, cols)).astype(np.float32))
    x = rng.standard_normal((m, cols)).astype(np.float32)
    y = qb.reference_matmul(fmt, raw, rows, cols, x)
    exact = x.astype(np.float64) @ qb.dequantize(fmt, raw, rows, cols).astype(np.float64).T
    assert y.dtype == np.float32 and y.shape == (m, rows)
    tol = 1e-5 if fmt in ("F32", "F16") else 0.02 * float(np.abs(exact).max())
    assert float(np.abs(y - exact).max()) <= tol


def test_reference_matmul_rows_are_independent() -> None:
    rng = np.random.default_rng(2)
    raw = qb.quantize_weights("Q4_1", rng.standard_normal((9, 64)).astype(np.float32))
    x = rng.standard_normal((4, 64)).astype(np.float32)
    whole = qb.reference_matmul("Q4_1", raw, 9, 64, x)
    np.testing.assert_array_equal(whole[2:3], qb.reference_matmul("Q4_1", raw, 9, 64, x[2:3]))
