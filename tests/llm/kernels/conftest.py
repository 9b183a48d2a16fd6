"""Shared by the native kernel tests: the built library, and every test taking `isa` runs once per kernel path
this CPU supports (scalar always; AVX2 and AVX-512 VNNI where present)."""

from __future__ import annotations

import ctypes

import pytest

from headroom.llm.kernels.build import KernelUnavailableError, load_library
from headroom.llm.kernels.native_gemm import supported_isas


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    try:
        return load_library()
    except KernelUnavailableError as exc:
        pytest.skip(f"kernels unavailable: {exc}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "isa" in metafunc.fixturenames:
        try:
            isas = list(supported_isas(load_library()))
        except KernelUnavailableError:
            isas = ["scalar"]
        metafunc.parametrize("isa", isas)
