"""Where one decode token's time goes on the default smollm2 config (issue 16: one-stream TPOT, 32-stream tok/s).

    .venv/bin/python benchmarks/llm/profile_decode.py [--batch 1,32] [--threads 1,2] [--steps 30] [--http]
        [--out benchmarks/results/llm_profile_decode_<date>.json]

In-process, offline engine (no HTTP), the default native runner, ~100-token prompts, greedy, then:

1. **Engine split** per decode step (median over `--steps`), wall and process CPU time (all threads: the C step's
   OpenMP team included): the C step (`hr_native_step` itself), the rest of the runner (batch flattening, thread
   tuner), the sampler, `engine._append` (detokenizer, stop checks, per-token observer), `engine._output`, the
   scheduler's decision, and what is left of `LLMEngine.step` (batch items, prefix-cache bookkeeping, stats).
2. **Inside the C step**, the captured decode batch replayed straight through the kernel: the whole step; without
   the lm_head (no logit rows); with 0 layers (embedding + lm_head only). Per layer = (no lm_head - 0 layers and no
   lm_head) / layers. Each linear of layer 0 timed alone (`hr_native_gemm` on the runner's own packed tensors, its
   step's activation bits) and the rest of a layer (norms, quantisation, RoPE, attention, barriers) by difference.
3. **Bytes streamed per token**: the weights a decode step reads (every linear + the lm_head, in their GGUF formats)
   and the K/V it attends over, against the memory bandwidth measured here (numpy copies of 32 / 96 / 256 MB arrays,
   one thread: read + write bytes / time) and against the C step's own effective rate (weight bytes / step time).
4. With `--http`: `headroom serve` on 127.0.0.1 (this checkout's `models/` repository, smollm2 only) and one
   streamed /v1/completions request at a time (64 tokens, ignore_eos); TPOT p50 from the client's chunk arrival
   times and the server's own mean inter-token latency (its /metrics) against the offline engine's step time at
   batch 1 = the async serving overhead per token (`--http-threads` sets each server's num_threads).

Thread counts: each `--threads` value is run in a child process with that `num_threads` (the OpenMP runtime reads
its wait policy once, when it loads: `--omp-env KEY=VALUE,...` sets the child's environment; the default is the
CLI's `OMP_WAIT_POLICY=PASSIVE`). On a shared machine wall times are inflated by other load; the CPU times are the
steadier guide, and every number in the JSON says which it is.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # profile the checkout this script is in, not an installed headroom
# what `headroom serve` runs with (headroom.cli.main.OPENMP_DEFAULTS; tests/benchmarks/test_profile_decode_env.py)
OMP_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "20000"}
BLOCK_BYTES = {"F32": 128, "F16": 64, "Q4_0": 18, "Q4_1": 20, "Q8_0": 34}  # bytes per 32 values
FORMAT_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q8_0"}


class Timer:
    """Accumulated wall and process-CPU seconds of the calls a wrapper timed, reset per step."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall += time.perf_counter() - t
                self.cpu += time.process_time() - c

        return timed


def med_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e3, 4)


def timed_calls(fn: Callable[[], object], reps: int) -> dict[str, float]:
    """Median wall and process-CPU ms of `reps` calls (after one warm-up call)."""
    fn()
    wall, cpu = [], []
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"wall_ms": med_ms(wall), "cpu_ms": med_ms(cpu), "wall_min_ms": round(min(wall) * 1e3, 4)}


def tensor_bytes(t: Any) -> int:
    return int(t.rows * t.cols // 32 * BLOCK_BYTES[FORMAT_NAMES[int(t.fmt)]])


def engine_split(batch: int, threads: int, steps: int, prompt_tokens: int) -> dict[str, Any]:
    """Load the default engine, run `batch` greedy streams and time each part of `steps` decode steps."""
    from headroom.llm import engine as engine_mod
    from headroom.llm.config import EngineConfig
    from headroom.llm.offline import DEFAULT_MODEL, load_engine
    from headroom.llm.request import SamplingParams

    cfg = EngineConfig(num_threads=threads, max_num_seqs=max(32, batch), kv_cache_memory_mb=512)
    engine, report = load_engine(DEFAULT_MODEL, cfg)
    runner: Any = engine.runner
    kernel = runner.kernel
    tok = engine.tokenizer
    if tok is None:
        raise SystemExit("no tokenizer")
    parts = {name: Timer() for name in ("c_step", "runner", "sampler", "append", "output", "schedule", "step")}
    raw_fn = kernel._fn
    kernel._fn = parts["c_step"].wrap(raw_fn)
    runner.execute = parts["runner"].wrap(runner.execute)
    raw_sample = engine_mod.sample
    engine_mod.sample = parts["sampler"].wrap(raw_sample)  # type: ignore[attr-defined]
    engine._append = parts["append"].wrap(engine._append)  # type: ignore[method-assign]
    engine._output = parts["output"].wrap(engine._output)  # type: ignore[method-assign]
    engine.scheduler.schedule = parts["schedule"].wrap(engine.scheduler.schedule)  # type: ignore[method-assign]
    step = parts["step"].wrap(engine.step)
    captured: list[Any] = []
    execute = runner.execute

    def capture(b: Any) -> Any:
        captured[:] = [b]
        return execute(b)

    runner.execute = capture
    params = SamplingParams(temperature=0.0, max_tokens=steps + 16, ignore_eos=True)
    for i in range(batch):
        ids = tok.encode(f"Request {i}. Please explain the water cycle to a curious student. " * 12)[:prompt_tokens]
        engine.add_request(f"r{i}", ids, params)
    while any(r.num_output_tokens == 0 for r in engine.scheduler.requests.values()):
        engine.step()
    for _ in range(4):  # warm: thread tuner, caches
        step()
    rows: dict[str, list[float]] = {f"{k}_{u}": [] for k in parts for u in ("wall", "cpu")}
    for _ in range(steps):
        for p in parts.values():
            p.wall = p.cpu = 0.0
        step()
        for k, p in parts.items():
            rows[f"{k}_wall"].append(p.wall)
            rows[f"{k}_cpu"].append(p.cpu)
    out: dict[str, Any] = {k: med_ms(v) for k, v in rows.items()}
    for u in ("wall", "cpu"):  # derived, per step: runner minus the C call; step minus every timed part
        runner_c = zip(rows[f"runner_{u}"], rows[f"c_step_{u}"], strict=True)
        out[f"runner_python_{u}"] = med_ms([r - c for r, c in runner_c])
        out[f"engine_other_{u}"] = med_ms([
            s - r - sa - a - o - sc
            for s, r, sa, a, o, sc in zip(*(rows[f"{k}_{u}"] for k in ("step", "runner", "sampler", "append", "output",
                                                                        "schedule")), strict=True)
        ])  # fmt: skip
    out["tok_per_s_wall"] = round(batch / (out["step_wall"] / 1e3), 1)
    out["threads_last_step"] = runner.threads_now
    kernel._fn, engine_mod.sample = raw_fn, raw_sample  # type: ignore[attr-defined]
    breakdown = c_step_breakdown(engine, kernel, captured[0], threads, reps=max(5, steps // (2 if batch > 8 else 1)))
    engine.close()
    return {"engine_ms_per_step": out, "kernel": breakdown, "isa": runner.isa, "weight_format": report.weight_format}


def c_step_breakdown(engine: Any, kernel: Any, batch: Any, threads: int, reps: int) -> dict[str, Any]:
    """The captured decode batch replayed through the kernel: whole step, no lm_head, 0 layers; each linear alone."""
    import numpy as np

    from headroom.llm.kernels.build import load_library
    from headroom.llm.kernels.native_gemm import ISA_NAMES, CQTensor
    from headroom.llm.step_batch import BatchItem, ModelBatch

    threads = max(1, threads or engine.runner.threads_now or 1)
    model = kernel._model
    n_layers = int(model.num_layers)
    no_logits = ModelBatch(
        tuple(BatchItem(it.request_id, it.token_ids, it.start_position, it.block_table, False) for it in batch.items),
        batch.block_size_tokens,
    )
    full = timed_calls(lambda: kernel.step(batch, threads), reps)
    no_head = timed_calls(lambda: kernel.step(no_logits, threads), reps)
    try:
        model.num_layers = 0
        head_only = timed_calls(lambda: kernel.step(batch, threads), reps)
        embed_only = timed_calls(lambda: kernel.step(no_logits, threads), reps)
    finally:
        model.num_layers = n_layers
    m = len(batch.items)
    out: dict[str, Any] = {"threads": threads, "rows": m, "step": full, "step_without_lm_head": no_head,
                           "embed_and_lm_head_only": head_only, "embed_only": embed_only}  # fmt: skip
    for u in ("cpu_ms", "wall_ms"):
        out[f"lm_head_{u}"] = round(full[u] - no_head[u], 4)
        out[f"per_layer_{u}"] = round((no_head[u] - embed_only[u]) / n_layers, 4)
        out[f"lm_head_share_{u.split('_')[0]}"] = round(out[f"lm_head_{u}"] / full[u], 4)
    lib = load_library()
    fn = lib.hr_native_gemm
    fn.argtypes = [ctypes.POINTER(CQTensor), ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_int64]  # fmt: skip
    fn.restype = ctypes.c_int
    isa = ISA_NAMES.index(kernel.isa)
    rng = np.random.default_rng(0)
    linears: dict[str, Any] = {}
    layer0 = kernel._layers[0]
    bits = {"down": 16, "lm_head": 16}  # native_step.c: HR_DOWN_BITS and the lm_head's 16-bit inputs
    specs = [(n, getattr(layer0, n)) for n in ("q", "k", "v", "o", "gate", "up", "down")] + [("lm_head", model.lm_head)]
    for name, t in specs:
        x = rng.standard_normal((m, int(t.cols))).astype(np.float32)
        y = np.empty((m, int(t.rows)), dtype=np.float32)

        def call(t: Any = t, x: Any = x, y: Any = y, b: int = bits.get(name, 8), what: str = name) -> None:
            if fn(ctypes.byref(t), x.ctypes.data, m, y.ctypes.data, isa, threads, b) != 0:
                raise RuntimeError(f"hr_native_gemm refused {what}")

        r = timed_calls(call, reps * 3)
        r.update(rows=int(t.rows), cols=int(t.cols), fmt=FORMAT_NAMES[int(t.fmt)], act_bits=bits.get(name, 8),
                 weight_bytes=tensor_bytes(t))  # fmt: skip
        r["weight_gb_per_s_wall"] = round(r["weight_bytes"] / (r["wall_ms"] / 1e3) / 1e9, 2)
        linears[name] = r
    out["linears"] = linears
    for u in ("cpu_ms", "wall_ms"):
        lin = sum(linears[n][u] for n in ("q", "k", "v", "o", "gate", "up", "down"))
        out[f"layer_linears_{u}"] = round(lin, 4)
        out[f"layer_rest_{u}"] = round(out[f"per_layer_{u}"] - lin, 4)  # norms, quantisation, RoPE, attention, sync
    layer_bytes = sum(linears[n]["weight_bytes"] for n in ("q", "k", "v", "o", "gate", "up", "down"))
    cfg = engine.runner.config
    ctx = statistics.mean(it.start_position + 1 for it in batch.items)
    kv_bytes = int(ctx * n_layers * 2 * cfg.num_key_value_heads * cfg.head_dim_resolved * 4 * m)
    weights = layer_bytes * n_layers + linears["lm_head"]["weight_bytes"]
    out["bytes_per_step"] = {"weights": weights, "kv_read": kv_bytes, "mean_context_tokens": round(ctx, 1)}
    out["bytes_per_token"] = {"weights": weights // m, "kv_read": kv_bytes // m}
    out["effective_gb_per_s"] = {
        u: round((weights + kv_bytes) / (full[f"{u}_ms"] / 1e3) / 1e9, 2) for u in ("wall", "cpu")
    }
    return out


def memory_bandwidth() -> dict[str, Any]:
    """One-thread numpy copies: (read + written bytes) / time, best of 5, for sizes around the weights' size."""
    import numpy as np

    out = {}
    for mb in (32, 96, 256):
        src = np.ones(mb * 2**20, dtype=np.uint8)
        dst = np.empty_like(src)
        best = min(_time(lambda src=src, dst=dst: np.copyto(dst, src)) for _ in range(5))
        out[f"copy_{mb}MB_gb_per_s"] = round(2 * src.nbytes / best / 1e9, 2)
        f64 = src.view(np.float64)
        best = min(_time(lambda f64=f64: f64.sum()) for _ in range(5))
        out[f"sum_{mb}MB_read_gb_per_s"] = round(src.nbytes / best / 1e9, 2)
    return out


def _time(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def server_itl(client: Any, url: str) -> tuple[float, float]:
    """(sum, count) of the server's own inter-token latency histogram (the engine thread's clock)."""
    text = client.get(url + "/metrics").text
    got = {}
    for line in text.splitlines():
        for part in ("sum", "count"):
            if line.startswith(f"headroom_llm_inter_token_latency_seconds_{part}{{"):
                got[part] = got.get(part, 0.0) + float(line.rsplit(" ", 1)[1])
    return got.get("sum", 0.0), got.get("count", 0.0)


def http_tpot(threads: int, requests: int, tokens: int) -> dict[str, Any]:
    """One streamed completion at a time against `headroom serve` (num_threads `threads`, -1 = the config's);
    TPOT from the chunks' arrival times at the client, and the engine's own mean inter-token latency."""
    import tempfile

    import httpx

    sys.path.insert(0, str(ROOT / "benchmarks" / "llm"))
    from serving_servers import free_port, headroom_repository

    port = free_port()
    repo = Path(tempfile.mkdtemp(prefix="profile-decode-repo-"))
    headroom_repository(repo, "", threads)
    cmd = [str(Path(sys.executable).with_name("headroom")), "serve", "--model-repository", str(repo),
           "--model", "smollm2", "--http-port", str(port), "--grpc-port", "-1", "--no-access-log", "--log-level",
           "warning"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # serve this checkout
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=60) as client:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if client.get(url + "/v2/health/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("headroom serve did not become ready")
                time.sleep(0.2)  # polling a child's readiness (no condition to wait on in-process)
            prompt = " ".join(["The water cycle moves water between the sea, the air and the land."] * 8)
            tpots, gaps = [], []
            itl_before = (0.0, 0.0)
            for i in range(requests + 1):  # the first one warms the server (thread tuner, caches)
                if i == 1:
                    itl_before = server_itl(client, url)
                body = {"model": "smollm2", "prompt": f"{i}. {prompt}", "max_tokens": tokens, "temperature": 0,
                        "stream": True, "ignore_eos": True}  # fmt: skip
                arrivals = []
                with client.stream("POST", url + "/v1/completions", json=body) as r:
                    for line in r.iter_lines():
                        if line.startswith("data:") and "[DONE]" not in line:
                            arrivals.append(time.perf_counter())
                if i == 0 or len(arrivals) < 3:
                    continue
                d = [b - a for a, b in itertools.pairwise(arrivals[1:])]
                gaps.extend(d)
                tpots.append((arrivals[-1] - arrivals[1]) / (len(arrivals) - 2))
            itl_after = server_itl(client, url)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    n_itl = itl_after[1] - itl_before[1]
    engine_itl_ms = round((itl_after[0] - itl_before[0]) / n_itl * 1e3, 4) if n_itl else None
    return {"requests": requests, "tokens": tokens, "tpot_ms_p50": med_ms(tpots), "chunk_gap_ms_p50": med_ms(gaps),
            "engine_inter_token_ms_mean": engine_itl_ms, "num_threads": threads if threads >= 0 else "config"}


def child(args: argparse.Namespace) -> None:
    result = {str(b): engine_split(b, args.one_threads, args.steps, args.prompt_tokens)
              for b in (int(x) for x in args.batch.split(","))}  # fmt: skip
    print(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="1,32", help="comma-separated decode batch sizes")
    ap.add_argument("--threads", default="1,2", help="num_threads values, one child process each (0 = auto tuner)")
    ap.add_argument("--steps", type=int, default=30, help="decode steps timed per batch size")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--omp-env", default="", help="KEY=VALUE,... for the children (default OMP_WAIT_POLICY=PASSIVE)")
    ap.add_argument("--http", action="store_true", help="also measure TPOT through `headroom serve` (one stream)")
    ap.add_argument("--http-threads", default="-1", help="num_threads of each server (-1 = the config's: auto)")
    ap.add_argument("--label", default="", help="a tag stored in the JSON (e.g. the commit)")
    ap.add_argument("--out", default="", help="result JSON path")
    ap.add_argument("--one-threads", type=int, default=-1, help=argparse.SUPPRESS)  # internal: child mode
    args = ap.parse_args()
    if args.one_threads >= 0:
        child(args)
        return
    env = dict(os.environ)
    omp = dict(OMP_DEFAULTS)
    if args.omp_env:
        omp = dict(kv.split("=", 1) for kv in args.omp_env.split(","))
    env.update(omp)
    result: dict[str, Any] = {
        "what": "one decode step of the default smollm2 config, split (benchmarks/llm/profile_decode.py)",
        "label": args.label,
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"cpu": _cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_start": [round(x, 2) for x in os.getloadavg()]},
        "omp_env": omp,
        "note": "shared machine unless stated: wall times include other load; CPU times (process, all threads) "
        "are the steadier guide",
        "memory_bandwidth": memory_bandwidth(),
        "by_threads": {},
    }
    for th in (int(x) for x in args.threads.split(",")):
        cmd = [sys.executable, __file__, "--one-threads", str(th), "--batch", args.batch, "--steps", str(args.steps),
               "--prompt-tokens", str(args.prompt_tokens)]  # fmt: skip
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, check=False)
        if res.returncode != 0:
            raise SystemExit(f"child (threads {th}) failed:\n{res.stderr[-3000:]}")
        result["by_threads"][str(th)] = json.loads(res.stdout.strip().splitlines()[-1])
    if args.http:
        os.environ.update(omp)
        result["http_one_stream"] = {
            str(th): http_tpot(th, requests=3, tokens=64) for th in (int(x) for x in args.http_threads.split(","))
        }
    result["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
