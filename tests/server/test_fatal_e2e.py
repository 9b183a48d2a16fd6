"""A background loop that dies (an LLM engine's step loop, a batcher's loop) through the real server process:
its in-flight requests get an error (none hangs), liveness turns red on HTTP and gRPC, the traceback is
logged, the other models drain (their in-flight requests finish), and the process exits non-zero.
The faults come from test-only hooks (tests/support/faulty_serve.py) set off by a marked request."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import tritonclient.grpc as grpcclient

from tests.server.conftest import build_test_repository, seen_tags
from tests.support.faulty_serve import BATCHER_FAULT_GROUP, LLM_FAULT_SEED
from tests.support.server import TRUST_PYTHON, RunningServer, run_server

MODELS = Path(__file__).resolve().parents[2] / "models"
FAULTY = "tests.support.faulty_serve"


def _until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `condition` (bounded): the server reports state changes, nothing to await across processes."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)


def _slow_in_flight(srv: RunningServer, repo: Path, tag: int, delay_ms: int) -> list[httpx.Response]:
    """Start a slow tensor request in a thread and return once the model is executing it."""
    out: list[httpx.Response] = []
    body = {"inputs": [{"name": "delay_ms", "datatype": "FP32", "shape": [1, 1], "data": [delay_ms]},
                       {"name": "tag", "datatype": "INT64", "shape": [1, 1], "data": [tag]}]}
    threading.Thread(target=lambda: out.append(httpx.post(f"{srv.url}/v2/models/slow/infer", json=body,
                                                          timeout=60)), daemon=True).start()
    _until(lambda: tag in seen_tags(repo), 30, "the slow request to start executing")
    return out


def _health(srv: RunningServer) -> tuple[int, int, bool]:
    live = httpx.get(srv.url + "/v2/health/live", timeout=5).status_code
    ready = httpx.get(srv.url + "/v2/health/ready", timeout=5).status_code
    grpc_live = grpcclient.InferenceServerClient(srv.grpc_target).is_server_live()
    return live, ready, bool(grpc_live)


def test_llm_engine_death_fails_its_streams_turns_liveness_red_and_exits_non_zero(tmp_path: Path) -> None:
    repo = build_test_repository(tmp_path / "repo")
    shutil.copytree(MODELS / "smollm2", repo / "smollm2")
    args = ["--model", "slow", "--model", "smollm2", *TRUST_PYTHON]
    with run_server(repo, tmp_path, args, module=FAULTY) as srv:
        assert _health(srv) == (200, 200, True)
        chat = srv.url + "/v1/chat/completions"
        messages = [{"role": "user", "content": "Count to one hundred."}]
        events: list[str] = []
        first = threading.Event()

        def stream() -> None:
            body = {"messages": messages, "max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}
            with httpx.stream("POST", chat, json=body, timeout=60) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        events.append(line)
                        first.set()

        streamer = threading.Thread(target=stream, daemon=True)
        streamer.start()
        assert first.wait(60), "the stream produced no event"
        slow = _slow_in_flight(srv, repo, tag=41, delay_ms=2500)  # keeps the process draining a while
        fault = httpx.post(chat, json={"messages": messages, "max_tokens": 4, "seed": LLM_FAULT_SEED}, timeout=30)
        assert fault.status_code == 500 and "injected fault" in fault.json()["error"]["message"]
        streamer.join(30)
        assert not streamer.is_alive() and '"error"' in events[-2] and events[-1] == "data: [DONE]"
        live, ready, grpc_live = _health(srv)
        assert (live, ready, grpc_live) == (503, 503, False)
        again = httpx.post(chat, json={"messages": messages, "max_tokens": 4}, timeout=30)
        assert again.status_code == 503 and again.headers.get("x-headroom-draining") == "1"
        assert srv.process.wait(timeout=60) == 1
        assert slow and slow[0].status_code == 200  # the other model drained: its request finished
        log = srv.log()
        assert "Traceback" in log and "injected fault in the LLM step" in log
        assert '"stopped"' in log  # the orderly shutdown ran to its end (exit 1 is the death, not a crash)


def test_batcher_loop_death_turns_liveness_red_and_exits_non_zero(tmp_path: Path) -> None:
    repo = build_test_repository(tmp_path / "repo")
    with run_server(repo, tmp_path, ["--model", "slow", "--model", "echo", *TRUST_PYTHON], module=FAULTY) as srv:
        slow = _slow_in_flight(srv, repo, tag=42, delay_ms=2500)
        body = {"parameters": {"frame_id": BATCHER_FAULT_GROUP},
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        fault = httpx.post(f"{srv.url}/v2/models/echo/infer", json=body, timeout=30)
        assert fault.status_code == 500 and "batcher failed" in fault.json()["error"]
        assert _health(srv) == (503, 503, False)
        assert srv.process.wait(timeout=60) == 1
        assert slow and slow[0].status_code == 200
        log = srv.log()
        assert "Traceback" in log and "injected fault in the batcher loop" in log
        assert '"stopped"' in log  # the orderly shutdown ran to its end (exit 1 is the death, not a crash)
