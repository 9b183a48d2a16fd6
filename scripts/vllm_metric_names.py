"""Extract vLLM's Prometheus series from a vLLM wheel into the pinned list the conformance test reads.

    pip download vllm==0.33.0 --no-deps --only-binary :all: -d /tmp/vllm
    .venv/bin/python scripts/vllm_metric_names.py /tmp/vllm/vllm-0.33.0-*.whl > tests/server/data/vllm_metrics.json

It reads `vllm/v1/metrics/loggers.py` (`PrometheusStatLogger.__init__` and its `cache_config_info`) and
`vllm/v1/spec_decode/metrics.py` (`SpecDecodingProm`) with `ast`, never importing vLLM. For each series:
its name, type (gauge / counter / histogram), label names, and `when`: "always" for a series every vLLM
server exports, or the condition it sits under (the `if` test's source, e.g. `vllm_config.lora_config is not
None`). The wheel's version and the two files' sha256 go in the header so the pin names its source.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

LOGGERS = "vllm/v1/metrics/loggers.py"
SPEC = "vllm/v1/spec_decode/metrics.py"
KINDS = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}
BASE_LABELS = ["model_name", "engine"]


def _labels(node: ast.expr | None, local: dict[str, list[str]]) -> list[str] | None:
    """`labelnames`, `labelnames + ["reason"]`, a list of constants; None when not a literal."""
    if node is None:
        return None
    if isinstance(node, ast.Name):
        return local.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _labels(node.left, local), _labels(node.right, local)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.List) and all(isinstance(e, ast.Constant) for e in node.elts):
        return [str(e.value) for e in node.elts if isinstance(e, ast.Constant)]
    return None


def _series(func: ast.FunctionDef, source: str, when: str) -> list[dict[str, object]]:
    """Every `self._<kind>_cls(name="vllm:...", labelnames=...)` call in `func`, with the `if` it sits under."""
    local: dict[str, list[str]] = {"labelnames": list(BASE_LABELS)}
    found: list[dict[str, object]] = []

    def visit(stmts: list[ast.stmt], condition: str) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                value = _labels(stmt.value, local)
                if value is not None:
                    local[stmt.targets[0].id] = value
            if isinstance(stmt, ast.If):
                test = ast.get_source_segment(source, stmt.test) or "?"
                visit(stmt.body, test if condition == "always" else f"{condition} and {test}")
                visit(stmt.orelse, f"not ({test})")
                continue
            for node in ast.walk(stmt):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                kind = KINDS.get(node.func.attr)
                kw = {k.arg: k.value for k in node.keywords if k.arg}
                name = kw.get("name")
                if kind and isinstance(name, ast.Constant) and str(name.value).startswith("vllm:"):
                    found.append({"name": name.value, "type": kind,
                                  "labels": _labels(kw.get("labelnames"), local), "when": condition})

    visit(func.body, when)
    return found


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise SystemExit(f"{cls}.{name} not found: the vLLM source layout changed; update this script")


def extract(wheel: Path) -> dict[str, object]:
    with zipfile.ZipFile(wheel) as zf:
        loggers, spec = zf.read(LOGGERS).decode(), zf.read(SPEC).decode()
    version = re.search(r"vllm-([^-]+)-", wheel.name)
    series = _series(_method(ast.parse(loggers), "PrometheusStatLogger", "__init__"), loggers, "always")
    for item in _series(_method(ast.parse(spec), "SpecDecodingProm", "__init__"), spec,
                        "speculative_config is not None"):
        if str(item["name"]).startswith("vllm:spec_decode"):
            item["labels"] = item["labels"] or list(BASE_LABELS)
            series.append(item)
    for name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens"):  # built from a (name, doc) list, not a name= call
        if name in spec and all(s["name"] != name for s in series):
            series.append({"name": name, "type": "counter", "labels": list(BASE_LABELS),
                           "when": "speculative_config is not None"})
    if '"vllm:cache_config_info"' in loggers:  # an info gauge whose labels are CacheConfig.metrics_info()
        series.append({"name": "vllm:cache_config_info", "type": "gauge", "labels": ["engine"],
                       "labels_also": "every field of CacheConfig.metrics_info()", "when": "always"})
    return {
        "vllm_version": version.group(1) if version else wheel.name,
        "source": {LOGGERS: hashlib.sha256(loggers.encode()).hexdigest(),
                   SPEC: hashlib.sha256(spec.encode()).hexdigest()},
        "series": sorted(series, key=lambda s: str(s["name"])),
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: vllm_metric_names.py VLLM_WHEEL  (pip download vllm==X --no-deps -d DIR)")
    print(json.dumps(extract(Path(sys.argv[1])), indent=1))
