"""The model's own rate: minilm loaded as `headroom serve` loads it, fed batches of the load generator's sentences
with no server around it (collate = tokenize + pad, then predict), on this process's CPUs.

    .venv/bin/python benchmarks/serving/model_alone.py [--batch-size 8] [--seconds 8] [--repository models]

Prints one JSON line: sentences/s (wall), model CPU ms per sentence (process time, every thread: ORT's and the
tokenizer's pools included) and the batches run. `run_lean_path_bench.py` runs it in a fresh process between
server rounds, so its figure and the servers' share the machine's state.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from headroom.loadgen.workloads import sentences
from headroom.models.repository import ModelRepository


def measure(repository: Path, model: str, batch_size: int, seconds: float, seed: int = 7) -> dict[str, object]:
    repo = ModelRepository(repository)
    entry = repo.scan([model]).get(model)
    if entry is None:
        raise SystemExit(f"no model {model!r} in {repository}")
    loaded = repo.load_version(entry, entry.versions[-1])
    m = loaded.model
    texts = [s.text for s in sentences(256, np.random.default_rng(seed))]
    batches = [texts[i:i + batch_size] for i in range(0, len(texts) - batch_size + 1, batch_size)]

    def run(batch: list[str]) -> None:
        inputs = m.preprocess({"text": np.array([[t.encode()] for t in batch], dtype=object)}, {})
        m.predict(m.collate([inputs]))

    for batch in batches[:4]:  # warm
        run(batch)
    done = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - wall0 < seconds:
        run(batches[done % len(batches)])
        done += 1
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    loaded.unload()
    n = done * batch_size
    return {"model": model, "batch_size": batch_size, "batches": done, "sentences_per_s": round(n / wall_s, 1),
            "cpu_ms_per_sentence": round(cpu_s / n * 1e3, 3), "wall_s": round(wall_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=Path(__file__).resolve().parents[2] / "models")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    print(json.dumps(measure(args.repository, args.model, args.batch_size, args.seconds)))


if __name__ == "__main__":
    main()
