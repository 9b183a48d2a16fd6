"""Why a batch runs slower in the loaded server than in the profile: minilm batch-1 predict on CPU 1 with one
onnxruntime thread, under conditions on the neighbour vCPU (CPU 0) and with gaps between calls.

    .venv/bin/python benchmarks/sim_validation/interference.py [ROUNDS] [CALLS]

Prints wall and thread-CPU time per predict (time.thread_time: exact, unlike /proc/thread-self/schedstat,
which is only updated at ticks and context switches) per condition, median over rounds. Conditions run
interleaved round-robin. Needs 2 CPUs and the minilm model (`headroom build-models`). See docs/sim.md,
"In-service slowdown".
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from headroom.loadgen.workloads import make_workload
from headroom.models.repository import ModelRepository
from headroom.sim.validate_profile import pinned_repository, wire_inputs, workload_for

NEIGHBOURS = {  # code run in a subprocess on CPU 0 (or 1 for "host1") while the model predicts
    "idle": None,
    "busy0": "while True: pass",
    "duty0": "import time,random\nr=random.Random(1)\nwhile True:\n t=time.perf_counter()+0.001\n"
             " while time.perf_counter()<t: pass\n time.sleep(r.expovariate(1/0.003))",
    "host1": "import time,random,json\nr=random.Random(2)\nwhile True:\n time.sleep(r.expovariate(40))\n"
             " t=time.perf_counter()+0.0015\n while time.perf_counter()<t: json.dumps({'a':list(range(100))})",
}
NEIGHBOUR_CPU = {"busy0": 0, "duty0": 0, "host1": 1}
GAPS_S = (0.0, 0.005, 0.025)  # mean of exponential sleeps between predicts (0 = back to back)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 80
    os.sched_setaffinity(0, {1})
    work = Path(tempfile.mkdtemp())
    source = Path("models")
    config = ModelRepository(source).scan(["minilm"]).models[0].config
    repo = ModelRepository(pinned_repository(source, "minilm", 1, work))
    entry = repo.scan(["minilm"]).models[0]
    model = repo.load_version(entry, entry.versions[-1]).model
    samples = make_workload(workload_for("minilm", config, work, 0), np.random.default_rng(1))
    batches = [model.collate([model.preprocess(wire_inputs(s, entry.config), {})]) for s in samples]
    for b in batches[:20]:
        model.predict(b)
    results: dict[str, list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for name, code in NEIGHBOURS.items():
            for gap_s in GAPS_S:
                proc = None
                if code:
                    proc = subprocess.Popen(["taskset", "-c", str(NEIGHBOUR_CPU[name]), sys.executable, "-c", code])
                    time.sleep(0.3)
                rng = random.Random(5)
                walls, cpus = [], []
                try:
                    for k in range(calls):
                        if gap_s:
                            time.sleep(rng.expovariate(1 / gap_s))
                        c0, t0 = time.thread_time(), time.perf_counter()
                        model.predict(batches[k % len(batches)])
                        walls.append(time.perf_counter() - t0)
                        cpus.append(time.thread_time() - c0)
                finally:
                    if proc:
                        proc.terminate()
                        proc.wait()
                results.setdefault(f"{name} gap {gap_s * 1e3:.0f} ms", []).append(
                    (float(np.mean(walls)) * 1e3, float(np.mean(cpus)) * 1e3))
    print(f"{'condition':22s} {'wall ms':>8s} {'CPU ms':>8s}  (mean per predict, median over {rounds} rounds)")
    for key, values in results.items():
        arr = np.array(values)
        print(f"{key:22s} {np.median(arr[:, 0]):8.2f} {np.median(arr[:, 1]):8.2f}")


if __name__ == "__main__":
    main()
