"""A small model repository of Python-backend models for end-to-end server tests, and a running server."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import TRUST_PYTHON, RunningServer, run_server

ECHO = """
import numpy as np

class Echo:
    def predict(self, inputs):
        x = inputs["x"]
        return {"y": x * 2, "batch": np.full((x.shape[0], 1), x.shape[0], dtype=np.int32)}
"""

SLOW = """
import time
import numpy as np

class Slow:
    def load(self, context):
        self.seen = context.version_dir / "seen.txt"

    def predict(self, inputs):
        tags = inputs["tag"].reshape(-1).tolist()
        with open(self.seen, "a") as f:
            f.write("".join(f"{int(t)}\\n" for t in tags))
        time.sleep(float(inputs["delay_ms"].max()) / 1000.0)
        return {"tag_out": inputs["tag"]}
"""

TEXT = """
import numpy as np

class Upper:
    def predict(self, inputs):
        flat = [bytes(b).upper() for b in inputs["text"].reshape(-1)]
        return {"upper": np.array(flat, dtype=object).reshape(inputs["text"].shape)}
"""


def _model(root: Path, name: str, config: str, code: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.yaml").write_text(textwrap.dedent(config))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(code))


def build_test_repository(root: Path) -> Path:
    _model(root, "echo", """
        backend: python
        max_batch_size: 16
        inputs: [{name: x, datatype: FP32, shape: [2]}]
        outputs: [{name: y, datatype: FP32, shape: [2]}, {name: batch, datatype: INT32, shape: [1]}]
        dynamic_batching: {max_queue_delay_ms: 50, max_queue_size: 64}
        warmup: {batch_sizes: [1, 4]}
    """, ECHO)
    _model(root, "slow", """
        backend: python
        max_batch_size: 1
        inputs: [{name: delay_ms, datatype: FP32, shape: [1]}, {name: tag, datatype: INT64, shape: [1]}]
        outputs: [{name: tag_out, datatype: INT64, shape: [1]}]
        dynamic_batching: {max_queue_delay_ms: 0, max_queue_size: 3, default_timeout_ms: 20000}
        warmup: {batch_sizes: []}
    """, SLOW)
    _model(root, "text", """
        backend: python
        max_batch_size: 8
        inputs: [{name: text, datatype: BYTES, shape: [1]}]
        outputs: [{name: upper, datatype: BYTES, shape: [1]}]
        dynamic_batching: {max_queue_delay_ms: 1}
    """, TEXT)
    _model(root, "cams", """
        backend: python
        max_batch_size: 8
        inputs: [{name: x, datatype: FP32, shape: [2]}]
        outputs: [{name: y, datatype: FP32, shape: [2]}, {name: batch, datatype: INT32, shape: [1]}]
        dynamic_batching: {mode: multistream, sync_deadline_ms: 300, expected_streams: [front, left, right]}
    """, ECHO)
    return root


@pytest.fixture(scope="package")
def test_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="package")
def server(test_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(test_repo, tmp_path_factory.mktemp("logs"), TRUST_PYTHON) as running:
        yield running


def seen_tags(repo: Path) -> list[int]:
    path = repo / "slow" / "1" / "seen.txt"
    return [int(line) for line in path.read_text().split()] if path.exists() else []
