"""Cold start of `headroom serve` for SmolLM2: process start to `/v2/health/ready`, per weight dtype.

    .venv/bin/python benchmarks/llm/cold_start_serve.py                      # native default and fp32, 3 repeats each
    .venv/bin/python benchmarks/llm/cold_start_serve.py --weight-dtypes auto --repeats 5

Each repeat starts a fresh server process on a free port from a temporary model repository (a copy of
models/smollm2/config.yaml with `weight_dtype` set), polls readiness every 20 ms, then reads the per-stage
gauge `headroom_llm_cold_start_seconds{stage}` from /metrics and stops the server. The converted cache
(~/.cache/headroom/llm/, made on the very first start) must be present: one unmeasured start per dtype runs
first to make sure. The package's bytecode is compiled first, as `make serve` does (an editable install has
none, and with PYTHONDONTWRITEBYTECODE set every start would recompile every module: ~0.3 s here). Weight
dtypes are interleaved (auto, fp32, auto, ...) so machine load hits both alike.
Writes benchmarks/results/llm_cold_start_<timestamp>.json (median per dtype, every run's stages, `uptime`).
Target (issue 16): ready <= 2 s, the first start included (`--first-start`: every start from an empty model cache).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console

from headroom.router.replicas import free_port

ROOT = Path(__file__).resolve().parents[2]
HEADROOM = str(Path(sys.executable).with_name("headroom"))
console = Console(stderr=True)
STAGE = re.compile(r'^headroom_llm_cold_start_seconds\{[^}]*stage="([^"]+)"[^}]*\}\s+([0-9.eE+-]+)$')


def write_repository(dest: Path, weight_dtype: str, threads: int, cache_dir: Path | None = None) -> None:
    """models/smollm2/config.yaml under `dest`, with `weight_dtype` (and `num_threads` when >= 0, `cache_dir` when
    given) overridden."""
    cfg = yaml.safe_load((ROOT / "models" / "smollm2" / "config.yaml").read_text())
    cfg["parameters"]["weight_dtype"] = weight_dtype
    if cache_dir is not None:
        cfg["parameters"]["cache_dir"] = str(cache_dir)
    if threads >= 0:
        cfg["parameters"]["num_threads"] = threads
    (dest / "smollm2").mkdir(parents=True, exist_ok=True)
    (dest / "smollm2" / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc (-1 where there is none): on a shared
    machine a start's CPU time says more than its wall time, which waits for other processes."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return -1.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def one_start(repo: Path, timeout_s: float) -> dict[str, Any]:
    """Start a server, time it to ready, read its cold-start stages, stop it."""
    port = free_port()
    cmd = [HEADROOM, "serve", "--model-repository", str(repo), "--model", "smollm2", "--http-port", str(port)]
    cmd += ["--grpc-port", "-1", "--no-access-log", "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        ready_s = cpu_s = -1.0
        with httpx.Client(timeout=1.0) as client:
            while time.monotonic() - t0 < timeout_s:
                if proc.poll() is not None:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise SystemExit(f"server exited with {proc.returncode}:\n{err[-2000:]}")
                try:
                    if client.get(url + "/v2/health/ready").status_code == 200:
                        ready_s = time.monotonic() - t0
                        cpu_s = process_cpu_s(proc.pid)
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.02)
            if ready_s < 0:
                raise SystemExit(f"not ready after {timeout_s:.0f} s")
            stages = {}
            for line in client.get(url + "/metrics").text.splitlines():
                m = STAGE.match(line)
                if m:
                    stages[m.group(1)] = float(m.group(2))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"ready_s": ready_s, "cpu_s": cpu_s, "stages_s": stages}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weight-dtypes", default="auto,fp32", help="comma-separated weight_dtype values")
    ap.add_argument("--repeats", type=int, default=3, help="measured starts per dtype (median reported)")
    ap.add_argument("--threads", type=int, default=-1, help="num_threads override (-1 = the config's)")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument(
        "--first-start", action="store_true",
        help="every measured start gets an EMPTY model cache (cache_dir): the first start of a GGUF, tokenizer build "
        "included (the compiled kernel library stays in $HEADROOM_CACHE_DIR/kernels)",
    )  # fmt: skip
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--label", default="", help="what code ran (e.g. a commit), stored in the result and its file name")
    args = ap.parse_args()
    dtypes = args.weight_dtypes.split(",")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "headroom")], check=True)
    repos: dict[str, Path] = {}
    for wd in dtypes:
        repos[wd] = Path(tempfile.mkdtemp(prefix=f"cold_start_{wd}_"))
        write_repository(repos[wd], wd, args.threads)
        one_start(repos[wd], args.timeout_s)  # makes sure the GGUF's cache (and fp32 weights) exist; not measured
    runs: dict[str, list[dict[str, Any]]] = {wd: [] for wd in dtypes}
    load_start = [round(v, 2) for v in os.getloadavg()]
    for rnd in range(args.repeats):
        for wd in dtypes:
            if args.first_start:
                write_repository(repos[wd], wd, args.threads, Path(tempfile.mkdtemp(prefix="cold_start_cache_")))
            r = one_start(repos[wd], args.timeout_s)
            r["load_average_1m"] = round(os.getloadavg()[0], 2)
            runs[wd].append(r)
            stages = " ".join(f"{k} {v:.2f}" for k, v in r["stages_s"].items())
            console.print(f"round {rnd + 1} {wd:5s}: ready in {r['ready_s']:.2f} s, {r['cpu_s']:.2f} s CPU  ({stages})")
    medians = {wd: statistics.median(r["ready_s"] for r in rs) for wd, rs in runs.items()}
    cpu_medians = {wd: statistics.median(r["cpu_s"] for r in rs) for wd, rs in runs.items()}
    result = {
        "kind": "llm_cold_start",
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "what": "headroom serve --model smollm2: process start to /v2/health/ready, "
        + ("first start: empty model cache" if args.first_start else "model cache present"),
        "label": args.label,
        "target_s": 2.0,
        "ready_s_median": medians,
        "cpu_s_median": cpu_medians,  # the server process's CPU seconds at ready
        "runs": runs,
        "machine": {
            "cpu_count": os.cpu_count(),
            "load_average_start": load_start,
            "load_average_end": [round(v, 2) for v in os.getloadavg()],
        },
    }
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = Path(args.out) / f"llm_cold_start_{stamp}{'_' + args.label if args.label else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    for wd, med in medians.items():
        console.print(f"{wd}: median ready {med:.2f} s (target <= 2 s), {cpu_medians[wd]:.2f} s CPU")
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
