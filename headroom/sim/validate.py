"""`headroom sim --validate`: the simulator checked against the real server.

Steps (`run_validation`):

1. service-time profile: the batched predict call by batch size, timed here on the bench's own samples
   (preprocessed and collated as the server does; `headroom.profiling.measure`'s format), or `--profile FILE`;
2. the real server: `python -m headroom.cli.main serve --model M` in a subprocess on a free loopback port;
3. calibration: a closed-loop, single-stream run (one request at a time) gives the fixed per-request cost
   the simulator does not model (HTTP, JSON, validation, preprocessing, response) as the median of
   ``latency - Server-Timing queue - Server-Timing compute``, and /metrics gives the per-batch executor cost
   outside predict (collate, split, postprocess, thread hand-off) as ``(busy - compute) / batches``;
4. the bench (`headroom.loadgen.runner.run_bench`), open-loop Poisson at fractions of the capacity the
   profile implies at the model's max batch size (B_max / T(B_max));
5. the simulator on the SAME arrival schedule (same seed), 1 replica per model instance, the model's own
   batching policy (`headroom.server.dataplane.policy_config`), service time = profile + executor cost,
   latency = simulated latency + the fixed per-request cost;
6. relative errors of p50, p99 and mean batch size per load; pass/fail against the target up to a load.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import orjson

from headroom.batching.policy import BatchPolicyConfig
from headroom.loadgen.arrivals import ArrivalSpec, make_schedule
from headroom.loadgen.clients import ClientConfig
from headroom.loadgen.runner import BenchConfig, environment, run_bench
from headroom.loadgen.scrape import parse_prometheus_text
from headroom.loadgen.workloads import Sample, WorkloadSpec, make_workload, sentences
from headroom.models.base import Model
from headroom.models.config import ModelConfig
from headroom.models.repository import ModelRepository
from headroom.profiling.measure import BatchTiming, default_batch_sizes, profile_document
from headroom.server.dataplane import policy_config
from headroom.sim.config import SimConfig
from headroom.sim.engine import simulate
from headroom.sim.profile import ServiceProfile, profile_from_mapping, resolve_profile

SCHEMA = "headroom.sim.validate/1"
OVERHEAD_MODES = ("fixed", "empirical")


@dataclass(frozen=True, slots=True)
class ValidateConfig:
    """One validation run."""

    model: str  # model directory name in the repository (digits, minilm, noop, ...)
    model_repository: Path = Path("models")  # where the model lives
    profile_path: str | None = None  # a profile file to use instead of measuring one here
    profile_repeats: int = 30  # timed predict calls per batch size when profiling here
    loads: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9)  # fractions of the profile's capacity to offer
    capacity_per_s: float = 0.0  # > 0: use this capacity (req/s) instead of the profile's B_max / T(B_max)
    duration_s: float = 30.0  # seconds of Poisson arrivals per load
    warmup_queries: int = 20  # bench warm-up requests before each measured run (not measured)
    calibration_queries: int = 200  # single-stream requests that measure the fixed per-request cost
    target_rel_error: float = 0.15  # |sim - real| / real allowed for p50 and p99
    pass_up_to_load: float = 0.7  # loads at or below this must meet the target; above it is reported only
    seed: int = 0  # seeds the schedule (bench and simulator share it), the dataset and the service noise
    overhead: str = "fixed"  # judged model of the per-request cost: fixed (median) | empirical (measured draws)
    server_start_timeout_s: float = 120.0  # how long to wait for /v2/health/ready

    def __post_init__(self) -> None:
        if not self.loads or any(not 0 < f < 1.5 for f in self.loads):
            raise ValueError(f"loads must be fractions of capacity in (0, 1.5), e.g. 0.3,0.5,0.7; got {self.loads}")
        if self.duration_s <= 0 or self.calibration_queries < 1 or self.profile_repeats < 1:
            raise ValueError("duration_s must be > 0; calibration_queries and profile_repeats >= 1")
        if self.capacity_per_s < 0 or self.target_rel_error <= 0:
            raise ValueError("capacity_per_s must be >= 0 (0 = from the profile); target_rel_error > 0")
        if self.overhead not in OVERHEAD_MODES:
            raise ValueError(f"overhead must be one of {', '.join(OVERHEAD_MODES)}, got {self.overhead!r}")


@dataclass(frozen=True, slots=True)
class Overhead:
    """What the simulator does not model, measured on the server at one request at a time."""

    per_request_s: float  # fixed cost added to every simulated latency (HTTP, JSON, preprocess, response)
    per_batch_s: float  # executor time outside predict per batch (collate, split, postprocess), added to T(B)
    single_stream_p50_s: float  # client-side median latency of the calibration run
    single_stream_compute_p50_s: float  # median Server-Timing compute of the calibration run
    samples_s: tuple[float, ...] = ()  # every calibration request's cost outside queue, predict and executor

    def draw(self, count: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
        """`count` per-request costs resampled from the calibration run (the fixed cost if none)."""
        if not self.samples_s:
            return np.full(count, self.per_request_s)
        return rng.choice(np.asarray(self.samples_s, dtype=np.float64), size=count)


def relative_error(sim: float, real: float) -> float:
    """(sim - real) / real; nan when either is missing or real is 0."""
    if not (math.isfinite(sim) and math.isfinite(real)) or real == 0:
        return math.nan
    return (sim - real) / real


def capacity_per_s(profile: ServiceProfile, max_batch_size: int, per_batch_s: float = 0.0) -> float:
    """Requests per second one instance sustains at full batches: B / (T(B) + executor cost)."""
    b = max(1, max_batch_size)
    return b / (profile.mean_service_s(b) + per_batch_s)


def with_batch_overhead(profile: ServiceProfile, per_batch_s: float) -> ServiceProfile:
    """The profile with a constant executor cost added to every batch size's mean."""
    return replace(profile, service_times_s=tuple(t + per_batch_s for t in profile.service_times_s),
                   name=f"{profile.name} + {per_batch_s * 1e3:.3f} ms/batch")


def sim_config_for(config: ModelConfig, seed: int) -> SimConfig:
    """The simulated deployment of one served model: its batching policy, one replica per instance."""
    policy: BatchPolicyConfig = policy_config(config)
    batching = policy.mode if config.max_batch_size > 0 else "none"
    if batching not in ("none", "static", "dynamic", "adaptive"):
        raise ValueError(f"the simulator cannot validate batching mode {batching!r} (dynamic, static, adaptive)")
    instances = max(1, config.instances)
    return SimConfig(replicas=instances, batching=batching, policy=policy, shared_queue=instances > 1, seed=seed)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def real_server(model: str, repository: Path, timeout_s: float, log_path: Path) -> Iterator[str]:
    """Run `headroom serve --model M` in a subprocess; yield its base URL once ready; terminate it after."""
    port = free_port()
    cmd = [sys.executable, "-m", "headroom.cli.main", "serve", "--model-repository", str(repository),
           "--model", model, "--http-port", str(port), "--grpc-port", "-1", "--no-access-log",
           "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        try:
            deadline = time.monotonic() + timeout_s
            with httpx.Client(timeout=2.0) as http:
                while True:
                    if proc.poll() is not None:
                        raise RuntimeError(f"the server exited with code {proc.returncode} before ready; "
                                           f"its log: {log_path.read_text()[-2000:]}")
                    with contextlib.suppress(httpx.HTTPError):
                        if http.get(f"{url}/v2/health/ready").status_code == 200:
                            break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the server was not ready after {timeout_s:g} s; log: {log_path}")
                    time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def workload_for(model: str, config: ModelConfig, workdir: Path, seed: int) -> WorkloadSpec:
    """The bench dataset for a model: digits images; for text models the bench's sentences as V2 bodies of
    shape [1, 1] (the batch dimension included, as the server validates them); a small FP32 row otherwise."""
    spec = config.inputs[0]
    if model == "digits" or spec.shape == (1, 8, 8):
        return WorkloadSpec(kind="digits")
    if spec.datatype == "BYTES":
        texts = [s.text for s in sentences(256, np.random.default_rng(seed + 1))]
        bodies = [{"inputs": [{"name": spec.name, "shape": [1, 1], "datatype": "BYTES", "data": [t]}]} for t in texts]
    else:
        dims = [1] + [d if d > 0 else 8 for d in spec.shape]
        bodies = [{"inputs": [{"name": spec.name, "shape": dims, "datatype": "FP32",
                               "data": [0.5] * int(np.prod(dims))}]}]
    path = workdir / "bodies.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"body": b}) + b"\n" for b in bodies))
    return WorkloadSpec(kind="jsonl", path=str(path), num_samples=len(bodies))


def _scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=5.0).text
    return parse_prometheus_text(text, ("headroom_busy", "headroom_compute", "headroom_batch_size"))


def _series(values: dict[str, float], name: str) -> float:
    return sum(v for k, v in values.items() if k.partition("{")[0] == name)


def calibrate(url: str, model: str, workload: WorkloadSpec, queries: int, seed: int) -> Overhead:
    """Single-stream closed loop: the fixed per-request and per-batch costs outside the simulated model."""
    before = _scrape(url)
    cfg = BenchConfig(client=ClientConfig(url=url, model=model, http_client="aiohttp"), scenario="single-stream",
                      closed_concurrency=1, num_queries=queries, duration_s=3600.0, workload=workload,
                      metrics_url="none", warmup_queries=min(20, queries), seed=seed, label="calibration")
    outcome = asyncio.run(run_bench(cfg))
    after = _scrape(url)
    rest, lat, comp = [], [], []
    for r in outcome.collector.records:
        if not r.ok:
            continue
        st = dict(r.server_timing_ms)
        rest.append(r.latency_s - (st.get("queue", 0.0) + st.get("compute", 0.0)) / 1e3)
        lat.append(r.latency_s)
        comp.append(st.get("compute", 0.0) / 1e3)
    if not rest:
        raise RuntimeError(f"no calibration request succeeded; errors: {outcome.result['counts']['error_examples']}")
    batches = _series(after, "headroom_batch_size_count") - _series(before, "headroom_batch_size_count")
    busy = _series(after, "headroom_busy_seconds_total") - _series(before, "headroom_busy_seconds_total")
    compute = _series(after, "headroom_compute_seconds_sum") - _series(before, "headroom_compute_seconds_sum")
    per_batch = max(0.0, (busy - compute) / batches) if batches > 0 else 0.0
    return Overhead(per_request_s=max(0.0, float(np.median(rest)) - per_batch), per_batch_s=per_batch,
                    single_stream_p50_s=float(np.median(lat)), single_stream_compute_p50_s=float(np.median(comp)),
                    samples_s=tuple(max(0.0, v - per_batch) for v in rest))


def wire_inputs(sample: Sample, config: ModelConfig) -> dict[str, npt.NDArray[Any]]:
    """The decoded V2 tensors the server hands the model for one bench sample (what preprocess receives)."""
    spec = config.inputs[0]
    if sample.body is not None:
        t = sample.body["inputs"][0]
        if t["datatype"] == "BYTES":
            return {t["name"]: np.array([str(v).encode() for v in t["data"]], dtype=object).reshape(t["shape"])}
        return {t["name"]: np.asarray(t["data"], dtype=np.float32).reshape(t["shape"])}
    if sample.pixels is not None:
        return {spec.name: sample.pixels.astype(np.float32)}
    return {spec.name: np.array([[sample.text.encode()]], dtype=object)}


def measure_on_workload(model: Model, config: ModelConfig, samples: list[Sample], batch_sizes: tuple[int, ...],
                        repeats: int, warmup: int = 2) -> list[BatchTiming]:
    """Predict time of batches of bench samples, preprocessed and collated as the server does. Repeat k of
    size B uses samples k*B .. k*B+B-1 (padding varies as in the server); sizes are interleaved round-robin
    so a burst of load from other processes lands on every size alike instead of skewing one."""
    items = [model.preprocess(wire_inputs(s, config), {}) for s in samples]

    def batch(size: int, k: int) -> Any:
        return model.collate([items[(k * size + j) % len(items)] for j in range(size)])

    for size in batch_sizes:
        for k in range(warmup):
            model.predict(batch(size, k))
    times: dict[int, list[float]] = {b: [] for b in batch_sizes}
    for k in range(repeats):
        for size in batch_sizes:
            b = batch(size, k)
            start = time.perf_counter()
            model.predict(b)
            times[size].append(time.perf_counter() - start)
    return [BatchTiming(b, tuple(times[b])) for b in batch_sizes]


def measure_profile(cfg: ValidateConfig, workload: WorkloadSpec, on_step: Callable[[str], None]) -> ServiceProfile:
    """The profile file given, or predict time by batch size measured here on the bench's own samples."""
    if cfg.profile_path:
        return resolve_profile(cfg.profile_path)
    repo = ModelRepository(cfg.model_repository)
    entry = repo.scan([cfg.model]).models[0]
    samples = make_workload(workload, np.random.default_rng(cfg.seed + 1))
    loaded = repo.load_version(entry, entry.versions[-1])
    try:
        sizes = default_batch_sizes(entry.config.max_batch_size)
        on_step(f"profiling {cfg.model} at batch sizes {', '.join(map(str, sizes))} ({cfg.profile_repeats} repeats)")
        timings = measure_on_workload(loaded.model, entry.config, samples, sizes, cfg.profile_repeats)
    finally:
        loaded.unload()
    doc = profile_document(cfg.model, timings, cfg.profile_repeats)
    meta = doc["meta"]
    if isinstance(meta, dict):
        meta["inputs"] = f"bench workload {workload.kind!r} (seed {cfg.seed + 1}), preprocessed as the server does"
    return profile_from_mapping(doc)


def _ms(seconds: float) -> float | None:
    return round(seconds * 1e3, 4) if math.isfinite(seconds) else None


def _err(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


def _pcts(latencies_s: npt.NDArray[np.float64]) -> tuple[float, float]:
    if not latencies_s.size:
        return math.nan, math.nan
    p50, p99 = np.percentile(latencies_s, [50, 99])
    return float(p50), float(p99)


def compare_load(fraction: float, rate: float, real: dict[str, Any], sim_cfg: SimConfig, profile: ServiceProfile,
                 overhead: Overhead, spec: ArrivalSpec, seed: int, cfg: ValidateConfig) -> dict[str, Any]:
    """Simulate one load on the bench's own schedule and compare with the bench's result."""
    arrivals = make_schedule(spec, np.random.default_rng(seed))
    res = simulate(sim_cfg, profile, arrivals)
    fixed = res.latencies_s + overhead.per_request_s
    drawn = res.latencies_s + overhead.draw(res.latencies_s.size, np.random.default_rng(seed + 7))
    fixed_pct = _pcts(fixed)
    drawn_pct = _pcts(drawn)
    sim_p50, sim_p99 = fixed_pct if cfg.overhead == "fixed" else drawn_pct
    real_p50 = float(real["latency_ms"]["p50_ms"]) / 1e3
    real_p99 = float(real["latency_ms"]["p99_ms"]) / 1e3
    stages = real.get("server_timing_ms", {})
    means = real.get("server_metrics", {}).get("window_means", {})
    real_batch = next((float(v) for k, v in means.items() if k.startswith("headroom_batch_size{")), math.nan)
    e50, e99 = relative_error(sim_p50, real_p50), relative_error(sim_p99, real_p99)
    judged = fraction <= cfg.pass_up_to_load + 1e-9
    ok = all(math.isfinite(e) and abs(e) <= cfg.target_rel_error for e in (e50, e99))
    return {
        "load_fraction": fraction, "rate_per_s": rate, "requests": int(arrivals.size),
        "real": {"p50_ms": _ms(real_p50), "p99_ms": _ms(real_p99), "mean_batch_size": _err(real_batch),
                 "completed": real["counts"]["completed"],
                 "compute_mean_ms": stages.get("compute", {}).get("mean_ms"),
                 "queue_mean_ms": stages.get("queue", {}).get("mean_ms"),
                 "throughput_per_s": real["throughput"]["requests_per_s"], "errors": real["counts"]["errors"],
                 "late_fraction": real["generator"]["late_fraction"], "valid": real["scenario"]["valid"]},
        "sim": {"p50_ms": _ms(sim_p50), "p99_ms": _ms(sim_p99), "mean_batch_size": _err(res.mean_batch_size),
                "utilisation": _err(res.utilisation), "throughput_per_s": res.throughput_per_s,
                "overhead": cfg.overhead, "mean_wait_ms": _ms(res.mean_wait_s),
                "profile_ms_at_real_batch": _ms(profile.mean_service_s(max(1, round(real_batch))))
                if math.isfinite(real_batch) else None},
        "sim_fixed_overhead": {"p50_ms": _ms(fixed_pct[0]), "p99_ms": _ms(fixed_pct[1]),
                               "rel_error_p50": _err(relative_error(fixed_pct[0], real_p50)),
                               "rel_error_p99": _err(relative_error(fixed_pct[1], real_p99))},
        "sim_empirical_overhead": {"p50_ms": _ms(drawn_pct[0]), "p99_ms": _ms(drawn_pct[1]),
                                   "rel_error_p50": _err(relative_error(drawn_pct[0], real_p50)),
                                   "rel_error_p99": _err(relative_error(drawn_pct[1], real_p99))},
        "rel_error": {"p50": _err(e50), "p99": _err(e99),
                      "mean_batch_size": _err(relative_error(res.mean_batch_size, real_batch))},
        "judged": judged, "pass": ok if judged else None,
    }


def run_validation(cfg: ValidateConfig, on_step: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Profile, start the server, calibrate, bench each load, simulate it, compare. Returns the JSON report."""
    entry = ModelRepository(cfg.model_repository).scan([cfg.model]).models
    if not entry:
        raise ValueError(f"{cfg.model!r} is not a tensor model in {cfg.model_repository} (LLMs: not yet)")
    mcfg = entry[0].config
    sim_base = sim_config_for(mcfg, cfg.seed)
    with tempfile.TemporaryDirectory(prefix="headroom-validate-") as tmp:
        workdir = Path(tmp)
        workload = workload_for(cfg.model, mcfg, workdir, cfg.seed)
        profile = measure_profile(cfg, workload, on_step)
        on_step(f"starting the server for {cfg.model}")
        with real_server(cfg.model, cfg.model_repository, cfg.server_start_timeout_s, workdir / "server.log") as url:
            on_step(f"calibrating: {cfg.calibration_queries} single-stream requests")
            overhead = calibrate(url, cfg.model, workload, cfg.calibration_queries, cfg.seed)
            sim_profile = with_batch_overhead(profile, overhead.per_batch_s)
            cap_b = sim_base.policy.max_batch_size if sim_base.batching != "none" else 1
            implied = capacity_per_s(sim_profile, cap_b) * sim_base.replicas
            capacity = cfg.capacity_per_s or implied
            rows = []
            for i, fraction in enumerate(cfg.loads):
                rate = fraction * capacity
                spec = ArrivalSpec(kind="poisson", rate_per_s=rate, duration_s=cfg.duration_s)
                seed = cfg.seed + 1000 * (i + 1)
                on_step(f"load {fraction:.0%}: {rate:,.1f} req/s for {cfg.duration_s:g} s (bench)")
                bench = BenchConfig(client=ClientConfig(url=url, model=cfg.model, http_client="aiohttp"),
                                    scenario="server", arrival=spec, duration_s=cfg.duration_s, workload=workload,
                                    seed=seed, warmup_queries=cfg.warmup_queries, scrape_interval_s=0.5,
                                    label=f"sim-validate {fraction:.0%}")
                real = asyncio.run(run_bench(bench)).result
                rows.append(compare_load(fraction, rate, real, replace(sim_base, seed=seed), sim_profile, overhead,
                                         spec, seed, cfg))
    judged = [r for r in rows if r["judged"]]
    return {
        "schema": SCHEMA, "model": cfg.model, "environment": environment() | {"load_average": os.getloadavg()},
        "config": {"loads": list(cfg.loads), "duration_s": cfg.duration_s, "seed": cfg.seed,
                   "target_rel_error": cfg.target_rel_error, "pass_up_to_load": cfg.pass_up_to_load,
                   "calibration_queries": cfg.calibration_queries, "profile_path": cfg.profile_path,
                   "overhead": cfg.overhead},
        "simulated": {"batching": sim_base.batching, "replicas": sim_base.replicas,
                      "max_batch_size": sim_base.policy.max_batch_size,
                      "max_queue_delay_ms": sim_base.policy.max_queue_delay_s * 1e3,
                      "preferred_batch_sizes": list(sim_base.policy.preferred_batch_sizes)},
        "profile": profile.to_json(),
        "overhead": {"per_request_ms": _ms(overhead.per_request_s), "per_batch_ms": _ms(overhead.per_batch_s),
                     "single_stream_p50_ms": _ms(overhead.single_stream_p50_s),
                     "single_stream_compute_p50_ms": _ms(overhead.single_stream_compute_p50_s)},
        "capacity": {"implied_per_s": implied, "used_per_s": capacity,
                     "source": "--capacity-per-s" if cfg.capacity_per_s else "profile B_max / (T(B_max) + per-batch)"},
        "loads": rows,
        "verdict": {"pass": bool(judged) and all(r["pass"] for r in judged),
                    "judged_loads": [r["load_fraction"] for r in judged],
                    "worst_abs_error_judged": max((abs(e) for r in judged for e in (r["rel_error"]["p50"],
                                                  r["rel_error"]["p99"]) if e is not None), default=None)},
    }


def report_table(report: dict[str, Any]) -> Any:
    """The comparison as a rich Table (p50, p99 and mean batch size per load, real / simulated)."""
    from rich.table import Table

    ov = report["overhead"]
    other = "empirical" if report["config"]["overhead"] == "fixed" else "fixed"
    table = Table(title=f"headroom sim --validate: {report['model']}, {report['simulated']['batching']} batching; "
                  f"modelled overhead {ov['per_request_ms']:.2f} ms/request ({report['config']['overhead']}) "
                  f"+ {ov['per_batch_ms']:.2f} ms/batch")
    for col in ("load", "rate/s", "sim util", "p50 real/sim ms", "err", "p99 real/sim ms", "err",
                f"p99 err ({other})", "batch real/sim", "verdict"):
        table.add_column(col, justify="right")

    def f(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for r in report["loads"]:
        e, real, sim = r["rel_error"], r["real"], r["sim"]
        verdict = ("[green]pass[/]" if r["pass"] else "[red]fail[/]") if r["judged"] else "reported"
        alt = r[f"sim_{other}_overhead"]["rel_error_p99"]
        table.add_row(f"{r['load_fraction']:.0%}", f"{r['rate_per_s']:,.1f}", f(sim["utilisation"], ".0%"),
                      f"{f(real['p50_ms'], '.2f')} / {f(sim['p50_ms'], '.2f')}", f(e["p50"], "+.1%"),
                      f"{f(real['p99_ms'], '.2f')} / {f(sim['p99_ms'], '.2f')}", f(e["p99"], "+.1%"), f(alt, "+.1%"),
                      f"{f(real['mean_batch_size'], '.2f')} / {f(sim['mean_batch_size'], '.2f')}", verdict)
    table.caption = (f"err = (sim - real) / real; target |err| <= {report['config']['target_rel_error']:.0%} for "
                     f"p50 and p99 up to {report['config']['pass_up_to_load']:.0%} load; above it reported only")
    return table
