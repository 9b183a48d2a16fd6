"""`Server-Timing` header rendering (W3C Server Timing), shared by every HTTP response that has timings."""

from __future__ import annotations

from headroom.core.types import StageTimings


def server_timing_header(timings: StageTimings) -> str:
    """`queue;dur=0.12, batch_wait;dur=..., preprocess;dur=..., compute;dur=..., postprocess;dur=..., total;dur=...`."""
    return ", ".join(f"{name};dur={value:.3f}" for name, value in timings.as_dict().items())


def parse_server_timing(header: str) -> dict[str, float]:
    """Inverse of `server_timing_header` (tolerant of other entries and spacing)."""
    out: dict[str, float] = {}
    for part in header.split(","):
        fields = [f.strip() for f in part.split(";")]
        if not fields or not fields[0]:
            continue
        for f in fields[1:]:
            if f.startswith("dur="):
                try:
                    out[fields[0]] = float(f[4:])
                except ValueError:
                    continue
    return out
