"""`headroom sim --validate`, steps 2-3: the real server in a subprocess and the calibration passes.

Calibration is either a closed-loop run, one request at a time, so nothing queues and nothing overlaps, or
an open-loop Poisson run at a low rate (`rate_per_s`), the bench's own conditions where requests rarely
queue. Either gives what the simulator does not model as queueing and batching:

* the fixed per-request cost (HTTP, JSON, validation, preprocessing, response, client): the median of
  ``latency - Server-Timing queue - Server-Timing compute``, minus the per-batch cost;
* the per-batch executor cost outside predict (collate, split, postprocess, thread hand-off):
  ``(headroom_busy_seconds from /metrics - predict seconds from /v2/models/M/stats) / batches``;
* the host CPU per request: the server process's CPU time (/proc/PID/stat utime + stime, every thread, exited
  ones included) over the run, minus the CPU of the threads that run batches (the `model_threads` non-main
  threads that burned the most CPU: the executor thread, which calls collate, predict and split, plus the
  runtime's intra-op pool threads; /proc/PID/task/TID/stat), divided by the requests served. That is the
  event loop (HTTP, JSON, validation, response) and the preprocessing pool: the work that, under load, runs
  on the model's cores while batches run (`headroom.sim.cpu_share`). Thread CPU time does not depend on
  how long other processes kept a thread waiting, so this holds on a busy machine too;
* the executor time per batch and the mean batch size (`busy_per_batch_s`, `mean_batch_size`): against the
  isolated profile they give the in-service slowdown (`headroom.sim.slowdown`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt

from headroom.loadgen.arrivals import ArrivalSpec
from headroom.loadgen.clients import ClientConfig
from headroom.loadgen.runner import BenchConfig, RunOutcome, run_bench
from headroom.loadgen.scrape import parse_prometheus_text
from headroom.loadgen.workloads import WorkloadSpec
from headroom.router.replicas import free_port


@dataclass(frozen=True, slots=True)
class Overhead:
    """What the simulator does not model as queueing, measured on the server at one request at a time."""

    per_request_s: float  # fixed cost added to every simulated latency (HTTP, JSON, preprocess, response)
    per_batch_s: float  # executor time outside predict per batch (collate, split, postprocess), added to T(B)
    single_stream_p50_s: float  # client-side median latency of the calibration run
    single_stream_compute_p50_s: float  # median Server-Timing compute of the calibration run
    samples_s: tuple[float, ...] = ()  # every calibration request's cost outside queue, predict and executor
    host_cpu_per_request_s: float = 0.0  # server CPU seconds per request outside the model and the executor
    server_cpu_s: float = 0.0  # server process CPU seconds over the calibration run (all threads)
    batch_threads_cpu_s: float = 0.0  # of which the threads that run batches (executor + intra-op pool)
    requests: int = 0  # requests the server served in the calibration run (warm-up included)
    batches: int = 0  # batches the server executed in the calibration run (warm-up included)
    busy_per_batch_s: float = 0.0  # mean executor time per batch (predict + collate/split), the server's own
    mean_batch_size: float = 0.0  # items per batch in the calibration run
    rate_per_s: float = 0.0  # open-loop Poisson rate of the run; 0 = single-stream closed loop

    def draw(self, count: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
        """`count` per-request costs resampled from the calibration run (the fixed cost if none)."""
        if not self.samples_s:
            return np.full(count, self.per_request_s)
        return rng.choice(np.asarray(self.samples_s, dtype=np.float64), size=count)


@dataclass(frozen=True, slots=True)
class RunningServer:
    """A `headroom serve` subprocess that answers readiness."""

    url: str  # http://127.0.0.1:PORT
    pid: int  # its process id (for /proc CPU time)


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process, all its threads, in seconds (from /proc/PID/stat; clock-tick resolution)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    ticks = int(fields[11]) + int(fields[12])  # fields 14 and 15 of the whole line: utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (utime + stime) of each live thread of a process, by thread id."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (task / "stat").read_text().rpartition(")")[2].split()
            out[int(task.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def thread_wait_s(pid: int) -> dict[int, float]:
    """Seconds each live thread of a process spent runnable but waiting for a CPU (/proc/.../schedstat)."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            out[int(task.name)] = int((task / "schedstat").read_text().split()[1]) / 1e9
    return out


def _top_threads(before: dict[int, float], after: dict[int, float], pid: int, threads: int) -> list[int]:
    deltas = sorted(((cpu - before.get(tid, 0.0), tid) for tid, cpu in after.items() if tid != pid), reverse=True)
    return [tid for _, tid in deltas[: max(1, threads)]]


def batch_threads_cpu_s(before: dict[int, float], after: dict[int, float], pid: int, threads: int) -> float:
    """CPU of the `threads` non-main threads that burned the most between two `thread_cpu_s` readings."""
    return sum(after[t] - before.get(t, 0.0) for t in _top_threads(before, after, pid, threads))


@contextlib.contextmanager
def settled_gc() -> Iterator[None]:
    """Around a measured run in this process (the load generator): collect the previous passes' garbage first
    and freeze what survives, so that a gen-2 collection over it cannot stall the generator's event loop
    mid-run (an open-loop generator counts its own stalls in latency); unfreeze afterwards."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def real_server(model: str, repository: Path, timeout_s: float, log_path: Path,
                cpus: str = "", extra_args: tuple[str, ...] = ()) -> Iterator[RunningServer]:
    """Run `headroom serve --model M [extra_args]` (pinned to `cpus` if given) in a subprocess; yield it once
    ready; terminate it (kill after 30 s) on exit."""
    port = free_port()
    cmd = [sys.executable, "-m", "headroom.cli.main", "serve", "--model-repository", str(repository),
           "--model", model, "--http-port", str(port), "--grpc-port", "-1", "--no-access-log",
           "--log-level", "warning",
           # the caller named this model in a repository it chose (e.g. the python `sleep` benchmark model)
           "--trusted-backends", "onnxruntime,torch,llm,python"]
    if cpus:
        cmd += ["--cpus", cpus]
    cmd += extra_args
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
            yield RunningServer(url, proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def scrape(url: str, model: str) -> dict[str, float]:
    """The server's busy seconds (/metrics) and its batch counters (/v2/models/M/stats, the V2 statistics
    extension): batches executed, items executed and predict seconds summed over batches."""
    text = httpx.get(f"{url}/metrics", timeout=5.0).text
    out = parse_prometheus_text(text, ("headroom_busy",))
    stats = httpx.get(f"{url}/v2/models/{model}/stats", timeout=5.0).json()["model_stats"]
    out["executions"] = float(sum(s["execution_count"] for s in stats))
    out["inferences"] = float(sum(s["inference_count"] for s in stats))
    # Triton's inference_stats.compute_infer counts per request; batch_stats counts each executed batch once
    out["compute_s"] = sum(b["compute_infer"]["ns"] for s in stats for b in s["batch_stats"]) / 1e9
    return out


def series(values: dict[str, float], name: str) -> float:
    """The sum of a metric over its label sets."""
    return sum(v for k, v in values.items() if k.partition("{")[0] == name)


@dataclass(frozen=True, slots=True)
class ServerReading:
    """The server's counters at one moment: /metrics and its CPU time."""

    metrics: dict[str, float]  # busy seconds series from /metrics, executions / inferences / compute_s (stats)
    cpu_s: float  # process CPU seconds, every thread (exited ones included)
    threads_cpu_s: dict[int, float]  # CPU seconds of each live thread, by thread id
    threads_wait_s: dict[int, float]  # run-queue wait seconds of each live thread (runnable, no CPU)


def read_server(server: RunningServer, model: str) -> ServerReading:
    """Scrape the server's counters and read its process's CPU times."""
    return ServerReading(scrape(server.url, model), process_cpu_s(server.pid), thread_cpu_s(server.pid),
                         thread_wait_s(server.pid))


def usage_between(before: ServerReading, after: ServerReading, pid: int, model_threads: int) -> dict[str, float]:
    """What the server did between two readings: batches, items, busy and compute seconds, process CPU, CPU of
    the threads that run batches and their run-queue wait (time they were preempted: by the server's own host
    threads and by other processes), and the host CPU per item (the rest of the process CPU, per item)."""
    def delta(name: str) -> float:
        return series(after.metrics, name) - series(before.metrics, name)

    items = delta("inferences")
    cpu = after.cpu_s - before.cpu_s
    batch_cpu = batch_threads_cpu_s(before.threads_cpu_s, after.threads_cpu_s, pid, model_threads)
    top = _top_threads(before.threads_cpu_s, after.threads_cpu_s, pid, model_threads)
    wait = sum(after.threads_wait_s.get(t, 0.0) - before.threads_wait_s.get(t, 0.0) for t in top)
    return {"batch_threads_wait_s": wait, "batches": delta("executions"), "items": items,
            "busy_s": delta("headroom_busy_seconds_total"), "compute_s": delta("compute_s"),
            "cpu_s": cpu, "batch_threads_cpu_s": batch_cpu,
            "host_cpu_per_item_s": max(0.0, (cpu - batch_cpu) / items) if items > 0 else 0.0}


def measured_bench(server: RunningServer, model: str, cfg: BenchConfig, model_threads: int,
                   settle_gc: bool = True) -> tuple[RunOutcome, dict[str, float]]:
    """Run the bench against the server and read what the server did meanwhile (`usage_between`, plus `wall_s`,
    the run's wall time); with `settle_gc`, the generator's garbage is collected and frozen first
    (`settled_gc`)."""
    before = read_server(server, model)
    start_s = time.monotonic()
    with settled_gc() if settle_gc else contextlib.nullcontext():
        outcome = asyncio.run(run_bench(cfg))
    wall_s = time.monotonic() - start_s
    return outcome, usage_between(before, read_server(server, model), server.pid, model_threads) | {"wall_s": wall_s}


def calibrate(server: RunningServer, model: str, workload: WorkloadSpec, queries: int, seed: int,
              model_threads: int = 1, rate_per_s: float = 0.0, duration_s: float = 0.0) -> Overhead:
    """The fixed per-request and per-batch costs, the host CPU per request and the executor time per batch.

    `rate_per_s` 0: single-stream closed loop, `queries` requests (nothing queues, nothing overlaps; the
    generator idles while the server computes). `rate_per_s` > 0: open-loop Poisson at that rate for
    `duration_s` seconds (the conditions of the bench: idle gaps between batches, the generator sending while
    the server computes, latency from the intended send time); keep the rate low so that requests rarely queue.
    `model_threads`: how many server threads run batches (the executor thread plus the runtime's intra-op
    pool: the intra-op thread count for onnxruntime and torch, 1 otherwise).
    """
    if rate_per_s < 0 or (rate_per_s > 0 and duration_s <= 0):
        raise ValueError(f"an open-loop calibration needs rate_per_s > 0 and duration_s > 0, got {rate_per_s}, "
                         f"{duration_s}")
    client = ClientConfig(url=server.url, model=model, http_client="aiohttp")
    if rate_per_s > 0:
        cfg = BenchConfig(client=client, scenario="server", duration_s=duration_s, workload=workload,
                          arrival=ArrivalSpec(kind="poisson", rate_per_s=rate_per_s, duration_s=duration_s),
                          metrics_url="none", warmup_queries=min(20, queries), seed=seed,
                          label="calibration (open loop)")
    else:
        cfg = BenchConfig(client=client, scenario="single-stream", closed_concurrency=1, num_queries=queries,
                          duration_s=3600.0, workload=workload, metrics_url="none", warmup_queries=min(20, queries),
                          seed=seed, label="calibration")
    outcome, used = measured_bench(server, model, cfg, model_threads)
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

    batches, busy, compute = used["batches"], used["busy_s"], used["compute_s"]
    per_batch = max(0.0, (busy - compute) / batches) if batches > 0 else 0.0
    return Overhead(per_request_s=max(0.0, float(np.median(rest)) - per_batch), per_batch_s=per_batch,
                    single_stream_p50_s=float(np.median(lat)), single_stream_compute_p50_s=float(np.median(comp)),
                    samples_s=tuple(max(0.0, v - per_batch) for v in rest),
                    host_cpu_per_request_s=used["host_cpu_per_item_s"], server_cpu_s=used["cpu_s"],
                    batch_threads_cpu_s=used["batch_threads_cpu_s"], requests=int(used["items"]),
                    batches=int(batches), busy_per_batch_s=busy / batches if batches > 0 else 0.0,
                    mean_batch_size=used["items"] / batches if batches > 0 else 0.0, rate_per_s=rate_per_s)


def saturation(server: RunningServer, model: str, workload: WorkloadSpec, concurrency: int, queries: int, seed: int,
               model_threads: int = 1) -> dict[str, float]:
    """Closed loop with `concurrency` workers (>= 2 x B_max keeps full batches queued): the throughput the
    server really sustains, with the host CPU per request, executor time per batch and mean batch size there
    (the host CPU per request at full batches feeds `cpu_share.split_host_cpu`; the throughput is reported
    against the calibrated capacity)."""
    if concurrency < 1 or queries < 1:
        raise ValueError(f"concurrency and queries must be >= 1, got {concurrency}, {queries}")
    cfg = BenchConfig(client=ClientConfig(url=server.url, model=model, http_client="aiohttp"),
                      scenario="single-stream", closed_concurrency=concurrency, num_queries=queries,
                      duration_s=3600.0, workload=workload, metrics_url="none",
                      warmup_queries=min(concurrency, queries), seed=seed, label="saturation")
    outcome, used = measured_bench(server, model, cfg, model_threads, settle_gc=False)
    b = used["batches"]
    return {"throughput_per_s": float(outcome.result["throughput"]["requests_per_s"]),
            "errors": float(outcome.result["counts"]["errors"]), "concurrency": float(concurrency),
            "host_cpu_per_request_s": used["host_cpu_per_item_s"],
            "busy_per_batch_s": used["busy_s"] / b if b else 0.0, "mean_batch_size": used["items"] / b if b else 0.0}
