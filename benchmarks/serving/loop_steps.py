"""The event loop's work per request as a count that does not depend on the machine's load: Python bytecode
instructions executed on the event-loop thread (uvloop, as `headroom serve` runs), per request, through the
gateway, the Starlette app, the data plane and the batcher, with a zero-cost model (`bench_app_cpu.py`'s).

    .venv/bin/python benchmarks/serving/loop_steps.py [--path /v2/models/fakeemb/infer] [--log] [--top 40]
    # before/after: PYTHONPATH=<a checkout of the older commit> .venv/bin/python benchmarks/serving/loop_steps.py

CPU time on a shared 2-core machine moves by ±20% with the neighbours' load; this count is exact and repeats
to the instruction. It runs N and 3N requests and reports the difference per request, so start-up and model
loading cancel out. It counts Python only (C code such as orjson, numpy, uvloop, syscalls is free here):
the interpreter is ~70% of the event loop's CPU per request (perf, 2026-12-03). `--log` turns on the JSON
access lines as `headroom serve` does by default (to /dev/null); `--top` lists the functions that execute the
most instructions (self, not inclusive).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_app_cpu  # the in-process app and its zero-cost model

from headroom.server.logging import configure_logging


class StepCounter:
    """Counts executed bytecode instructions per function on the thread that installs it."""

    def __init__(self) -> None:
        self.by_function: collections.Counter[str] = collections.Counter()

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            self.by_function[f"{code.co_filename.rsplit('site-packages/', 1)[-1]}:{code.co_name}"] += 1
        return self._local

    def run(self, requests: int, path: str) -> tuple[collections.Counter[str], int]:
        self.by_function.clear()
        sys.settrace(self._trace)
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                result = runner.run(bench_app_cpu.measure(requests, 2, path))
        finally:
            sys.settrace(None)
        if result["non_200"]:
            raise SystemExit(f"{result['non_200']} requests did not answer 200")
        return collections.Counter(self.by_function), int(result["requests"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", default="/v2/models/fakeemb/infer", choices=("/v1/embeddings",
                                                                                "/v2/models/fakeemb/infer"))
    parser.add_argument("--requests", type=int, default=200, help="N: runs N and 3N requests")
    parser.add_argument("--log", action="store_true", help="access lines on, as `headroom serve` by default")
    parser.add_argument("--top", type=int, default=0, help="list the N functions that execute the most")
    args = parser.parse_args()
    if args.log:
        configure_logging("info", True)
        devnull = open(os.devnull, "w")  # noqa: SIM115  (for the process's life)
        for handler in logging.getLogger("headroom").handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(devnull)
    else:
        logging.getLogger("headroom").setLevel(logging.WARNING)
    counter = StepCounter()
    small, n_small = counter.run(args.requests, args.path)
    large, n_large = counter.run(3 * args.requests, args.path)
    n = n_large - n_small
    per_function = {k: (large[k] - small.get(k, 0)) / n for k in large}
    print(json.dumps({"path": args.path, "access_log": args.log, "requests": n,
                      "loop_steps_per_request": round(sum(per_function.values()), 1)}))
    for name, steps in sorted(per_function.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{steps:9.1f}  {name}")


if __name__ == "__main__":
    main()
