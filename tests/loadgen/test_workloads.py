from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from headroom.loadgen.workloads import WorkloadSpec, from_jsonl, make_workload


def test_synthetic_workloads_reproduce_with_a_seed() -> None:
    for kind in ("sentences", "chat", "shared-prefix"):
        spec = WorkloadSpec(kind=kind, num_samples=20, prefix_words=50)
        a = make_workload(spec, np.random.default_rng(3))
        b = make_workload(spec, np.random.default_rng(3))
        c = make_workload(spec, np.random.default_rng(4))
        assert [s.text for s in a] == [s.text for s in b] != [s.text for s in c]


def test_digits_are_8x8_fp32_tensors_and_matching_pngs() -> None:
    samples = make_workload(WorkloadSpec(kind="digits", num_samples=5), np.random.default_rng(0))
    for s in samples:
        assert s.pixels is not None and s.pixels.shape == (1, 1, 8, 8) and s.pixels.dtype == np.float32
        assert s.pixels.min() >= 0.0 and s.pixels.max() <= 16.0
        img = np.asarray(Image.open(io.BytesIO(s.png)))
        assert img.shape == (8, 8)
        assert np.allclose(img / 255.0 * 16.0, s.pixels[0, 0], atol=0.05)


def test_chat_lengths_follow_the_distribution_and_prefixes_are_shared() -> None:
    spec = WorkloadSpec(
        kind="chat", num_samples=2000, input_len_mean=40, input_len_std=10, output_len_mean=32, output_len_std=8
    )
    chat = make_workload(spec, np.random.default_rng(1))
    words = np.array([len(s.text.split()) for s in chat])
    outs = np.array([s.max_output_tokens for s in chat])
    assert words.mean() == pytest.approx(40, rel=0.03) and words.std() == pytest.approx(10, rel=0.1)
    assert outs.mean() == pytest.approx(32, rel=0.03) and outs.min() >= 1
    shared = make_workload(
        WorkloadSpec(kind="shared-prefix", num_samples=10, prefix_words=100), np.random.default_rng(1)
    )
    prefix = shared[0].text.split("\n\n")[0]
    assert len(prefix.split()) >= 100
    assert all(s.text.startswith(prefix) for s in shared) and len({s.text for s in shared}) == 10


def test_jsonl_samples_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    lines = [{"text": "hello there"}, {"prompt": "p", "max_tokens": 7}, {"body": {"inputs": []}}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    samples = from_jsonl(path)
    assert samples[0].text == "hello there" and samples[1].max_output_tokens == 7
    assert samples[2].body == {"inputs": []}
    path.write_text('{"text": "ok"}\n{"nope": 1}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl:2"):
        from_jsonl(path)
    for bad, says in [("[1]", "must be a JSON object"), ("{x", "not valid JSON"),
                      ('{"text": "t", "max_tokens": "7"}', "max_tokens must be an integer"),
                      ('{"text": "t", "max_tokens": -1}', "max_tokens must be an integer"),
                      ('{"text": "t", "max_tokens": true}', "max_tokens must be an integer")]:
        path.write_text('{"text": "ok"}\n' + bad + "\n")
        with pytest.raises(ValueError, match=rf"d\.jsonl:2 .*{says}|d\.jsonl:2: {says}"):
            from_jsonl(path)
    with pytest.raises(ValueError, match="--dataset-path"):
        WorkloadSpec(kind="jsonl")
