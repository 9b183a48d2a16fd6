"""Iteration-level (continuous) batching: which sequences run how many tokens in the next step.

Every step has a token budget (`max_num_batched_tokens`) and a sequence limit (`max_num_seqs`). A sequence
runs `len(token_ids) - num_computed_tokens` tokens (capped by what is left of the budget), so a prompt's
prefill is chunked across steps and mixed with other sequences' one-token decodes in the same step.

Order: running sequences first (by priority, then arrival), then waiting ones. When the cache has no block
for a running sequence, the lowest-priority, newest running sequence is preempted: by recompute (default;
its blocks are freed and it returns to the waiting queue with `num_computed_tokens = 0`; its generated
tokens are kept, so it resumes with identical output) or by swap (`swap_space_blocks > 0`: its blocks are
copied to host memory before this step's forward, freed, and copied back into fresh blocks when it is
readmitted; recompute is the fallback when the host space is full). No new sequence is admitted in a
step that preempted for lack of blocks. Priorities: lower value first; a waiting sequence that does not
fit (sequence slots or blocks) preempts strictly lower-priority running sequences, newest first.
The scheduler touches no model: it is tested with a fake runner.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from headroom.llm.kv_cache import KVCacheManager, PrefixHit
from headroom.llm.request import Request
from headroom.llm.spec_decode import DraftProposer, DraftQuery, NgramProposer, can_speculate


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """One sequence's share of a step."""

    request_id: str  # the sequence
    start_position: int  # tokens already in the cache (position of the first new token)
    num_tokens: int  # new tokens to run this step
    samples: bool  # the chunk reaches the last known token, so a token is sampled after it
    draft_token_ids: tuple[int, ...] = ()  # speculative tokens appended after the chunk (verified by the engine)


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """The decision for one step."""

    seqs: tuple[ScheduledSeq, ...]  # what runs, in batch order
    preempted: tuple[str, ...]  # sequences preempted (blocks freed) while deciding
    num_batched_tokens: int  # total new tokens
    swap_out: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (sequence, its old blocks) to copy to host first
    swap_in: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (sequence, its new blocks) to copy back into

    @property
    def empty(self) -> bool:
        return not self.seqs


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    """The knobs the scheduler obeys."""

    max_num_seqs: int  # most sequences per step
    max_num_batched_tokens: int  # token budget per step
    enable_chunked_prefill: bool = True  # False: a prompt's remaining prefill must fit in one step
    max_waiting: int = 256  # bounded waiting queue
    num_speculative_tokens: int = 0  # draft length for eligible decodes (0 = off; drafts from the proposer)
    max_model_len: int = 1 << 30  # context limit: drafts never run past it
    swap_space_blocks: int = 0  # host blocks for swap preemption (0 = always recompute)


def _key(req: Request) -> tuple[int, int]:
    return (req.priority, req.seq_no)


class Scheduler:
    """Holds the waiting and running queues; `schedule()` decides a step, `finish()` retires a sequence."""

    def __init__(self, limits: SchedulerLimits, kv: KVCacheManager, proposer: DraftProposer | None = None) -> None:
        self.limits = limits
        self.kv = kv
        self.proposer: DraftProposer = proposer or NgramProposer()  # where speculative drafts come from
        self._drafts: dict[str, tuple[int, ...]] = {}  # this step's proposals, by sequence
        self.waiting: list[Request] = []  # sorted by (priority, seq_no)
        self.running: list[Request] = []  # sorted by (priority, seq_no)
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self.num_swaps = 0  # preemptions done by swapping
        self.swapped: dict[str, int] = {}  # sequence -> blocks held in host memory
        self._swap_out: list[tuple[str, tuple[int, ...]]] = []
        self._swap_in: list[tuple[str, tuple[int, ...]]] = []

    # --- queue management -------------------------------------------------------------------------------
    def waiting_full(self, extra: int = 1) -> bool:
        """Whether admitting `extra` more sequences would overflow the waiting queue."""
        return len(self.waiting) + extra > self.limits.max_waiting

    def add(self, req: Request) -> None:
        """Queue a sequence (the caller checked `waiting_full`)."""
        self.requests[req.request_id] = req
        bisect.insort(self.waiting, req, key=_key)

    def finish(self, req: Request) -> None:
        """Remove a finished or aborted sequence and free its blocks at once."""
        self.requests.pop(req.request_id, None)
        self.swapped.pop(req.request_id, None)
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req.request_id)
        self.proposer.release(req.request_id)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- the decision -----------------------------------------------------------------------------------
    def _preempt(self, victim: Request) -> None:
        self.running.remove(victim)
        table = tuple(self.kv.block_table(victim.request_id))
        used = self.kv.blocks_needed(victim.num_computed_tokens)
        if 0 < used <= self.limits.swap_space_blocks - sum(self.swapped.values()):
            self._swap_out.append((victim.request_id, table[:used]))
            self.swapped[victim.request_id] = used
            self.num_swaps += 1
        else:
            victim.num_computed_tokens = 0
        self.kv.free(victim.request_id)
        self.proposer.release(victim.request_id)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        bisect.insort(self.waiting, victim, key=_key)

    def _leader_pending(self, req: Request) -> bool:
        """n > 1 siblings wait until the leader's prompt is in the cache, then reuse its blocks."""
        if not req.leader_id or not self.kv.enable_prefix_caching:
            return False
        leader = self.requests.get(req.leader_id)
        return leader is not None and leader.num_computed_tokens < leader.num_prompt_tokens

    def schedule(self) -> SchedulerOutput:
        """Decide the next step; mutates queue membership, block tables and prefix-hit counts only."""
        budget = self.limits.max_num_batched_tokens
        out: list[ScheduledSeq] = []
        preempted = self._preempt_for_priority()
        for_priority = len(preempted)
        self._drafts = self._propose_all()
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(len(req.token_ids) - req.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            draft = self._draft(req, num_new, budget)
            while not self.kv.allocate(req.request_id, req.num_computed_tokens + num_new + len(draft)):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            if req.request_id in preempted:
                break
            start = req.num_computed_tokens
            out.append(ScheduledSeq(req.request_id, start, num_new, start + num_new == len(req.token_ids), draft))
            budget -= num_new + len(draft)
            i += 1
        if len(preempted) == for_priority:  # preempting for lack of blocks stops admission this step
            budget = self._admit(budget, out)
        total = self.limits.max_num_batched_tokens - budget
        swaps_out, swaps_in = tuple(self._swap_out), tuple(self._swap_in)
        self._swap_out.clear()
        self._swap_in.clear()
        return SchedulerOutput(tuple(out), tuple(preempted), total, swaps_out, swaps_in)

    def _preempt_for_priority(self) -> list[str]:
        """Make room for the best waiting sequence by preempting strictly lower-priority running ones."""
        head = next((r for r in self.waiting if not self._leader_pending(r)), None)
        victims: list[str] = []
        while head is not None and self.running and self.running[-1].priority > head.priority:
            first_chunk = min(len(head.token_ids), self.limits.max_num_batched_tokens)
            seq_full = len(self.running) >= self.limits.max_num_seqs
            if not seq_full and self.kv.blocks_needed(first_chunk) <= self.kv.num_free_blocks:
                break
            victim = self.running[-1]
            self._preempt(victim)
            victims.append(victim.request_id)
        return victims

    def _draft(self, req: Request, num_new: int, budget: int) -> tuple[int, ...]:
        """This step's drafts for a one-token decode (proposed and capped in `_propose_all`), trimmed to what the
        step's budget leaves after the decoded token."""
        if num_new != 1:
            return ()
        return self._drafts.get(req.request_id, ())[: max(0, budget - 1)]

    def _propose_all(self) -> dict[str, tuple[int, ...]]:
        """One batched proposer call for every running one-token decode that may speculate (budget-blind:
        `_draft` trims to what the step's budget leaves)."""
        k = self.limits.num_speculative_tokens
        if k <= 0:
            return {}
        queries = []
        for req in self.running:
            if len(req.token_ids) - req.num_computed_tokens != 1 or not can_speculate(req.params):
                continue
            room = min(
                k,
                req.params.max_tokens - req.num_output_tokens - 1,
                self.limits.max_model_len - len(req.token_ids) - 1,
            )
            if room > 0:
                queries.append(DraftQuery(req, room))
        if not queries:
            return {}
        drafts = self.proposer.propose(queries)
        return {q.request.request_id: d[: q.max_tokens] for q, d in zip(queries, drafts, strict=True)}

    def _admit(self, budget: int, out: list[ScheduledSeq]) -> int:
        j = 0
        while j < len(self.waiting) and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            req = self.waiting[j]
            if self._leader_pending(req):
                j += 1
                continue
            fresh = req.num_computed_tokens == 0
            hit = self.kv.find_prefix(req.token_ids, req.cache_key) if fresh else PrefixHit((), 0)
            done = max(hit.num_tokens, req.num_computed_tokens)  # a swapped-out sequence keeps its progress
            remaining = len(req.token_ids) - done
            if not self.limits.enable_chunked_prefill and remaining > budget and out:
                break  # wait for a step of its own (a prompt over the whole budget is chunked anyway)
            num_new = min(remaining, budget)
            if not self.kv.allocate(req.request_id, done + num_new, hit):
                break
            self.waiting.pop(j)
            if req.num_computed_tokens == 0:
                self.kv.record_prefix_lookup(len(req.token_ids), hit)
            swapped = self.swapped.pop(req.request_id, 0)
            if swapped:
                self._swap_in.append((req.request_id, tuple(self.kv.block_table(req.request_id)[:swapped])))
            req.num_computed_tokens = done
            if req.num_preemptions == 0:
                req.num_cached_tokens = hit.num_tokens
            bisect.insort(self.running, req, key=_key)
            out.append(ScheduledSeq(req.request_id, done, num_new, remaining == num_new))
            budget -= num_new
        return budget
