"""scripts/make_benchmarks_md.py renders result files into BENCHMARKS.md."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np

from headroom.loadgen.collector import Collector
from headroom.loadgen.records import RequestRecord, Slo
from tests.support.scripts import load_script


def _script() -> ModuleType:
    return load_script("scripts/make_benchmarks_md.py")


def _result(label: str, latency_ms: float, rate: float) -> dict[str, object]:
    col = Collector(Slo(p99_ms=100.0))
    for i in range(100):
        t = i / rate
        col.add(RequestRecord(i, t, t, t + latency_ms / 1000, True, "200", latency_ms / 1000))
    return {
        "schema": "headroom.bench/1",
        "label": label,
        "config": {"client": {"protocol": "v2-http"}, "slo": {"p99_ms": 100.0}},
        "environment": {"hostname": "box", "cpu_count": 2, "date_utc": "2026-01-01T00:00:00+00:00"},
        "load": {"label": "open-loop poisson arrivals, mean 10/s", "mode": "open"},
        "generator": {"fell_behind": False},
        "scenario": {"name": "server", "valid": True, "reasons": []},
        **col.summary(),
    }


def test_render_groups_by_directory_and_compares_with_the_first(tmp_path: Path) -> None:
    (tmp_path / "batching").mkdir()
    (tmp_path / "batching" / "0-off.json").write_text(json.dumps(_result("off", 20.0, 10.0)))
    (tmp_path / "batching" / "1-on.json").write_text(json.dumps(_result("on", 10.0, 20.0)))
    (tmp_path / "junk.json").write_text("[]")
    out = tmp_path / "BENCHMARKS.md"
    assert _script().main(["--results", str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert "## batching" in text
    rows = [line for line in text.splitlines() if line.startswith("| o")]
    assert rows[0].startswith("| off |") and rows[0].endswith("| baseline |")
    assert rows[1].startswith("| on |") and "p99 0.50x" in rows[1]
    assert "`junk.json`" in text
    assert np.isclose(float(rows[1].split("|")[7]), 10.0, rtol=0.01)


def test_the_latest_reliability_table_is_placed_after_the_summary(tmp_path: Path) -> None:
    for stamp, verdict in (("20260101T000000Z", "old"), ("20260102T000000Z", "new")):
        (tmp_path / f"reliability_{stamp}.md").write_text(f"| scenario | measured |\n| x | {verdict} |\n")
        (tmp_path / f"reliability_{stamp}.json").write_text(json.dumps(
            {"started_utc": stamp, "total_seconds": 600.0, "note": f"load {verdict}"}))
    summary = tmp_path / "summary.md"
    summary.write_text("# Summary\n")
    out = tmp_path / "BENCHMARKS.md"
    assert _script().main(["--results", str(tmp_path), "--out", str(out), "--summary", str(summary)]) == 0
    text = out.read_text()
    assert text.index("# Summary") < text.index("## Reliability") < text.index("## headroom bench runs")
    assert "| x | new |" in text and "| x | old |" not in text
    assert "reliability_20260102T000000Z.md" in text and "10.0 min" in text and "load new" in text
