"""Draft-model speculative decoding on SmolLM2-135M (CPU): CPU time per output token, acceptance rate, target
steps per output token, and whether greedy output equals plain decoding, for

    plain        no speculation
    ngram        prompt lookup (speculative_ngram_tokens = k)
    self         SmolLM2 as its own draft (acceptance ~100%, the draft costs as much as the target)
    skip<N>      a layer-skip draft: SmolLM2's first N of 30 layers + its final norm and head (same vocabulary)

The configurations are interleaved and repeated; medians are reported. CPU time is the process's
(`time.process_time`, one intra-op thread), so other users of a shared machine distort it little.

    .venv/bin/python benchmarks/llm/bench_draft_model.py                 # ~3 min on a quiet 2-core box
    .venv/bin/python benchmarks/llm/bench_draft_model.py --repeats 1 --max-tokens 16 --streams 1

Results: benchmarks/results/llm_draft_model_<UTC timestamp>.json (numbers measured, never asserted).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from headroom.llm.config import EngineConfig
from headroom.llm.engine import LLMEngine
from headroom.llm.offline import DEFAULT_MODEL, LLM, build_engine
from headroom.llm.request import SamplingParams
from headroom.llm.tokenizer import Tokenizer
from headroom.llm.weights import LoadedCheckpoint, load_checkpoint

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash table works, with an example in Python.",
    "List the planets of the solar system and one fact about each.",
    "What are the benefits of regular exercise? Answer in a few sentences.",
]


def _skip_draft(ckpt: LoadedCheckpoint, num_layers: int) -> tuple[Any, dict[str, torch.Tensor]]:
    """The first `num_layers` decoder layers of the checkpoint, with its embeddings, final norm and head."""
    cfg = replace(ckpt.config, num_hidden_layers=num_layers)
    keep = {
        k: v
        for k, v in ckpt.state_dict.items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < num_layers
    }
    return cfg, keep


def _engine(ckpt: LoadedCheckpoint, tok: Tokenizer, name: str, k: int, skip_layers: int) -> LLMEngine:
    base = EngineConfig(kv_cache_memory_mb=64, num_threads=1)
    if name == "plain":
        return build_engine(ckpt.config, ckpt.state_dict, base, tok)
    if name == "ngram":
        return build_engine(ckpt.config, ckpt.state_dict, replace(base, speculative_ngram_tokens=k), tok)
    cfg = replace(base, speculative_draft_tokens=k)
    draft = (ckpt.config, ckpt.state_dict) if name == "self" else _skip_draft(ckpt, skip_layers)
    return build_engine(ckpt.config, ckpt.state_dict, cfg, tok, draft=draft)


def _measure(engine: LLMEngine, prompts: list[list[int]], streams: int, max_tokens: int) -> dict[str, Any]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm = LLM(engine)
    outputs: list[list[int]] = []
    steps = 0
    cpu0, wall0 = time.process_time(), time.monotonic()
    d0, a0 = engine.spec_draft_tokens, engine.spec_accepted_tokens
    for i in range(0, len(prompts), streams):
        batch = prompts[i : i + streams]
        for j, p in enumerate(batch):
            engine.add_request(f"b{i}-{j}", p, params)
        done: dict[str, list[int]] = {}
        while engine.has_unfinished:
            steps += 1
            done.update({o.request_id: list(o.token_ids) for o in engine.step() if o.finished})
        outputs += [done[f"b{i}-{j}"] for j in range(len(batch))]
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    del llm
    n_out = sum(len(o) for o in outputs)
    drafted, accepted = engine.spec_draft_tokens - d0, engine.spec_accepted_tokens - a0
    return {
        "cpu_ms_per_token": 1000 * cpu / n_out,
        "wall_ms_per_token": 1000 * wall / n_out,
        "target_steps_per_token": steps / n_out,
        "acceptance_rate": accepted / drafted if drafted else None,
        "draft_tokens": drafted,
        "outputs": outputs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="target model (.gguf, HF dir or package:...)")
    ap.add_argument("--draft-tokens", type=int, default=4, help="k, draft tokens per step")
    ap.add_argument("--skip-layers", type=int, default=24, help="layers kept by the layer-skip draft")
    ap.add_argument("--configs", default="plain,ngram,self,skip", help="comma list of plain,ngram,self,skip")
    ap.add_argument("--streams", type=int, default=1, help="concurrent requests per batch")
    ap.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (medians reported)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="results directory")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ckpt = load_checkpoint(args.model)
    tok = Tokenizer(ckpt.tokenizer)
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
    names = args.configs.split(",")
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with Progress() as progress:
        task = progress.add_task("measuring", total=args.repeats * len(names))
        for _ in range(args.repeats):
            for name in names:
                engine = _engine(ckpt, tok, name, args.draft_tokens, args.skip_layers)
                runs[name].append(_measure(engine, prompts, args.streams, args.max_tokens))
                progress.advance(task)
    reference = runs[names[0]][0]["outputs"]
    summary: dict[str, Any] = {}
    table = Table("config", "CPU ms/token", "wall ms/token", "target steps/token", "acceptance", "== first config")
    for name in names:
        rs = runs[name]
        med = {key: statistics.median(r[key] for r in rs) for key in ("cpu_ms_per_token", "wall_ms_per_token")}
        acc = rs[0]["acceptance_rate"]
        summary[name] = {
            **med,
            "cpu_ms_per_token_runs": [r["cpu_ms_per_token"] for r in rs],
            "target_steps_per_token": rs[0]["target_steps_per_token"],
            "acceptance_rate": acc,
            "identical_to_first_config": all(r["outputs"] == reference for r in rs),
        }
        table.add_row(
            name if name != "skip" else f"skip{args.skip_layers}",
            f"{med['cpu_ms_per_token']:.1f}",
            f"{med['wall_ms_per_token']:.1f}",
            f"{rs[0]['target_steps_per_token']:.2f}",
            "-" if acc is None else f"{acc:.2f}",
            str(summary[name]["identical_to_first_config"]),
        )
    Console().print(table)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"llm_draft_model_{stamp}.json"
    record = {
        "benchmark": "llm_draft_model",
        "date_utc": stamp,
        "loadavg": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": summary,
    }
    path.write_text(json.dumps(record, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
