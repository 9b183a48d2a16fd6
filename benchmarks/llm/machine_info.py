"""The CPU a benchmark ran on: numbers are only comparable with these (model name and the SIMD that matters)."""

from __future__ import annotations

from pathlib import Path

SIMD = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")


def cpu_description() -> dict[str, str]:
    model, flags = "unknown", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"model": model, "simd": " ".join(f for f in SIMD if f in flags)}
