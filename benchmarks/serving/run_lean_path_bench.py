"""Issue 18's lean-path figures in one run: headroom's V2 HTTP route and a real Triton (2.51, python backend +
dynamic batcher) serving the same minilm ONNX graph and tokenizer, side by side, plus the model's own rate.

    .venv/bin/python benchmarks/serving/run_lean_path_bench.py                      # ~8 min
    .venv/bin/python benchmarks/serving/run_lean_path_bench.py --base-ref e6b3af5   # + headroom at that commit

Every server is started once, fresh, on 127.0.0.1 (headroom as shipped: `headroom serve` with its default flags
and models/minilm/config.yaml; Triton from `../shared/peers/triton_serve.sh`, which installs it into
--triton-venv on first use). Each round visits every target in turn (rounds interleave, so drift in a shared
machine's load hits all alike), and reports medians over the rounds:

- **CPU per request** at a fixed open-loop rate (`--cpu-rate`, Poisson, one sentence per request): the
  server's CPU time over the probe (/proc, every thread and child process) divided by the requests answered.
  headroom's is split by thread: its event-loop thread (HTTP, gateway, routing, JSON, validation, batcher,
  metrics, logs) is the server's work *outside the model*; the other threads (the batch executor: tokenize,
  predict; onnxruntime's and the tokenizer's pools) are the model's. Triton's is split by process:
  `tritonserver` (HTTP, scheduler) and the python backend's stub (model.py: tokenize, predict, IPC).
- **Valid QPS**: `headroom bench sweep` (bisection on the rate; VALID when p99 <= --slo-p99-ms), the same
  client for every target; later rounds bracket the target's median so far.
- **The model's own rate** at batch 8 (`model_alone.py`, a fresh process per round, no server).

The load generator shares the machine's cores with the servers: the JSON records the load average and the
client's lag. Results: benchmarks/results/lean_path_<date>[_tag].json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_serving_bench as rsb  # sibling script: the same sweep, readiness and repository helpers

from headroom.models.artifacts import resolve_artifact

ROOT = rsb.ROOT
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_by_thread(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of `pid`."""
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (Triton's python backend stubs are its children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for tid in os.listdir(f"/proc/{p}/task"):
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
            except FileNotFoundError:
                continue
    return found


def cpu_snapshot(pid: int) -> dict[str, float]:
    """headroom: {"loop": its main thread, "workers": every other thread}; Triton: per process name."""
    snap: dict[str, float] = {}
    for p in process_tree(pid):
        try:
            name = Path(f"/proc/{p}/comm").read_text().strip()
            threads = cpu_by_thread(p)
        except FileNotFoundError:
            continue
        if p == pid and name != "tritonserver":
            snap["loop"] = snap.get("loop", 0.0) + threads.pop(p, 0.0)
            snap["workers"] = snap.get("workers", 0.0) + sum(threads.values())
        else:
            key = "triton_stub" if name.startswith("triton_python") else name  # comm: 15 characters
            snap[key] = snap.get(key, 0.0) + sum(threads.values())
    return snap


def cpu_probe(url: str, pid: int, rate: float, duration_s: float, out: Path) -> dict[str, object]:
    """Server CPU per answered request at a fixed open-loop rate (Poisson, one sentence per request)."""
    before = cpu_snapshot(pid)
    subprocess.run([*rsb.HEADROOM, "bench", "run", url, "--model", "minilm", "--protocol", "v2-http",
                    "--workload", "sentences", "--rate", str(rate), "--duration", str(duration_s), "--seed", "11",
                    "--metrics-url", "none", "--warmup", "0", "--quiet", "--json", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    after = cpu_snapshot(pid)
    res = json.loads(out.read_text())
    # every answer costs CPU, refusals (503) too: per answered request, whatever its status (the statuses are
    # recorded; a probe with refusals overloaded the server and its figure is not comparable)
    answered = sum(int(n) for n in res["counts"]["by_status"].values())
    per = {k: round((after[k] - before.get(k, 0.0)) / max(1, answered) * 1e3, 3) for k in after}
    total = round(sum(per.values()), 3)
    outside = per.get("loop", per.get("tritonserver"))
    return {"rate_per_s": rate, "answered": answered, "statuses": res["counts"]["by_status"],
            "cpu_ms_per_request": total, "cpu_ms_by_part": per,
            "outside_model_ms": outside,
            "outside_model_share": round(outside / total, 3) if outside and total else None,
            "p99_ms": res["latency_ms"]["p99_ms"], "client_mean_lag_ms": res["generator"]["mean_send_lag_ms"]}


def model_rate(batch_size: int, seconds: float, pythonpath: str) -> dict[str, object]:
    cmd = [rsb.PY, str(ROOT / "benchmarks" / "serving" / "model_alone.py"), "--batch-size", str(batch_size),
           "--seconds", str(seconds)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": pythonpath})
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def headroom_cmd(repo: Path, port: int) -> list[str]:
    return [*rsb.HEADROOM, "serve", "--model-repository", str(repo), "--http-port", str(port), "--grpc-port", "-1"]


def triton_cmd(script: Path, venv: Path, port: int) -> list[str]:
    cfg = yaml.safe_load((ROOT / "models" / "minilm" / "config.yaml").read_text())
    weights = resolve_artifact(str(cfg["parameters"]["weights"]), ROOT / "models" / "minilm" / "1", "minilm")
    return ["bash", str(script), str(ROOT / "models" / "minilm" / "1" / "model.onnx"),
            str(weights / "tokenizer.json"), str(port), str(venv)]


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--probe-s", type=float, default=8.0, help="seconds per sweep probe and per CPU probe")
    parser.add_argument("--cpu-rate", type=float, default=150.0, help="open-loop rate of the CPU probe (req/s)")
    parser.add_argument("--slo-p99-ms", type=float, default=100.0)
    parser.add_argument("--max-probes", type=int, default=4)
    parser.add_argument("--high-rate", type=float, default=300.0, help="round 1's first sweep probe (req/s)")
    parser.add_argument("--base-ref", default="", help="also run headroom at this git commit (before/after)")
    parser.add_argument("--triton-script", type=Path, default=ROOT.parent / "shared" / "peers" / "triton_serve.sh")
    parser.add_argument("--triton-venv", type=Path, default=Path(tempfile.gettempdir()) / "triton-venv")
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--tag", default="")
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. 'shared machine: indicative')")
    args = parser.parse_args()
    if not args.no_triton and not args.triton_script.is_file():
        raise SystemExit(f"{args.triton_script} not found: pass --triton-script (or --no-triton)")
    tmp = Path(tempfile.mkdtemp(prefix="headroom-lean-"))
    repo = rsb.minilm_repo(tmp, rsb.shipped_max_batch_size())
    here = str(ROOT)
    targets: dict[str, tuple[list[str], str, str]] = {}  # name -> (command, url, PYTHONPATH)
    port = rsb.free_port()
    targets["headroom"] = (headroom_cmd(repo, port), f"http://127.0.0.1:{port}", here)
    if args.base_ref:
        base = tmp / "base"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base_ref, "headroom"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        port = rsb.free_port()
        targets["headroom_base"] = (headroom_cmd(repo, port), f"http://127.0.0.1:{port}", str(base))
    if not args.no_triton:
        port = rsb.free_port()
        targets["triton"] = (triton_cmd(args.triton_script, args.triton_venv, port), f"http://127.0.0.1:{port}", here)
    start_machine = rsb.machine()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    cpu: dict[str, list[dict[str, object]]] = {k: [] for k in targets}
    valid: dict[str, list[float]] = {k: [] for k in targets}
    alone: list[dict[str, object]] = []
    try:
        for name, (cmd, url, pythonpath) in targets.items():
            log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115  (closed with the process)
            procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                           env={**os.environ, "PYTHONPATH": pythonpath})
            rsb.wait_ready(url + "/v2/health/ready", procs[name], timeout_s=900)
        for round_no in range(args.rounds):
            alone.append(model_rate(8, args.probe_s, here))
            print(f"round {round_no + 1}: model alone {alone[-1]['sentences_per_s']} sentences/s", flush=True)
            for name, (_, url, _) in targets.items():
                cpu[name].append(cpu_probe(url, procs[name].pid, args.cpu_rate, args.probe_s,
                                           tmp / f"cpu_{name}_{round_no}.json"))
                known = median(valid[name]) or 0.0
                start, low = (1.15 * known, 0.7 * known) if known > 0 else (args.high_rate, 0.0)
                res = rsb.sweep(url, "v2-http", "minilm", args.slo_p99_ms, args.probe_s, start,
                                tmp / f"sweep_{name}_{round_no}.json", ["--workload", "sentences"],
                                args.max_probes, low_rate=low)
                valid[name].append(rsb.peak_rate(res))
                print(f"round {round_no + 1}: {name} cpu {cpu[name][-1]['cpu_ms_per_request']} ms/request "
                      f"(outside the model {cpu[name][-1]['outside_model_ms']}), valid {valid[name][-1]:.1f} req/s",
                      flush=True)
    finally:
        for proc in procs.values():  # each server leads its own session: stop its children (Triton's stubs) too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        rsb.stopped(list(procs.values()))
    summary = {name: {
        "valid_qps": median(valid[name]),
        "cpu_ms_per_request": median([float(r["cpu_ms_per_request"]) for r in cpu[name]]),  # type: ignore[arg-type]
        "outside_model_ms": median([float(r["outside_model_ms"]) for r in cpu[name] if r["outside_model_ms"]]),  # type: ignore[arg-type]
    } for name in targets}
    model_sps = median([float(r["sentences_per_s"]) for r in alone])  # type: ignore[arg-type]
    h = summary["headroom"]
    ratios: dict[str, float | None] = {
        "headroom_over_model_batch8": h["valid_qps"] / model_sps if h["valid_qps"] and model_sps else None}
    if "triton" in summary and summary["triton"]["valid_qps"]:
        ratios["headroom_over_triton"] = (h["valid_qps"] or 0.0) / summary["triton"]["valid_qps"]
    if "headroom_base" in summary and summary["headroom_base"]["outside_model_ms"]:
        ratios["outside_model_cpu_after_over_before"] = (h["outside_model_ms"] or 0.0) / summary["headroom_base"][
            "outside_model_ms"]
    doc = {
        "benchmark": "lean_path_minilm_v2_http", "command": " ".join([Path(rsb.PY).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {**start_machine, "load_average_end": os.getloadavg(),
                    "note": "servers and load generator share the machine's cores; rounds interleave targets"},
        "note": args.note or None,
        "slo_p99_ms": args.slo_p99_ms, "probe_s": args.probe_s, "cpu_rate_per_s": args.cpu_rate, "rounds": args.rounds,
        "base_ref": args.base_ref or None, "summary": summary, "model_alone_batch8_sentences_per_s": model_sps,
        "ratios": ratios, "valid_qps_runs": valid, "cpu_runs": cpu, "model_alone_runs": alone,
        "split": "headroom: event-loop thread = outside the model, other threads = the model; triton: "
                 "tritonserver process = outside the model, python backend stub = the model (and its IPC)",
    }
    stamp = time.strftime("%Y-%m-%d")
    out = ROOT / "benchmarks" / "results" / f"lean_path_{stamp}{'_' + args.tag if args.tag else ''}.json"
    out.write_text(json.dumps(doc, indent=2, default=str))
    print(json.dumps({"summary": summary, "model_alone_batch8": model_sps, "ratios": ratios}, indent=2))
    print(f"wrote {out}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
