"""Cold-start loading: safetensors (memory-mapped) vs pickle `torch.load`, for digits and minilm weights.

    .venv/bin/python benchmarks/lifecycle/load_formats.py [--models-dir models] [--repeats 20]

For each model the same state dict is written as model.safetensors and as a pickle (`torch.save`) in a
temporary directory, then loaded `--repeats` times each way (page cache warm: this measures deserialization,
not the disk). Timed stages per format:

    open        safetensors.safe_open (mmap, reads only the header) | torch.load(mmap=True) | torch.load
    materialise touching every tensor's bytes (sum of one element per page) so lazy mmap pays its reads

Writes benchmarks/results/lifecycle/load_formats-<UTC time>.json and prints a table. Note that pickle is
executable code: `torch.load(weights_only=False)` is never used by the server unless a user opts in.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from headroom.models.artifacts import resolve_artifact
from headroom.models.builtin.minilm import DEFAULT_WEIGHTS

RESULTS = Path(__file__).resolve().parents[1] / "results" / "lifecycle"
Tensors = dict[str, torch.Tensor]


def touch(tensors: Tensors) -> float:
    """Read one element per 4 KiB page of every tensor (forces lazily mapped pages in)."""
    total = 0.0
    for t in tensors.values():
        flat = t.reshape(-1)
        step = max(1, 4096 // max(flat.element_size(), 1))
        total += float(flat[::step].float().sum())
    return total


def load_safetensors_mmap(path: Path) -> Tensors:
    with safe_open(str(path), framework="pt", device="cpu") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118 - safe_open has no __iter__


def load_safetensors_file(path: Path) -> Tensors:
    return dict(load_file(str(path), device="cpu"))


def load_pickle(path: Path) -> Tensors:
    state: Tensors = torch.load(str(path), map_location="cpu", weights_only=True)
    return state


def load_pickle_mmap(path: Path) -> Tensors:
    state: Tensors = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    return state


LOADERS: dict[str, Callable[[Path], Tensors]] = {
    "safetensors safe_open (mmap)": load_safetensors_mmap,
    "safetensors load_file": load_safetensors_file,
    "torch.load pickle (weights_only)": load_pickle,
    "torch.load pickle mmap=True": load_pickle_mmap,
}


def measure(loader: Callable[[Path], Tensors], path: Path, repeats: int) -> dict[str, float]:
    opens, totals = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        tensors = loader(path)
        opened = time.perf_counter()
        touch(tensors)
        done = time.perf_counter()
        opens.append((opened - start) * 1000.0)
        totals.append((done - start) * 1000.0)
        del tensors
    return {
        "open_ms_median": statistics.median(opens),
        "total_ms_median": statistics.median(totals),
        "total_ms_min": min(totals),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-dir", type=Path, default=Path("models"), help="repository with built digits")
    parser.add_argument("--repeats", type=int, default=20, help="loads per format and model")
    args = parser.parse_args()
    sources = {
        "digits": args.models_dir / "digits" / "1" / "model.safetensors",
        "minilm": resolve_artifact(DEFAULT_WEIGHTS, args.models_dir, "minilm") / "model.safetensors",
    }
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, source in sources.items():
            state = {k: v.contiguous() for k, v in load_file(str(source)).items()}
            st_path, pt_path = Path(tmp) / f"{model}.safetensors", Path(tmp) / f"{model}.pt"
            save_file(state, str(st_path))
            torch.save(state, str(pt_path))
            for name, loader in LOADERS.items():
                path = st_path if name.startswith("safetensors") else pt_path
                result = measure(loader, path, args.repeats)
                rows.append(
                    {"model": model, "format": name, "file_bytes": path.stat().st_size, "tensors": len(state), **result}
                )
    result_doc = {
        "benchmark": "load_formats",
        "page_cache": "warm (files just written; repeated loads)",
        "repeats": args.repeats,
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        },
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"load_formats-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result_doc, indent=2) + "\n")
    print("| model | format | MB | open ms (median) | open+touch ms (median) |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['model']} | {r['format']} | {int(r['file_bytes']) / 1e6:.1f} | {r['open_ms_median']:.2f} | "
            f"{r['total_ms_median']:.2f} |"
        )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
