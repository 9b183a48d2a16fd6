"""The native serving path never imports torch: an engine built and run through the offline API in a fresh
interpreter (greedy, seeded sampling with penalties and logprobs, a JSON-schema grammar, n-gram speculation)
leaves `torch` out of `sys.modules`. The fp32 reference mode is the one that loads it, so the check can fail."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
from headroom.llm import LLM, SamplingParams
from headroom.llm.structured_output import schema_grammar

mode = sys.argv[1]
llm = LLM(weight_dtype=mode, kv_cache_memory_mb=32, speculative_ngram_tokens=2 if mode == "auto" else 0)
schema = {"type": "object", "properties": {"a": {"enum": [1, 2, 3]}}, "required": ["a"], "additionalProperties": False}
runs = [
    SamplingParams(temperature=0, max_tokens=6, logprobs=2),
    SamplingParams(temperature=0.8, top_p=0.9, top_k=40, min_p=0.01, seed=7, max_tokens=6, repetition_penalty=1.1,
                   presence_penalty=0.5, frequency_penalty=0.2, logit_bias=((28, -5.0),), logprobs=1),
    SamplingParams(temperature=0.7, seed=3, max_tokens=32, grammar=schema_grammar(schema, "s")),
    SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),  # plain greedy: n-gram drafts verified
]
texts = [llm.generate(["The capital of France is"], p)[0].outputs[0].text for p in runs]
print(json.dumps({"runner": type(llm.engine.runner).__name__, "texts": texts, "torch": "torch" in sys.modules,
                  "drafted": llm.engine.spec_draft_tokens}))
"""


def _run(mode: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_the_native_engine_serves_without_importing_torch() -> None:
    native = _run("auto")
    assert native["runner"] == "NativeRunner"
    assert native["torch"] is False
    texts = native["texts"]
    assert isinstance(texts, list) and all(isinstance(t, str) and t for t in texts)
    assert json.loads(texts[2])["a"] in (1, 2, 3)  # the grammar's masks applied without torch
    assert isinstance(native["drafted"], int) and native["drafted"] > 0  # speculative verification ran too


def test_the_fp32_reference_is_what_imports_torch() -> None:
    reference = _run("fp32")
    assert reference["runner"] == "TorchRunner" and reference["torch"] is True
