"""Service-time profiles: how long one batch (or one LLM iteration) takes on the simulated replica.

A profile file is JSON or YAML (format in docs/sim.md); `headroom profile MODEL` writes one from measurements
on this machine, and the planner and simulator read it. Two ways to give batch service times:

    service_ms: {1: 5.0, 4: 7.2, 8: 9.1, 16: 14.0, 32: 25.0}   # measured means; linear interpolation between
                                                                  # points, linear extrapolation past the last two
    linear: {fixed_ms: 5.0, per_item_ms: 0.6}                    # T(B) = fixed + per_item * B

`distribution` draws each batch's actual time around that mean: deterministic (M/D/...), exponential
(M/M/...) or lognormal with coefficient of variation `cv`. An optional `llm` section drives continuous
batching: a prefill cost per prompt token and a decode iteration time by the number of running sequences.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

DISTRIBUTIONS = ("deterministic", "exponential", "lognormal")


def _points(raw: Mapping[Any, Any], what: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    try:
        pairs = sorted((int(k), float(v) / 1e3) for k, v in raw.items())
    except (TypeError, ValueError):
        raise ValueError(f"{what} must map batch sizes to milliseconds, e.g. {{1: 5.0, 8: 9.1}}") from None
    if not pairs or pairs[0][0] < 1 or any(v <= 0 for _, v in pairs):
        raise ValueError(f"{what} needs batch sizes >= 1 with positive times, e.g. {{1: 5.0, 8: 9.1}}")
    return tuple(k for k, _ in pairs), tuple(v for _, v in pairs)


def _interpolate(sizes: tuple[int, ...], times_s: tuple[float, ...], n: float) -> float:
    if len(sizes) == 1:
        return times_s[0] * max(n, 1.0) / sizes[0] if n > sizes[0] else times_s[0]
    i = bisect.bisect_left(sizes, n)
    if i < len(sizes) and sizes[i] == n:
        return times_s[i]
    if i == 0:  # below the first point: extrapolate with the first segment, never below a tenth of it
        i = 1
    elif i == len(sizes):
        i = len(sizes) - 1
    x0, x1, y0, y1 = sizes[i - 1], sizes[i], times_s[i - 1], times_s[i]
    value = y0 + (y1 - y0) * (n - x0) / (x1 - x0)
    return max(value, 0.1 * times_s[0])


@dataclass(frozen=True, slots=True)
class LlmProfile:
    """Continuous batching costs of one replica (one engine iteration runs every running sequence once)."""

    prefill_s_per_token: float  # prompt processing cost per prompt token, added to the iteration that admits it
    decode_sizes: tuple[int, ...]  # numbers of running sequences with a measured decode-step time
    decode_step_s: tuple[float, ...]  # decode iteration time at each of those sizes
    max_num_seqs: int = 64  # slots: sequences running at once (vLLM --max-num-seqs)
    prompt_tokens: int = 200  # mean prompt length of the simulated requests
    output_tokens: int = 128  # mean output length (geometric if output_dist is "geometric")
    output_dist: str = "fixed"  # fixed | geometric

    def step_s(self, running: int) -> float:
        """Decode iteration time with `running` sequences in the batch."""
        return _interpolate(self.decode_sizes, self.decode_step_s, float(max(running, 1)))


@dataclass(frozen=True, slots=True)
class ServiceProfile:
    """Mean service time of one batch by batch size, and how actual times scatter around it."""

    batch_sizes: tuple[int, ...]  # batch sizes with a measured mean
    service_times_s: tuple[float, ...]  # the mean batch service time at each size
    distribution: str = "deterministic"  # deterministic | exponential | lognormal
    cv: float = 0.0  # lognormal: coefficient of variation of the batch time
    name: str = "profile"  # model / device label for reports
    llm: LlmProfile | None = None  # continuous-batching costs, if the model is an LLM
    meta: Mapping[str, Any] = field(default_factory=dict)  # free-form provenance (device, date, tool)

    def __post_init__(self) -> None:
        if len(self.batch_sizes) != len(self.service_times_s) or not self.batch_sizes:
            raise ValueError("batch_sizes and service_times_s must be non-empty and the same length")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {self.distribution!r}")
        if self.cv < 0:
            raise ValueError(f"cv must be >= 0, got {self.cv}")

    @classmethod
    def linear(cls, fixed_s: float, per_item_s: float, max_batch_size: int = 64, **kw: Any) -> ServiceProfile:
        """``T(B) = fixed + per_item * B`` sampled at 1 and `max_batch_size` (exact between them)."""
        if fixed_s < 0 or per_item_s < 0 or fixed_s + per_item_s <= 0:
            raise ValueError("fixed and per-item times must be >= 0 and not both 0")
        top = max(2, max_batch_size)
        return cls((1, top), (fixed_s + per_item_s, fixed_s + per_item_s * top), **kw)

    @classmethod
    def constant(cls, service_s: float, **kw: Any) -> ServiceProfile:
        """Every batch takes `service_s` on average whatever its size (one request per batch in M/x/c checks)."""
        return cls.linear(service_s, 0.0, **kw)

    def mean_service_s(self, batch_size: int) -> float:
        """Mean time of a batch of `batch_size` items."""
        return _interpolate(self.batch_sizes, self.service_times_s, float(batch_size))

    def interpolated_service_s(self, batch_size: float) -> float:
        """`mean_service_s` at a fractional batch size (a measured mean), on the same piecewise-linear curve."""
        return _interpolate(self.batch_sizes, self.service_times_s, batch_size)

    def to_json(self) -> dict[str, Any]:
        """The file form (milliseconds)."""
        out: dict[str, Any] = {
            "name": self.name,
            "service_ms": {str(b): t * 1e3 for b, t in zip(self.batch_sizes, self.service_times_s, strict=True)},
            "distribution": self.distribution, "cv": self.cv, "meta": dict(self.meta),
        }
        if self.llm is not None:
            out["llm"] = {
                "prefill_ms_per_token": self.llm.prefill_s_per_token * 1e3,
                "decode_step_ms": {str(b): t * 1e3 for b, t in
                                   zip(self.llm.decode_sizes, self.llm.decode_step_s, strict=True)},
                "max_num_seqs": self.llm.max_num_seqs, "prompt_tokens": self.llm.prompt_tokens,
                "output_tokens": self.llm.output_tokens, "output_dist": self.llm.output_dist,
            }
        return out


def static_batch_times(llm: LlmProfile) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Whole-request batch times for static/dynamic batching of an LLM: a batch of B pays B prefills and runs
    until its longest sequence ends (B geometric lengths of mean m end after about m * H_B iterations)."""
    sizes = tuple(sorted({1, 2, 4, 8, 16, 32, 64, 128, llm.max_num_seqs} - {0}))
    times = []
    for b in sizes:
        harmonic = sum(1.0 / i for i in range(1, b + 1)) if llm.output_dist == "geometric" else 1.0
        iterations = max(1.0, llm.output_tokens * harmonic)
        times.append(b * llm.prompt_tokens * llm.prefill_s_per_token + iterations * llm.step_s(b))
    return sizes, tuple(times)


def profile_from_mapping(raw: Mapping[str, Any]) -> ServiceProfile:
    """Build a profile from the parsed file (see the module docstring and docs/sim.md)."""
    if "service_ms" in raw:
        sizes, times = _points(raw["service_ms"], "service_ms")
    elif "linear" in raw:
        lin = raw["linear"]
        fixed, per = float(lin.get("fixed_ms", 0.0)) / 1e3, float(lin.get("per_item_ms", 0.0)) / 1e3
        top = int(lin.get("max_batch_size", 64))
        sizes, times = (1, max(2, top)), (fixed + per, fixed + per * max(2, top))
    elif "llm" in raw:
        sizes, times = (), ()  # derived from the llm section below
    else:
        raise ValueError("a profile needs `service_ms: {batch: ms}`, `linear: {fixed_ms, per_item_ms}` or `llm`")
    llm = None
    if "llm" in raw:
        lraw = raw["llm"]
        dsizes, dtimes = _points(lraw.get("decode_step_ms", {}), "llm.decode_step_ms")
        llm = LlmProfile(prefill_s_per_token=float(lraw.get("prefill_ms_per_token", 0.0)) / 1e3,
                         decode_sizes=dsizes, decode_step_s=dtimes, max_num_seqs=int(lraw.get("max_num_seqs", 64)),
                         prompt_tokens=int(lraw.get("prompt_tokens", 200)),
                         output_tokens=int(lraw.get("output_tokens", 128)),
                         output_dist=str(lraw.get("output_dist", "fixed")))
    if llm is not None and not sizes:
        sizes, times = static_batch_times(llm)
    return ServiceProfile(batch_sizes=sizes, service_times_s=times,
                          distribution=str(raw.get("distribution", "deterministic")), cv=float(raw.get("cv", 0.0)),
                          name=str(raw.get("name", "profile")), llm=llm, meta=dict(raw.get("meta", {})))


def load_profile(path: str | Path) -> ServiceProfile:
    """Read a JSON or YAML profile file."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"profile {p} does not exist; write one (docs/sim.md) or run `headroom profile MODEL`")
    text = p.read_text()
    raw = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(raw, Mapping):
        raise ValueError(f"profile {p} must hold a mapping at the top level")
    return profile_from_mapping(raw)


class Jitter:
    """Multiplicative noise with mean 1 for batch times, drawn in blocks from a seeded numpy Generator."""

    def __init__(self, distribution: str, cv: float, rng: np.random.Generator, block: int = 65536) -> None:
        self._dist, self._rng, self._block = distribution, rng, block
        self._buf: list[float] = []
        self._i = 0
        if distribution == "lognormal":
            self._sigma = math.sqrt(math.log(1.0 + cv * cv))
        self._const = distribution == "deterministic" or (distribution == "lognormal" and cv == 0)

    def _refill(self) -> None:
        if self._dist == "exponential":
            self._buf = self._rng.exponential(1.0, self._block).tolist()
        else:
            s = self._sigma
            self._buf = self._rng.lognormal(-0.5 * s * s, s, self._block).tolist()
        self._i = 0

    def draw(self) -> float:
        """The next factor (1.0 for a deterministic profile)."""
        if self._const:
            return 1.0
        if self._i >= len(self._buf):
            self._refill()
        v = self._buf[self._i]
        self._i += 1
        return v


_BUILTIN_DIR = Path(__file__).parent / "profiles"


def builtin_profiles() -> dict[str, Path]:
    """Example profiles shipped with headroom, by name (file stem)."""
    return {p.stem: p for p in sorted(_BUILTIN_DIR.glob("*.yaml"))}


def resolve_profile(name_or_path: str | Path) -> ServiceProfile:
    """A profile file, or the name of a built-in one (`resnet50_v100`, `llm_8b_gpu`, `cpu_small`)."""
    p = Path(name_or_path)
    if p.is_file():
        return load_profile(p)
    builtin = builtin_profiles()
    if str(name_or_path) in builtin:
        return load_profile(builtin[str(name_or_path)])
    raise ValueError(f"no profile file {p} and no built-in profile of that name; built-ins: "
                     f"{', '.join(builtin)} (format: docs/sim.md)")
