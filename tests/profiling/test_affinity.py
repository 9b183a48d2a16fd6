"""`--cpus` parsing and pinning: the pure parser, a pinned subprocess, and `headroom serve --cpus`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headroom.cli.main import app
from headroom.profiling.affinity import parse_cpus

PROJECT = Path(__file__).resolve().parents[2]


def cpus_allowed_list(pid: int | str) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list"))


def test_parse_cpus_reads_taskset_lists() -> None:
    assert parse_cpus("0") == {0}
    assert parse_cpus("0-1") == {0, 1}
    assert parse_cpus(" 0, 2-3 ,5") == {0, 2, 3, 5}
    for bad, message in (("a", "write CPU ids"), ("1-0", "ascending range"), ("-1", "write CPU ids"),
                         (",", "at least one CPU")):
        with pytest.raises(ValueError, match=message):
            parse_cpus(bad)


def test_pin_process_applies_the_affinity_in_a_child() -> None:
    code = ("from headroom.profiling.affinity import pin_process; pin_process('0'); "
            "print(open('/proc/self/status').read())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    line = next(x for x in done.stdout.splitlines() if x.startswith("Cpus_allowed_list"))
    assert line.split(":")[1].strip() == "0"


def test_pin_process_refuses_cpus_it_may_not_use() -> None:
    code = "from headroom.profiling.affinity import pin_process; pin_process('0,4096')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "CPUs [4096] are not available to this process" in done.stderr


def test_serve_rejects_a_bad_cpus_list_before_starting() -> None:
    result = CliRunner().invoke(app, ["serve", "--cpus", "zero"])
    assert result.exit_code == 2 and "write CPU ids like 0, 0-1 or 0,2-3" in result.output


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or 0 not in os.sched_getaffinity(0),
                    reason="needs CPU 0 and at least one other CPU to tell pinning from the default")
def test_serve_pins_the_server_process(tmp_path: Path) -> None:
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "headroom"), "serve", "--cpus", "0", "--model-repository",
         str(PROJECT / "benchmarks" / "models"), "--model", "noop", "--http-port", "0", "--grpc-port", "-1"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        seen = ""
        while time.monotonic() < deadline and proc.poll() is None:
            seen = cpus_allowed_list(proc.pid)
            if seen == "0":
                break
            time.sleep(0.05)
        assert seen == "0", (tmp_path / "serve.log").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
