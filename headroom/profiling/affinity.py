"""CPU affinity for CPU node tuning: `--cpus 0`, `--cpus 0-1`, `--cpus 0,2-3` (Linux `taskset -c` syntax).

`parse_cpus` is pure; `pin_process` applies it with os.sched_setaffinity to the calling process, whose
threads and children (onnxruntime/torch thread pools created later, replica processes) inherit it, so
call it before models load.
"""

from __future__ import annotations

import os


def parse_cpus(spec: str) -> frozenset[int]:
    """'0' | '0-1' | '0,2-3' -> the CPU ids; ValueError saying the expected form."""
    cpus: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(f"--cpus {spec!r}: write CPU ids like 0, 0-1 or 0,2-3 (as taskset -c)") from None
        if first < 0 or last < first:
            raise ValueError(f"--cpus {spec!r}: {part!r} is not a CPU id or an ascending range like 0-1")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError(f"--cpus {spec!r}: name at least one CPU, e.g. 0 or 0-1")
    return frozenset(cpus)


def available_cpus() -> frozenset[int]:
    """The CPUs this process may run on now."""
    return frozenset(os.sched_getaffinity(0))


def pin_process(spec: str) -> frozenset[int]:
    """Restrict this process (pid 0 = the caller) to the CPUs in `spec`; returns them.

    ValueError when the spec is malformed or names CPUs this process may not use (says which it may).
    """
    wanted = parse_cpus(spec)
    allowed = available_cpus()
    outside = sorted(wanted - allowed)
    if outside:
        raise ValueError(
            f"--cpus {spec!r}: CPUs {outside} are not available to this process (it may use {sorted(allowed)})"
        )
    os.sched_setaffinity(0, wanted)
    return wanted
