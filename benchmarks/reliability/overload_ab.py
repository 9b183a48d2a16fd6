"""A/B of the overload scenario: arms are model repositories (a copy of `models/` with minilm's config changed),
run alternately round by round so that a machine's drift falls on both arms alike. `--code NAME=CHECKOUT` runs
one arm's server from another checkout (two revisions of the code: `git worktree add /tmp/base HEAD`).

    python -m benchmarks.reliability.overload_ab --arm base=/tmp/repo0 --arm new=models --rounds 3 \\
        --name slo_reserve --note "quiet"
    python -m benchmarks.reliability.overload_ab --arm main=models --arm new=models --code main=/tmp/base \\
        --rounds 3 --name admission_replay

Writes benchmarks/results/overload_<name>_ab_<date>.json with every run's figures (those of
`benchmarks.reliability.overload.run`) and prints each arm's medians.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.reliability import overload
from benchmarks.reliability.common import ROOT

FIGURES = ("accepted_p99_ms", "goodput_per_s", "goodput_vs_capacity", "capacity_per_s", "rejection_p99_ms")


def _arm(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not (Path(path) / "minilm" / "config.yaml").is_file():
        raise argparse.ArgumentTypeError(f"--arm wants NAME=REPOSITORY with minilm/config.yaml inside, got {text!r}")
    return name, Path(path)


def _serve_args(text: str) -> tuple[str, tuple[str, ...]]:
    name, sep, args = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f'--serve-args wants NAME="--flag value", got {text!r}')
    return name, tuple(shlex.split(args))


def _code(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not (Path(path) / "headroom" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"--code wants NAME=CHECKOUT with headroom/__init__.py inside, got {text!r}")
    return name, Path(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", type=_arm, action="append", required=True, help="NAME=REPOSITORY (repeat: 2 or more).")
    p.add_argument("--serve-args", type=_serve_args, action="append", default=[],
                   help='NAME="--flag value ...": extra `headroom serve` flags for one arm.')
    p.add_argument("--code", type=_code, action="append", default=[],
                   help="NAME=CHECKOUT: run one arm's server from another checkout's `headroom` package.")
    p.add_argument("--rounds", type=int, default=3, help="Runs of each arm, alternating.")
    p.add_argument("--duration-s", type=float, default=30.0, help="Each overload run at 2x capacity.")
    p.add_argument("--capacity-s", type=float, default=10.0, help="Each closed-loop capacity measurement.")
    p.add_argument("--slo-ms", type=float, default=100.0, help="minilm's latency SLO (goodput counts within it).")
    p.add_argument("--name", required=True, help="What is compared (the result file's name).")
    p.add_argument("--note", default="", help="How the machine was.")
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    a = p.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in a.arm}
    extra = dict(a.serve_args)
    code = dict(a.code)
    with tempfile.TemporaryDirectory(prefix="headroom-overload-ab-") as tmp:
        for r in range(a.rounds):
            for name, repo in a.arm:
                res = overload.run(Path(tmp), a.duration_s, a.capacity_s, a.slo_ms, repository=repo,
                                   serve_args=extra.get(name, ()), code=code.get(name, ROOT))
                runs[name].append(res)
                print(f"round {r + 1} {name}: " + ", ".join(f"{k} {res[k]:.3g}" for k in FIGURES if res[k] is not None),
                      flush=True)
    medians = {name: {k: statistics.median(x[k] for x in rs if x[k] is not None) for k in FIGURES}
               for name, rs in runs.items()}
    out = {"benchmark": f"overload_{a.name}_ab", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": "python -m benchmarks.reliability.overload_ab " + " ".join(
               f"--arm {n}={'models' if Path(r).resolve() == (ROOT / 'models').resolve() else '<a copy: see arms>'}"
               for n, r in a.arm)
           + "".join(f' --serve-args {n}="{shlex.join(args)}"' for n, args in a.serve_args)
           + "".join(f" --code {n}=<a checkout: see code>" for n, _ in a.code)
           + f" --rounds {a.rounds} --name {a.name}",
           "arms": {n: (Path(r) / "minilm" / "config.yaml").read_text() for n, r in a.arm},
           "code": {n: _revision(path) for n, path in a.code},
           "machine": {"processor": platform.processor() or platform.machine(), "note": a.note},
           "medians": medians, "runs": runs}
    a.out_dir.mkdir(parents=True, exist_ok=True)
    path = a.out_dir / f"overload_{a.name}_ab_{time.strftime('%Y-%m-%d', time.gmtime())}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    for name, m in medians.items():
        print(f"{name}: medians " + ", ".join(f"{k} {v:.3g}" for k, v in m.items()))
    print(f"wrote {path}")


def _revision(checkout: Path) -> str:
    """The commit a checkout is at, and whether its tree differs from it."""
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain"], capture_output=True, text=True,
                           check=False).stdout.strip()
    return f"{head}{' (modified)' if dirty else ''}" or str(checkout)


if __name__ == "__main__":
    main()
