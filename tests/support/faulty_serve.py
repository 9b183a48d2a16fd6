"""`headroom serve` with test-only fault hooks, for end-to-end tests of the fatal path (never shipped).

    python -m tests.support.faulty_serve serve ...   (the arguments of `headroom serve`)

Each fault is set off by a request that carries a marker; other requests are unaffected until it fires:
- an LLM request with `seed` == LLM_FAULT_SEED makes the engine's step raise (its step loop dies);
- a V2 request with the parameter `frame_id` == BATCHER_FAULT_GROUP makes a batcher's policy call raise
  (its loop dies).
"""

from __future__ import annotations

from headroom.batching import batcher
from headroom.batching.policy import BatchDecision, BatchPolicyConfig, QueueSnapshot, decide
from headroom.cli.main import main
from headroom.llm.engine import LLMEngine
from headroom.llm.request import SequenceOutput

LLM_FAULT_SEED = 666
BATCHER_FAULT_GROUP = "inject-fault"

_step = LLMEngine.step
_decide = decide


def _faulty_step(self: LLMEngine) -> list[SequenceOutput]:
    if any(r.params.seed == LLM_FAULT_SEED for r in self.scheduler.requests.values()):
        raise RuntimeError("injected fault in the LLM step")
    return _step(self)


def _faulty_decide(snapshot: QueueSnapshot, now_s: float, cfg: BatchPolicyConfig) -> BatchDecision:
    if any(item.group == BATCHER_FAULT_GROUP for item in snapshot.items):
        raise RuntimeError("injected fault in the batcher loop")
    return _decide(snapshot, now_s, cfg)


if __name__ == "__main__":
    LLMEngine.step = _faulty_step  # type: ignore[method-assign]
    batcher.decide = _faulty_decide  # type: ignore[attr-defined]
    main()
