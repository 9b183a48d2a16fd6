"""The native block-quant GEMM: every path this CPU runs is bit-identical to quant_blocks.reference_matmul."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from headroom.llm import quant_blocks as qb
from headroom.llm.kernels.native_gemm import ISA_ENV, native_gemm, pack_tensor, resolve_isa, supported_isas

# (M, N, K): ragged M and N (M past the 64-row tile), K with a block tail (K/32 not a multiple of 8: tails of 1, 3
# blocks and the compact ones of 2 and 4)
SHAPES = [(1, 1, 32), (1, 9, 96), (3, 17, 96), (5, 33, 288), (8, 40, 576), (33, 7, 1056), (2, 19, 40), (70, 9, 288),
          (1, 6, 64), (1, 7, 384), (4, 11, 384), (3, 5, 128)]  # fmt: skip


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "gguf-layout"])
@pytest.mark.parametrize("act_bits", [8, 16, 32])
@pytest.mark.parametrize("fmt", qb.FORMATS)
def test_every_path_is_bit_exact(lib: ctypes.CDLL, isa: str, fmt: str, act_bits: int, pack: bool) -> None:
    rng = np.random.default_rng(hash((isa, fmt, act_bits)) % 2**32)
    for m, n, k in SHAPES:
        if k % qb.QK and fmt not in qb.ELEMENT_BYTES:
            continue
        w = qb.QTensor(fmt, n, k, qb.quantize_weights(fmt, rng.standard_normal((n, k)).astype(np.float32)))
        x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 10)).astype(np.float32)
        x[0, : min(k, 32)] = 0.0  # an all-zero block
        want = qb.reference_matmul(fmt, w.data, n, k, x, act_bits)
        got = native_gemm(lib, w, x, isa, num_threads=2, act_bits=act_bits, pack=pack)
        np.testing.assert_array_equal(got, want, err_msg=f"{fmt} {isa} {act_bits}-bit M={m} N={n} K={k} {pack=}")


@pytest.mark.parametrize("act_bits", [8, 16])
def test_extreme_integers_are_exact(lib: ctypes.CDLL, isa: str, act_bits: int) -> None:
    """Q8_0 weights of -128 (a foreign file's; our quantiser stops at -127) and activation blocks whose most negative
    value sets the scale (q = -qmax: the 16-bit planes' high byte is then -128), on every layout."""
    rng = np.random.default_rng(11)
    n, k = 12, 288
    raw = qb.quantize_weights("Q8_0", rng.standard_normal((n, k)).astype(np.float32)).reshape(n, k // 32, 34)
    ints = rng.integers(-128, 128, size=(n, k // 32, 32)).astype(np.int8)
    ints[:, :, 0] = -128
    raw[:, :, 2:] = ints.view(np.uint8)
    w = qb.QTensor("Q8_0", n, k, np.ascontiguousarray(raw).reshape(-1))
    x = rng.uniform(0.0, 1.0, size=(5, k)).astype(np.float32)
    x[:, ::32] = -3.0  # each block's amax, negative
    want = qb.reference_matmul("Q8_0", w.data, n, k, x, act_bits)
    for pack in (True, False):
        got = native_gemm(lib, w, x, isa, num_threads=1, act_bits=act_bits, pack=pack)
        np.testing.assert_array_equal(got, want, err_msg=f"{isa} {act_bits}-bit {pack=}")
        np.testing.assert_array_equal(native_gemm(lib, w, x[2:3], isa, act_bits=act_bits, pack=pack), want[2:3])


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("nibble", [0, 15])
def test_extreme_nibbles_are_exact(lib: ctypes.CDLL, isa: str, fmt: str, nibble: int) -> None:
    """Q4 blocks whose nibbles are all 0 or all 15 (the byte sums behind the 16-bit planes' bias reach their bounds:
    Q4_1 8 x 15, Q4_0 8 x -8) against 16- and 8-bit activations, every layout, tails of 2 blocks included."""
    rng = np.random.default_rng(13)
    n, k = 9, 576
    head = 4 if fmt == "Q4_1" else 2
    raw = qb.quantize_weights(fmt, rng.standard_normal((n, k)).astype(np.float32)).reshape(n, k // 32, head + 16)
    raw[:, :, head:] = nibble * 0x11
    w = qb.QTensor(fmt, n, k, np.ascontiguousarray(raw).reshape(-1))
    x = rng.standard_normal((6, k)).astype(np.float32)
    for bits in (8, 16):
        want = qb.reference_matmul(fmt, w.data, n, k, x, bits)
        for pack in (True, False):
            for m in (1, 6):
                got = native_gemm(lib, w, x[:m], isa, num_threads=1, act_bits=bits, pack=pack)
                np.testing.assert_array_equal(got, want[:m], err_msg=f"{fmt} {nibble=} {bits}-bit {m=} {pack=}")


def test_rows_independent_of_batch_and_threads(lib: ctypes.CDLL, isa: str) -> None:
    rng = np.random.default_rng(5)
    w = qb.QTensor("Q4_1", 70, 576, qb.quantize_weights("Q4_1", rng.standard_normal((70, 576)).astype(np.float32)))
    x = rng.standard_normal((32, 576)).astype(np.float32)
    for bits in (8, 16, 32):
        full = native_gemm(lib, w, x, isa, num_threads=2, act_bits=bits)
        np.testing.assert_array_equal(native_gemm(lib, w, x[7:8], isa, num_threads=1, act_bits=bits), full[7:8])


def test_dispatch_and_forcing(lib: ctypes.CDLL) -> None:
    have = supported_isas(lib)
    assert have[0] == "scalar"
    assert resolve_isa(lib, env={}) == have[-1]
    assert resolve_isa(lib, env={ISA_ENV: "scalar"}) == "scalar"
    assert resolve_isa(lib, "scalar", env={ISA_ENV: have[-1]}) == "scalar"  # an argument beats the env
    with pytest.raises(ValueError, match="expected one of"):
        resolve_isa(lib, env={ISA_ENV: "sse9"})
    for name in ("avx2", "avx512vnni"):
        if name not in have:
            with pytest.raises(ValueError, match="not supported by this CPU"):
                resolve_isa(lib, name)


def test_bad_arguments_are_refused(lib: ctypes.CDLL) -> None:
    w = qb.QTensor("Q8_0", 2, 32, qb.quantize_weights("Q8_0", np.ones((2, 32), dtype=np.float32)))
    with pytest.raises(ValueError, match="must be"):
        native_gemm(lib, w, np.ones((1, 31), dtype=np.float32), "scalar")
    with pytest.raises(ValueError, match="refused"):
        native_gemm(lib, w, np.ones((1, 32), dtype=np.float32), "scalar", num_threads=0)


def test_packed_layout_is_the_gguf_bytes_rearranged(lib: ctypes.CDLL) -> None:
    rng = np.random.default_rng(9)
    for fmt in ("Q4_0", "Q4_1", "Q8_0"):
        w = qb.QTensor(fmt, 3, 288, qb.quantize_weights(fmt, rng.standard_normal((3, 288)).astype(np.float32)))
        packed = pack_tensor(lib, w, "avx512vnni")
        assert packed is not None and packed.nbytes == w.data.nbytes  # nothing padded, nothing extra streamed
        assert sorted(packed.tobytes()) == sorted(w.data.tobytes())
        assert pack_tensor(lib, w, "scalar") is None  # the scalar path reads the GGUF layout
    f16 = qb.QTensor("F16", 2, 32, qb.quantize_weights("F16", np.ones((2, 32), dtype=np.float32)))
    assert pack_tensor(lib, f16, "avx512vnni") is None
