"""Draft-model speculative decoding: a small model with the target's vocabulary proposes k tokens greedily.

The draft runs on the engine's own machinery: a runner (the native one for a GGUF on CPU, like the target;
`TorchRunner` in fp32 mode) over its own small paged K/V pool (as many blocks as the target's, so whatever fits
the target fits the draft) and a `KVCacheManager` without prefix
caching. Per sequence it remembers the tokens whose K/V it holds; each step it keeps the longest prefix
of those that still matches the sequence (after a rejection that rolls back to the accepted prefix),
computes only the rest, then decodes k - 1 more tokens. All sequences of a step share each draft forward:
one forward for the catch-up tokens, then one per further draft position. The target verifies every
draft (`verify_greedy`), so output stays token-for-token identical to plain greedy decoding.

A sequence's draft state (blocks and tokens) is freed by `release` (finish, abort, preemption). When the
draft's pool is full or a sequence outgrows the draft's context, that sequence simply gets no drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from headroom.llm.config import DecoderConfig, EngineConfig
from headroom.llm.kv_cache import KVCacheManager
from headroom.llm.spec_decode import DraftQuery
from headroom.llm.step_batch import BatchItem, ModelBatch, Runner
from headroom.llm.tokenizer import Tokenizer


@dataclass(slots=True)
class _DraftSeq:
    """What the draft holds for one sequence."""

    held: list[int] = field(default_factory=list)  # tokens whose K/V are in the draft's cache, in order
    verified: int = 0  # prefix length of `held` known to equal the sequence's tokens (they only grow)


def check_draft_compatible(
    target: DecoderConfig,
    draft: DecoderConfig,
    target_tokenizer: Tokenizer | None = None,
    draft_tokenizer: Tokenizer | None = None,
) -> None:
    """Raise ValueError unless the draft's token ids mean what the target's mean."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"speculative_draft_model has vocab_size {draft.vocab_size} but the target has {target.vocab_size}; "
            "the draft must share the target's tokenizer (pick a smaller model of the same family)"
        )
    if target_tokenizer is not None and draft_tokenizer is not None:
        a, b = (_vocab(t) for t in (target_tokenizer, draft_tokenizer))
        if a != b:
            diff = sorted(set(a.items()) ^ set(b.items()))[:3]
            raise ValueError(
                f"speculative_draft_model's tokenizer differs from the target's (e.g. {diff}); "
                "the draft must share the target's tokenizer (pick a smaller model of the same family)"
            )


def _vocab(tokenizer: Tokenizer) -> dict[str, int]:
    from tokenizers import Tokenizer as HFTokenizer

    vocab: dict[str, int] = HFTokenizer.from_file(str(tokenizer.files.tokenizer_json)).get_vocab()
    return vocab


class DraftModelProposer:
    """A `DraftProposer` that runs a small model greedily for up to k tokens per eligible sequence."""

    def __init__(self, runner: Runner, cfg: DecoderConfig, engine: EngineConfig) -> None:
        """`runner`: the draft model's runner, its pool sized by the caller (as many blocks as the target's)."""
        if runner.num_blocks < 1:
            raise ValueError("the draft model's K/V pool needs >= 1 block")
        self.runner = runner
        self.kv = KVCacheManager(self.runner.num_blocks, engine.block_size_tokens, enable_prefix_caching=False)
        self.block_size = engine.block_size_tokens
        self.max_positions = cfg.max_position_embeddings  # the draft's context limit
        self.vocab_size = cfg.vocab_size
        self._seqs: dict[str, _DraftSeq] = {}
        self.num_forwards = 0  # draft forwards run so far (cost accounting)
        self.num_draft_tokens_computed = 0  # tokens the draft computed so far (catch-up + drafts)

    @property
    def num_tracked(self) -> int:
        """Sequences the draft holds state for."""
        return len(self._seqs)

    def tracked_ids(self) -> frozenset[str]:
        """Ids of the sequences the draft holds state for."""
        return frozenset(self._seqs)

    def release(self, request_id: str) -> None:
        self._seqs.pop(request_id, None)
        self.kv.free(request_id)

    def propose(self, queries: Sequence[DraftQuery]) -> list[tuple[int, ...]]:
        drafts: list[list[int]] = [[] for _ in queries]
        active: list[int] = []  # query indices still drafting
        items: list[BatchItem] = []
        for i, q in enumerate(queries):
            item = self._catch_up(q)
            if item is not None:
                active.append(i)
                items.append(item)
        pos = 0
        while active:
            logits = self.runner.execute(ModelBatch(tuple(items), self.block_size))
            self.num_forwards += 1
            self.num_draft_tokens_computed += sum(len(it.token_ids) for it in items)
            best = logits.argmax(-1).tolist()
            pos += 1
            nxt_active, nxt_items = [], []
            for row, i in enumerate(active):
                q = queries[i]
                seq = self._seqs[q.request.request_id]
                seq.held.extend(items[row].token_ids)
                drafts[i].append(int(best[row]))
                if pos < q.max_tokens:
                    nxt_active.append(i)
                    table = tuple(self.kv.block_table(q.request.request_id))
                    nxt_items.append(BatchItem(q.request.request_id, (drafts[i][-1],), len(seq.held), table, True))
            active, items = nxt_active, nxt_items
        return [tuple(d) for d in drafts]

    def _catch_up(self, q: DraftQuery) -> BatchItem | None:
        """Roll the sequence's draft state back to what still matches and return the tokens left to compute
        (None: no drafts for it this step)."""
        rid, tokens = q.request.request_id, q.request.token_ids
        need = len(tokens) + q.max_tokens - 1  # positions the draft's cache must hold after drafting
        if q.max_tokens < 1 or need > self.max_positions:
            self.release(rid)
            return None
        seq = self._seqs.setdefault(rid, _DraftSeq())
        keep = seq.verified
        limit = min(len(seq.held), len(tokens) - 1)  # at least one token to run for logits
        while keep < limit and seq.held[keep] == tokens[keep]:
            keep += 1
        keep = min(keep, limit)
        del seq.held[keep:]
        seq.verified = keep
        if not self.kv.allocate(rid, need):
            self.release(rid)
            return None
        seq.verified = len(tokens)  # after this step the draft holds all of them (drafts may follow)
        return BatchItem(rid, tuple(tokens[keep:]), keep, tuple(self.kv.block_table(rid)), True)


def build_draft_proposer(
    target: DecoderConfig,
    draft: DecoderConfig,
    make_runner: Callable[[int], Runner],
    engine: EngineConfig,
    num_blocks: int,
    target_tokenizer: Tokenizer | None = None,
    draft_tokenizer: Tokenizer | None = None,
) -> DraftModelProposer:
    """Check the draft against the target, then build its proposer on `make_runner(num_blocks)` (a pool of the
    target's size)."""
    check_draft_compatible(target, draft, target_tokenizer, draft_tokenizer)
    if num_blocks < 1:
        raise ValueError("the draft model's K/V pool needs >= 1 block")
    return DraftModelProposer(make_runner(num_blocks), draft, engine)
