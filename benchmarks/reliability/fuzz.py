"""Fuzz every HTTP route in /openapi.json (schemathesis strategies: valid and invalid inputs, the OpenAI
routes included) and gRPC ModelInfer (hypothesis-built requests plus raw garbage bytes). Counts answers
>= 500 (gRPC: INTERNAL / UNKNOWN / DATA_LOSS) and the server's RSS growth."""

from __future__ import annotations

import contextlib
import json
import struct
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from schemathesis.core.result import Err

from benchmarks.reliability.common import headroom, rss_mb
from headroom.protocol.generated import headroom_inference_pb2 as pb

MODELS = ("noop", "digits", "minilm", "smollm2", "nope", "")
DATATYPES = ("FP32", "FP16", "INT64", "INT32", "INT8", "UINT8", "BOOL", "BYTES", "BF16", "FP64", "x")
NAMES = ("input", "input_ids", "text", "x", "")
SERVER_ERRORS = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS})
SETTINGS = dict(deadline=None, database=None, phases=[Phase.generate],
                suppress_health_check=list(HealthCheck))


class _OutOfTime(BaseException):
    """The scenario's time budget is spent: raised through hypothesis (which only catches Exception) to stop."""


def _check_budget(deadline_s: float) -> None:
    if time.monotonic() > deadline_s:
        raise _OutOfTime


def fuzz_http(url: str, cases: int, deadline_s: float, max_rounds: int = 8) -> dict[str, Any]:
    """About `cases` requests spread over every operation; rounds with new seeds until the count is reached
    (an operation with few distinct inputs runs out of new examples early) or time.monotonic() passes
    `deadline_s` (then fewer cases, reported as such)."""
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    operations = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise RuntimeError(f"/openapi.json has an operation schemathesis cannot use: {result.err()}")
        operations.append(result.ok())
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    with httpx.Client(base_url=url, timeout=60.0) as client:
        def probe_case(case: Any) -> None:
            _check_budget(deadline_s)
            kwargs = case.as_transport_kwargs(base_url=url)
            try:
                r = client.request(kwargs["method"], kwargs["url"], headers=kwargs.get("headers"),
                                   params=kwargs.get("params"), content=_content(kwargs))
            except httpx.HTTPError as exc:
                statuses[0] += 1
                failures.append(f"{case.operation.label}: {type(exc).__name__}")
                return
            statuses[r.status_code] += 1
            if r.status_code >= 500 and len(failures) < 20:
                failures.append(f"{case.operation.label}: {r.status_code} {r.text[:200]}")

        with contextlib.suppress(_OutOfTime):
            for round_no in range(max_rounds):
                left = cases - sum(statuses.values())
                if left <= 0:
                    break
                for op in operations:
                    @seed(round_no)
                    @given(case=op.as_strategy())
                    @settings(max_examples=max(1, left // len(operations)), **SETTINGS)  # type: ignore[arg-type]
                    def probe(case: Any) -> None:
                        probe_case(case)

                    probe()
    return {"operations": len(operations), "cases": sum(statuses.values()),
            "out_of_time": time.monotonic() > deadline_s,
            "responses_5xx": sum(n for s, n in statuses.items() if s >= 500), "connection_errors": statuses[0],
            "by_status": {str(k): v for k, v in sorted(statuses.items())}, "examples": failures}


def _content(kwargs: dict[str, Any]) -> bytes | None:
    if "content" in kwargs:
        return bytes(kwargs["content"]) if kwargs["content"] is not None else None
    if "json" in kwargs:  # the stdlib encoder: integers beyond 64 bits are part of the fuzz
        return json.dumps(kwargs["json"]).encode()
    data = kwargs.get("data")
    return data.encode() if isinstance(data, str) else data


_dims = st.one_of(st.integers(-2, 8), st.sampled_from([0, 2**31, 2**62, 2**63 - 1, 50_000_000]))
_tensor = st.fixed_dictionaries({
    "name": st.sampled_from(NAMES), "datatype": st.sampled_from(DATATYPES), "shape": st.lists(_dims, max_size=4),
    "fp32": st.lists(st.floats(allow_nan=True, width=32), max_size=16),
    "int64": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=16),
    "bytes": st.lists(st.binary(max_size=32), max_size=4),
})
_request = st.fixed_dictionaries({
    "model": st.sampled_from(MODELS), "version": st.sampled_from(("", "1", "2", "x")),
    "inputs": st.lists(_tensor, max_size=3), "raw": st.lists(st.binary(max_size=64), max_size=3),
    "outputs": st.lists(st.sampled_from(NAMES), max_size=2), "timeout": st.sampled_from((None, -1, 0, 10**12)),
})


# requests a served model accepts (digits: FP32 [B, 1, 8, 8]; minilm: BYTES [B, 1]), with fuzzed values
# (NaN, inf, huge, empty or invalid UTF-8 text), typed or raw contents: these reach preprocessing and the model
_batch = st.integers(1, 4)
# mostly values the model accepts (so that most cases run a batch), some NaN / inf and invalid UTF-8 (the 400s)
_pixels = (st.floats(0.0, 16.0, width=32), st.floats(width=32, allow_nan=False, allow_infinity=False),
           st.floats(width=32))
_texts = st.one_of(st.text(max_size=120).map(lambda t: t.encode("utf-8")), st.binary(max_size=300))
_digits = _batch.flatmap(lambda b: st.fixed_dictionaries({
    "model": st.just("digits"), "name": st.just("input"), "shape": st.just([b, 1, 8, 8]), "raw": st.booleans(),
    "fp32": st.one_of(*(st.lists(floats, min_size=64 * b, max_size=64 * b) for floats in _pixels))}))
_minilm = _batch.flatmap(lambda b: st.fixed_dictionaries({
    "model": st.just("minilm"), "name": st.just("text"), "shape": st.just([b, 1]), "raw": st.booleans(),
    "bytes": st.lists(_texts, min_size=b, max_size=b)}))


def _served_message(d: dict[str, Any]) -> bytes:
    req = pb.ModelInferRequest(model_name=d["model"], id="fuzz")
    dtype = "FP32" if "fp32" in d else "BYTES"
    i = req.inputs.add(name=d["name"], datatype=dtype, shape=d["shape"])
    if dtype == "FP32" and d["raw"]:
        req.raw_input_contents.append(struct.pack(f"<{len(d['fp32'])}f", *d["fp32"]))
    elif dtype == "FP32":
        i.contents.fp32_contents.extend(d["fp32"])
    elif d["raw"]:  # Triton's BYTES wire form: 4-byte little-endian length, then the bytes
        req.raw_input_contents.append(b"".join(struct.pack("<I", len(x)) + x for x in d["bytes"]))
    else:
        i.contents.bytes_contents.extend(d["bytes"])
    return bytes(req.SerializeToString())


def _message(d: dict[str, Any]) -> bytes:
    req = pb.ModelInferRequest(model_name=d["model"], model_version=d["version"], id="fuzz")
    for t in d["inputs"]:
        i = req.inputs.add(name=t["name"], datatype=t["datatype"], shape=[s % 2**63 for s in t["shape"]])
        i.contents.fp32_contents.extend(t["fp32"])
        i.contents.int64_contents.extend(t["int64"])
        i.contents.bytes_contents.extend(t["bytes"])
    req.raw_input_contents.extend(d["raw"])
    for name in d["outputs"]:
        req.outputs.add(name=name)
    if d["timeout"] is not None:
        req.parameters["timeout"].int64_param = d["timeout"]
    return bytes(req.SerializeToString())


def fuzz_grpc(target: str, cases: int, deadline_s: float) -> dict[str, Any]:
    """Half of `cases` structured ModelInferRequests (mostly invalid), a quarter well-formed for a served model
    (fuzzed values: they reach the model), a quarter raw bytes that are mostly not a valid protobuf (fewer if
    time.monotonic() passes `deadline_s`)."""
    codes: dict[str, Counter[str]] = {"structured": Counter(), "served": Counter(), "garbage": Counter()}
    examples: list[str] = []
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

        def send(kind: str, raw: bytes) -> None:
            _check_budget(deadline_s)
            try:
                call(raw, timeout=60.0)
                codes[kind]["OK"] += 1
            except grpc.RpcError as err:
                code = err.code()
                codes[kind][code.name] += 1
                if code in SERVER_ERRORS and len(examples) < 20:
                    examples.append(f"{kind} {code.name}: {err.details()}")

        @seed(0)
        @given(d=_request)
        @settings(max_examples=cases // 2, **SETTINGS)  # type: ignore[arg-type]
        def structured(d: dict[str, Any]) -> None:
            send("structured", _message(d))

        @seed(0)
        @given(d=st.one_of(_digits, _minilm))
        @settings(max_examples=max(1, cases // 4), **SETTINGS)  # type: ignore[arg-type]
        def served(d: dict[str, Any]) -> None:
            send("served", _served_message(d))

        @seed(0)
        @given(raw=st.binary(max_size=256))
        @settings(max_examples=max(1, cases // 4), **SETTINGS)  # type: ignore[arg-type]
        def garbage(raw: bytes) -> None:
            send("garbage", raw)

        with contextlib.suppress(_OutOfTime):
            structured()
            served()
            garbage()
    errors = {k: sum(c[s.name] for s in SERVER_ERRORS) for k, c in codes.items()}
    return {"cases": sum(sum(c.values()) for c in codes.values()), "server_errors": sum(errors.values()),
            "server_errors_structured": errors["structured"], "server_errors_served": errors["served"],
            "server_errors_garbage": errors["garbage"],
            "by_code": {k: dict(c) for k, c in codes.items()}, "examples": examples,
            "out_of_time": time.monotonic() > deadline_s}


def run(log_dir: Path, http_cases: int, grpc_cases: int, budget_s: float) -> dict[str, Any]:
    """The HTTP fuzz gets up to 2/3 of `budget_s`, gRPC the rest (each stops early when its cases are done)."""
    # explicit model control: load / unload answer for real (with `none` every call is refused with a 503, as
    # Triton does), and the fuzz reaches their code; random names never match a served model
    args = ["--model-repository", "models", "--no-access-log", "--log-level", "warning", "--model-control-mode",
            "explicit"]
    with headroom("serve", args, log_dir, grpc=True) as srv:
        rss_before = rss_mb(srv.process.pid)
        t0 = time.monotonic()
        http = fuzz_http(srv.url, http_cases, t0 + budget_s * 2 / 3)
        rpc = fuzz_grpc(srv.grpc_target, grpc_cases, t0 + budget_s)
        alive = srv.process.poll() is None
        rss_after = rss_mb(srv.process.pid) if alive else None
    return {"http": http, "grpc": rpc, "seconds": time.monotonic() - t0, "server_alive": alive,
            "rss_before_mb": rss_before, "rss_after_mb": rss_after,
            "rss_growth_mb": None if rss_after is None else rss_after - rss_before}
