"""The runner: attention groups (decodes apart from longer chunks) in a mixed step."""

from __future__ import annotations

import torch

from headroom.llm.model import build_model
from headroom.llm.runner import BatchItem, ModelBatch, TorchRunner, build_metadata, zeroed_tensors
from tests.llm.conftest import TINY, TINY_ENGINE


def test_mixed_step_attends_decodes_and_chunks_in_separate_groups_with_the_same_logits(
    tiny_state: dict[str, torch.Tensor],
) -> None:
    runner = TorchRunner(build_model(TINY, tiny_state, torch.device("cpu"), torch.float32), TINY_ENGINE)
    g = torch.Generator().manual_seed(4)
    seqs = [[int(t) for t in torch.randint(1, TINY.vocab_size, (n,), generator=g)] for n in (20, 9, 33)]
    tables = [(0, 1), (2,), (3, 4, 5)]
    # prefill: a and c up to their last token, b up to 4 tokens (its next chunk is 5 tokens long)
    done = [19, 4, 32]
    for i, s in enumerate(seqs):
        runner.execute(ModelBatch((BatchItem(f"p{i}", tuple(s[: done[i]]), 0, tables[i], False),), 16))
    items = (
        BatchItem("a", (seqs[0][19],), 19, tables[0], True),  # a decode
        BatchItem("b", tuple(seqs[1][4:9]), 4, tables[1], True, num_logits=5),  # a 5-token chunk
        BatchItem("c", (seqs[2][32],), 32, tables[2], True),  # a decode
    )
    batch = ModelBatch(items, 16)
    _, _, meta, _ = build_metadata(batch, torch.device("cpu"))
    decodes, chunks = meta.groups
    assert decodes.query_index.shape == (2, 1) and decodes.query_slice is None  # a and c are not adjacent
    assert chunks.query_index.shape == (1, 5) and chunks.query_slice == (1, 6)
    assert decodes.mask_bias.shape[-1] == 48 and chunks.mask_bias.shape[-1] == 16  # each group its own keys
    assert not meta.padded_is_flat
    mixed = torch.from_numpy(runner.execute(batch))
    alone = torch.cat([torch.from_numpy(runner.execute(ModelBatch((it,), 16))) for it in items])
    torch.testing.assert_close(mixed, alone, rtol=1e-5, atol=1e-5)
    decode_only = ModelBatch((items[0], items[2]), 16)
    _, _, meta, _ = build_metadata(decode_only, torch.device("cpu"))
    assert len(meta.groups) == 1 and meta.groups[0].query_slice == (0, 2) and meta.padded_is_flat
    torch.testing.assert_close(torch.from_numpy(runner.execute(decode_only)), alone[[0, 6]], rtol=1e-5, atol=1e-5)


def test_kv_pool_on_cpu_is_zeroed_views_of_one_mapping_that_do_not_alias() -> None:
    pool = zeroed_tensors((2, 48, 8), 4, torch.float32, torch.device("cpu"))
    assert len(pool) == 4 and all(t.shape == (2, 48, 8) and t.is_contiguous() for t in pool)
    assert all(float(t.abs().sum()) == 0.0 for t in pool)  # zero pages: attention never reads garbage
    pool[1].fill_(3.0)
    pool[2][0, 5].fill_(1.0)
    assert float(pool[0].abs().sum()) == 0.0 and float(pool[3].abs().sum()) == 0.0  # neighbours untouched
    assert float(pool[1].sum()) == 2 * 48 * 8 * 3.0 and float(pool[2].sum()) == 8.0
    half = zeroed_tensors((3, 5), 2, torch.bfloat16, torch.device("cpu"))
    assert half[0].dtype == torch.bfloat16 and float(half[1].float().sum()) == 0.0


def test_runner_kv_caches_start_at_zero(tiny_state: dict[str, torch.Tensor]) -> None:
    runner = TorchRunner(build_model(TINY, tiny_state, torch.device("cpu"), torch.float32), TINY_ENGINE)
    assert len(runner.kv_caches) == TINY.num_hidden_layers
    for k, v in runner.kv_caches:
        assert k.shape == v.shape and float(k.abs().sum()) == 0.0 and float(v.abs().sum()) == 0.0
    k0, v0 = runner.kv_caches[0]
    k0.fill_(1.0)
    assert float(v0.abs().sum()) == 0.0 and float(runner.kv_caches[1][0].abs().sum()) == 0.0
