"""Build (system C compiler, cached) and load (ctypes) the CPU kernels library.

Every `.c` file next to this module is compiled into ONE shared library on first use with
`cc -O3 -ffp-contract=off -fopenmp` (no fast-math: IEEE ops, no implicit FMA contraction) into
`$HEADROOM_CACHE_DIR/kernels/<hash>.so`. The native GGUF kernels (`native_*.c`, `native.h`) are compiled for the
x86-64 baseline and pick their instruction set at run time (per-function `target` attributes + cpuid); the older
file (`paged_attention.c`, with `common.h`) add `arch_flags` (`-march=native` by default:
explicit AVX2/FMA only where the CPU has them)
(`~/.cache/headroom` by default); the hash covers the sources, the flags, the compiler and the CPU's flags, so
a different machine or compiler builds its own. The library's `NEEDED libgomp.so.1` resolves to the libgomp
torch has already loaded when it has (same soname), so there is ONE OpenMP runtime; the native path runs without
torch and loads it itself.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

KERNEL_DIR = Path(__file__).parent
SOURCE_NAMES = (
    "common.h", "paged_attention.c", "native.h", "native_blocks.h", "native_quant.c", "native_gemm.c",
    "native_gemm_wide.c", "native_packed.h", "native_pack.c", "native_pack_avx2.c", "native_step.c",
)  # fmt: skip  # hashed; the .c files are compiled
BASELINE_PREFIX = "native"  # sources compiled without arch_flags (run-time ISA dispatch inside)
BASE_FLAGS = ("-O3", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared")
ABI_VERSION = 5  # hr_abi_version() of the sources this module drives


class KernelUnavailableError(RuntimeError):
    """The kernels cannot be built or loaded here (no compiler, build error, unsupported platform)."""


def kernel_cache_dir() -> Path:
    """`$HEADROOM_CACHE_DIR/kernels` (default `~/.cache/headroom/kernels`)."""
    root = os.environ.get("HEADROOM_CACHE_DIR") or str(Path.home() / ".cache" / "headroom")
    return Path(root) / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def build_library(arch_flags: tuple[str, ...] = ("-march=native",), cache_dir: Path | None = None) -> Path:
    """Compile the kernels (or reuse the cached build) and return the `.so` path.
    `arch_flags` pick the instruction set (`("-march=x86-64",)` builds the portable scalar path)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise KernelUnavailableError("no C compiler (install gcc, or set CC)")
    sources = [KERNEL_DIR / name for name in SOURCE_NAMES]
    missing = [str(p) for p in sources if not p.exists()]
    if missing:
        raise KernelUnavailableError(f"kernel sources {missing} are missing from the installed package")
    flags = (*BASE_FLAGS, *arch_flags)
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelUnavailableError(f"C compiler {cc} does not run: {exc}") from exc
    texts = [p.read_text() for p in sources]
    key = hashlib.sha256(
        "\0".join([*texts, " ".join(flags), version, _cpu_flags(), platform.machine()]).encode()
    ).hexdigest()[:24]
    out_dir = cache_dir or kernel_cache_dir()
    target = out_dir / f"headroom_kernels-{key}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)  # compile aside, then rename: concurrent builds are safe
    os.close(fd)
    objects: list[str] = []
    try:
        for src in (p for p in sources if p.suffix == ".c"):
            obj = f"{tmp}.{src.stem}.o"
            objects.append(obj)
            extra = () if src.name.startswith(BASELINE_PREFIX) else arch_flags
            _run_cc([cc, *BASE_FLAGS[:-1], *extra, "-c", "-o", obj, str(src)], cc)
        _run_cc([cc, *BASE_FLAGS, "-o", tmp, *objects], cc)
        os.replace(tmp, target)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelUnavailableError(f"building the kernels with {cc} failed: {exc}") from exc
    finally:
        for leftover in (tmp, *objects):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return target


def _run_cc(args: list[str], cc: str) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        raise KernelUnavailableError(f"{cc} failed to build the kernels: {proc.stderr.strip()[-400:]}")


def open_library(path: Path) -> ctypes.CDLL:
    """Load a built library and check its ABI version (ctypes.CDLL calls release the GIL)."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise KernelUnavailableError(f"cannot load {path}: {exc}") from exc
    if lib.hr_abi_version() != ABI_VERSION:
        raise KernelUnavailableError(f"{path} has ABI {lib.hr_abi_version()}, expected {ABI_VERSION}")
    return lib


@functools.cache
def load_library(arch_flags: tuple[str, ...] = ("-march=native",)) -> ctypes.CDLL:
    """Build (or reuse) and load the library once per process; raises KernelUnavailableError."""
    return open_library(build_library(arch_flags))
