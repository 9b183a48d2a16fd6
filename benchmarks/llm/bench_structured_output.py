"""TPOT of JSON-schema-constrained decoding vs unconstrained decoding, in one run of the default engine.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/llm/bench_structured_output.py --rounds 5 --batch 4 \\
        --out benchmarks/results/llm_structured_output_2026-12-03.json

One engine (the native default, weight_dtype auto) serves every round. A round runs the same `--batch` chat
prompts three times: free (ignore_eos, `--max-tokens` tokens), under a JSON schema (a list of records: long
enough to decode `--max-tokens` tokens) with the masks computed in the mask thread during the forward (the
default), and under the schema with the masks computed inline after the forward; in rotating order, all
sequences of a mode in one continuous batch. TPOT of a sequence = (last token - first token) / (tokens - 1) on
the engine clock. The JSON holds every round's per-mode median TPOT, the medians over rounds, and the overheads
(constrained / free - 1). Wall time is at the mercy of a shared machine, so it also records CPU time: the
process's CPU per output token of free decoding, and the engine thread's CPU per output token spent in the
grammar work (masks, applying them, advancing matchers; inline mode): their ratio is the constraint's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.llm.machine_info import cpu_description
from headroom.llm import engine as engine_mod
from headroom.llm import grammar
from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.grammar import MaskWorker
from headroom.llm.offline import DEFAULT_MODEL, load_engine
from headroom.llm.request import SamplingParams
from headroom.llm.structured_output import schema_grammar

SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"type": "string", "maxLength": 16},
            "member": {"type": "boolean"},
        },
        "required": ["name", "age", "city", "member"],
        "additionalProperties": False,
    },
    "minItems": 8,
}
PROMPTS = [
    "List some people as JSON records with name, age, city and member.",
    "Give me a JSON array of club members.",
    "Write JSON describing the staff of a small shop.",
    "Produce a JSON list of students.",
    "A JSON array of customers, please.",
    "Invent a few characters as JSON.",
    "Output team members in JSON.",
    "JSON list of neighbours.",
]


class GrammarCpu:
    """Engine-thread CPU seconds spent in the grammar work (masks, applying them, advancing the matchers): robust
    to a loaded machine, unlike wall time. Wraps the functions the engine calls (instrumentation only)."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        for module, name in ((grammar, "compute_masks"), (grammar, "apply_bitmask"), (engine_mod, "advance")):
            setattr(module, name, self._timed(getattr(module, name)))

    def _timed(self, fn: Any) -> Any:
        def wrapped(*args: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args)
            finally:
                self.cpu_s += time.thread_time() - t0
        return wrapped


def tpot_ms(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, tag: str,
            cpu: dict[str, float]) -> list[float]:
    """Run the prompts as one batch; each sequence's time per output token after the first (ms). Adds the
    process CPU seconds and output tokens of the run to `cpu`."""
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", p, params)
    done: dict[str, Any] = {}
    t0 = time.process_time()
    while engine.has_unfinished:
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    cpu["process_cpu_s"] = cpu.get("process_cpu_s", 0.0) + time.process_time() - t0
    cpu["tokens"] = cpu.get("tokens", 0.0) + sum(len(o.token_ids) for o in done.values())
    out_tpot = []
    for out in done.values():
        n = len(out.token_ids)
        if out.timeline is not None and out.timeline.last_token_s and out.first_token_s and n > 1:
            out_tpot.append((out.timeline.last_token_s - out.first_token_s) * 1e3 / (n - 1))
    return out_tpot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4, help="sequences decoded together per mode")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-threads", type=int, default=0, help="EngineConfig.num_threads (0 = auto)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--note", default="", help="what else ran on the machine (recorded with the load averages)")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    cfg = replace(EngineConfig(), kv_cache_memory_mb=128, num_threads=args.num_threads)
    engine, _ = load_engine(DEFAULT_MODEL, cfg)
    tok = engine.tokenizer
    if tok is None:
        raise SystemExit("the default model has no tokenizer")
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]), add_special_tokens=False)
               for p in (PROMPTS * (args.batch // len(PROMPTS) + 1))[: args.batch]]
    grammar = schema_grammar(SCHEMA, "bench")
    free = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    constrained = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, grammar=grammar)
    tpot_ms(engine, prompts[:1], constrained, "warm", {})  # compile the grammar, build the llguidance tokenizer
    gcpu = GrammarCpu()
    cpu: dict[str, dict[str, float]] = {"free": {}, "json": {}, "json_inline": {}}
    rounds = []
    for r in range(args.rounds):
        order = [("free", free, True), ("json", constrained, True), ("json_inline", constrained, False)]
        order = order[r % 3 :] + order[: r % 3]  # rotate, so drift of the machine's load hits every mode alike
        row: dict[str, Any] = {"round": r, "uptime": subprocess.run(["uptime"], capture_output=True,
                                                                    text=True).stdout.strip()}
        for name, params, threaded in order:
            engine.mask_worker.threaded = threaded
            before = gcpu.cpu_s
            row[f"{name}_tpot_ms"] = statistics.median(tpot_ms(engine, prompts, params, f"{name}{r}", cpu[name]))
            if name == "json_inline":
                cpu[name]["grammar_cpu_s"] = cpu[name].get("grammar_cpu_s", 0.0) + gcpu.cpu_s - before
        rounds.append(row)
        print(f"round {r}: free {row['free_tpot_ms']:.2f} ms, json (masks in the thread) {row['json_tpot_ms']:.2f} "
              f"ms, json (masks inline after the forward) {row['json_inline_tpot_ms']:.2f} ms")
    engine.close()
    free_med = statistics.median(r["free_tpot_ms"] for r in rounds)
    json_med = statistics.median(r["json_tpot_ms"] for r in rounds)
    inline_med = statistics.median(r["json_inline_tpot_ms"] for r in rounds)
    free_cpu_ms = 1e3 * cpu["free"]["process_cpu_s"] / cpu["free"]["tokens"]
    json_cpu_ms = 1e3 * cpu["json_inline"]["process_cpu_s"] / cpu["json_inline"]["tokens"]
    grammar_cpu_ms = 1e3 * cpu["json_inline"]["grammar_cpu_s"] / cpu["json_inline"]["tokens"]
    result = {
        "benchmark": "structured_output_tpot",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": DEFAULT_MODEL,
        "weight_dtype": cfg.weight_dtype,
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "json_schema": SCHEMA,
        "rounds": rounds,
        "free_tpot_ms_median": free_med,
        "json_tpot_ms_median": json_med,
        "json_inline_tpot_ms_median": inline_med,
        "free_process_cpu_ms_per_token": free_cpu_ms,
        "json_inline_process_cpu_ms_per_token": json_cpu_ms,
        "process_cpu_overhead_inline": json_cpu_ms / free_cpu_ms - 1,
        "grammar_cpu_ms_per_token": grammar_cpu_ms,
        "grammar_cpu_overhead": grammar_cpu_ms / free_cpu_ms,
        "overhead": json_med / free_med - 1,
        "overhead_inline_masks": inline_med / free_med - 1,
        "default_masks_on_this_machine": "thread" if MaskWorker().threaded else "inline",
        "cpu_count": os.cpu_count(),
        "cpu": cpu_description(),
        "load_average_1m": {"start": load_start, "end": os.getloadavg()[0]},
        "note": args.note,
    }
    print(f"CPU per token: free {free_cpu_ms:.3f} ms (process), grammar work {grammar_cpu_ms:.3f} ms "
          f"({100 * grammar_cpu_ms / free_cpu_ms:.1f}%)")
    print(f"median TPOT: free {free_med:.2f} ms, json {json_med:.2f} ms (inline masks {inline_med:.2f} ms), "
          f"overhead {100 * (json_med / free_med - 1):+.1f}%")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    else:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
