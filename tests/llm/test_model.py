"""Fused projections (q/k/v and gate/up, done by the runner at load) compute the same function."""

from __future__ import annotations

import torch

from headroom.llm.model import build_model
from headroom.llm.runner import BatchItem, ModelBatch, TorchRunner
from tests.llm.conftest import TINY, TINY_ENGINE


def test_fused_projections_match_unfused(tiny_state: dict[str, torch.Tensor]) -> None:
    plain = build_model(TINY, tiny_state, torch.device("cpu"), torch.float32)
    runner = TorchRunner(build_model(TINY, tiny_state, torch.device("cpu"), torch.float32), TINY_ENGINE)
    keys = set(runner.model.state_dict())
    assert any("qkv_proj" in k for k in keys) and any("gate_up_proj" in k for k in keys)
    assert not any(".q_proj." in k or ".up_proj." in k for k in keys)
    batch = ModelBatch((BatchItem("a", tuple(range(1, 20)), 0, (0, 1), True),), 16)
    fused = runner.execute(batch)
    runner.model = plain  # same cache layout, unfused layers
    unfused = runner.execute(batch)
    torch.testing.assert_close(torch.from_numpy(fused), torch.from_numpy(unfused), rtol=1e-4, atol=1e-4)
