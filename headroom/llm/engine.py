"""The synchronous engine: admission, the step loop (schedule -> run -> sample -> stop checks), abort.

Single-threaded by design: whoever owns an `LLMEngine` calls `add_request`, `abort` and `step` from one
thread (the offline `LLM` from the caller's, `AsyncLLMEngine` from its worker thread).

A failure that belongs to one sequence (a row that cannot be sampled, a detokenizer error) finishes that
request alone: its output carries `finish_reason` ERROR and the `error`, its siblings are aborted, and the
step goes on for every other sequence. Gauges (running, waiting, KV usage) are published after every step
and every abort, so they are true while the engine idles.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

import numpy as np

from headroom.core.clock import Clock, MonotonicClock
from headroom.core.errors import ContextLengthExceeded, HeadroomError, InvalidRequest, RateLimited
from headroom.llm.config import EngineConfig
from headroom.llm.grammar import MATCHER_KEY, MaskWorker, StepMasks, advance, compiler_for, new_matcher
from headroom.llm.kv_cache import KVCacheManager, KVCacheStats
from headroom.llm.request import (
    FinishReason,
    Request,
    RequestTimeline,
    SamplingParams,
    SequenceOutput,
    TokenLogprob,
)
from headroom.llm.sampler import SamplingError, sample
from headroom.llm.scheduler import Scheduler, SchedulerLimits
from headroom.llm.spec_decode import DraftProposer, verify_greedy
from headroom.llm.step_batch import BatchItem, ModelBatch, Runner
from headroom.llm.step_cancel import StepCancel, StepCancelled
from headroom.llm.step_stats import EngineObserver, SpecTally, StepStats
from headroom.llm.stopping import check_stop
from headroom.llm.tokenizer import IncrementalDetokenizer, Tokenizer

log = logging.getLogger("headroom.llm")


class LLMEngine:
    """Continuous batching over a paged KV cache behind a `Runner`."""

    def __init__(
        self,
        runner: Runner,
        config: EngineConfig,
        max_model_len: int,
        tokenizer: Tokenizer | None = None,
        clock: Clock | None = None,
        observer: EngineObserver | None = None,
        proposer: DraftProposer | None = None,
    ) -> None:
        config.validate()
        if config.speculative_draft_model and proposer is None:
            raise ValueError(
                "speculative_draft_model is set but no draft proposer was given; load the engine with "
                "offline.load_engine (it loads the draft) or pass proposer=DraftModelProposer(...)"
            )
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        self.max_model_len = min(config.max_model_len or max_model_len, max_model_len)
        self.clock = clock or MonotonicClock()
        self.observer = observer
        self.kv = KVCacheManager(runner.num_blocks, config.block_size_tokens, config.enable_prefix_caching)
        limits = SchedulerLimits(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enable_chunked_prefill=config.enable_chunked_prefill,
            max_waiting=config.max_waiting_requests,
            num_speculative_tokens=(
                config.speculative_draft_tokens if proposer is not None else config.speculative_ngram_tokens
            ),
            max_model_len=self.max_model_len,
            swap_space_blocks=int(config.swap_space_mb * 2**20 // max(1, runner.kv_bytes_per_block)),
        )
        self.scheduler = Scheduler(limits, self.kv, proposer)
        self._rng = random.Random(config.seed)
        self._seq_no = 0
        self._children: dict[str, list[str]] = {}
        self.eos_token_id = tokenizer.eos_token_id if tokenizer else None
        self._host_kv: dict[str, object] = {}  # swapped-out sequences' K/V in host memory
        self.spec_draft_tokens = 0  # speculative tokens proposed so far
        self.spec_accepted_tokens = 0  # of those, accepted
        self.grammars = compiler_for(tokenizer, runner.vocab_size)  # constrained output; None without a tokenizer
        self.mask_worker = MaskWorker()  # computes grammar masks while the forward runs; close() ends it
        self.cancel = StepCancel()  # cancels the step in flight once all its requests are being aborted (any thread)

    def close(self) -> None:  # ends the grammar mask thread; the engine must not step afterwards
        self.mask_worker.close()

    # --- admission --------------------------------------------------------------------------------------
    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams, priority: int = 0,
        cache_key: str = "",
    ) -> list[str]:
        """Queue a request (n sequences); raises InvalidRequest (400) or RateLimited (429).

        `cache_key` isolates its prefix-cache blocks: it only reuses blocks cached under the same key."""
        try:
            params.validate()
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        if not prompt_token_ids:
            raise InvalidRequest("the prompt is empty; send at least one token")
        if request_id in self._children:
            raise InvalidRequest(f"request id {request_id!r} is already in use")
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ContextLengthExceeded(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{len(prompt_token_ids)} and max_tokens asks for {params.max_tokens} ({total}); "
                "shorten the prompt or lower max_tokens"
            )
        if self.kv.blocks_needed(total) > self.kv.num_blocks:
            raise InvalidRequest(
                f"{total} tokens need {self.kv.blocks_needed(total)} KV blocks but the cache has "
                f"{self.kv.num_blocks}; lower max_tokens or raise kv_cache_memory_mb"
            )
        if self.scheduler.waiting_full(params.n):
            if self.observer is not None:
                self.observer.on_rejected("max_num_queued_reqs")
            raise RateLimited(
                f"the waiting queue is full ({self.config.max_waiting_requests} requests); retry later",
                retry_after_s=self.config.retry_after_s,
            )
        matcher = new_matcher(self.grammars, params.grammar) if params.grammar is not None else None
        now = self.clock.now_s()
        ids: list[str] = []
        for i in range(params.n):
            seq_id = request_id if params.n == 1 else f"{request_id}#{i}"
            seed = params.seed + i if params.seed is not None else self._rng.getrandbits(63)
            gen = None if params.greedy else np.random.default_rng(seed % 2**64)  # numpy takes seeds >= 0
            self._seq_no += 1
            req = Request(
                request_id=seq_id,
                prompt_token_ids=list(prompt_token_ids),
                params=params,
                arrival_s=now,
                seq_no=self._seq_no,
                priority=priority,
                parent_id=request_id,
                index=i,
                leader_id=ids[0] if ids else "",
                cache_key=cache_key,
                generator=gen,
            )
            if self.tokenizer is not None:
                req.extra["detok"] = IncrementalDetokenizer(self.tokenizer)
            if matcher is not None:
                req.extra[MATCHER_KEY] = matcher.deep_copy()
            self.scheduler.add(req)
            ids.append(seq_id)
        self._children[request_id] = ids
        return ids

    def abort(self, request_id: str) -> list[SequenceOutput]:
        """Stop a request's sequences now and free their blocks; unknown ids are ignored."""
        outs = []
        now = self.clock.now_s()
        for seq_id in self._children.pop(request_id, []):
            req = self.scheduler.requests.get(seq_id)
            if req is None:
                continue
            req.finish_reason = FinishReason.ABORT
            self.scheduler.finish(req)
            self._host_kv.pop(seq_id, None)
            if self.observer is not None:
                self.observer.on_finish(req, now)
            outs.append(self._output(req, 0, "", now))
        self.publish_gauges()
        return outs

    def publish_gauges(self) -> None:
        """Hand the observer the current running / waiting counts and KV usage (after aborts, at idle)."""
        if self.observer is not None:
            sched = self.scheduler
            self.observer.on_gauges(len(sched.running), len(sched.waiting), self.kv.stats().usage)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._children)

    def has_request(self, request_id: str) -> bool:
        """Whether a user-visible request still has unfinished sequences."""
        return request_id in self._children

    def request_ids(self) -> list[str]:
        """User-visible ids of unfinished requests."""
        return list(self._children)

    # --- the step ---------------------------------------------------------------------------------------
    def step(self) -> list[SequenceOutput]:
        """Run one iteration; returns outputs of sequences that got a token or finished."""
        before = self.kv.stats()
        decision = self.scheduler.schedule()
        if decision.empty:
            return []
        for seq_id, blocks in decision.swap_out:  # before the forward can overwrite the freed blocks
            self._host_kv[seq_id] = self.runner.swap_out(blocks)
        for seq_id, blocks in decision.swap_in:
            self.runner.swap_in(self._host_kv.pop(seq_id), blocks)
        now = self.clock.now_s()
        reqs = self.scheduler.requests
        items = []
        for s in decision.seqs:
            req = reqs[s.request_id]
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now
            tokens = tuple(req.token_ids[s.start_position : s.start_position + s.num_tokens])
            table = tuple(self.kv.block_table(s.request_id))
            tokens += s.draft_token_ids
            items.append(
                BatchItem(s.request_id, tokens, s.start_position, table, s.samples, 1 + len(s.draft_token_ids))
            )
        sampling = [reqs[s.request_id] for s in decision.seqs if s.samples]
        masks = StepMasks(self.mask_worker, sampling, self.runner.vocab_size)  # computed during the forward
        batch = ModelBatch(tuple(items), self.config.block_size_tokens, self.cancel.flag_address)
        self.cancel.begin({reqs[s.request_id].parent_id for s in decision.seqs})
        try:
            logits = self.runner.execute(batch)
        except StepCancelled:  # every request in it is being aborted: their queued aborts free the blocks next
            self.cancel.end(cancelled=True)
            self._report(before, 0, len(decision.preempted), 0, 0, cancelled=True)
            return []
        self.cancel.end(cancelled=False)
        now = self.clock.now_s()
        # rows per sampling item: 1 + its drafts; plain items are sampled together, speculative ones verified
        plain: list[tuple[int, Request]] = []
        emitted: dict[str, tuple[list[int], list[TokenLogprob | None]]] = {}
        failed: dict[str, tuple[Request, HeadroomError]] = {}
        spec = SpecTally()
        row = 0
        for s in decision.seqs:
            req = reqs[s.request_id]
            req.num_computed_tokens = s.start_position + s.num_tokens
            if not s.samples:
                continue
            rows = logits[row : row + 1 + len(s.draft_token_ids)]
            if s.draft_token_ids and not bool(np.isfinite(rows.max(-1)).all()):
                failed[req.request_id] = (req, SamplingError("the model produced non-finite logits for this sequence"))
            elif s.draft_token_ids:
                toks, n_ok = verify_greedy(rows, s.draft_token_ids)
                req.num_computed_tokens += n_ok
                spec.add(len(s.draft_token_ids), n_ok)
                emitted[req.request_id] = (toks, [None] * len(toks))
            else:
                plain.append((row, req))
            row += 1 + len(s.draft_token_ids)
        if plain:
            idx = [r for r, _ in plain]
            # every row is a plain one, in order (no speculative rows): sample the runner's logits in place (the step
            # owns them) instead of gathering a copy (32 x 49152 fp32: 6 MB and ~1 ms a step at 32 streams)
            rows = logits if idx == list(range(len(logits))) else logits[idx]
            failed.update((i, (reqs[i], e)) for i, e in masks.apply(rows, [q.request_id for _, q in plain]).items())
            picks = sample(rows, [req for _, req in plain])
            for (_, req), pick in zip(plain, picks, strict=True):
                if isinstance(pick, HeadroomError):
                    failed[req.request_id] = (req, pick)
                else:
                    emitted[req.request_id] = ([pick[0]], [pick[1]])
        outs: list[SequenceOutput] = []
        prompt_tokens = generated = 0
        for s in decision.seqs:
            req = reqs[s.request_id]
            if req.request_id in failed:
                continue
            if req.request_id not in emitted:
                self.kv.cache_full_blocks(req.request_id, req.token_ids, req.num_computed_tokens, req.cache_key)
                continue
            try:
                if MATCHER_KEY in req.extra:
                    advance(req.extra[MATCHER_KEY], emitted[req.request_id][0][0])
                n_new, delta = self._append(req, emitted[req.request_id], now)
            except Exception as exc:  # a detokenizer / stop-check failure: this sequence alone
                log.exception("sequence %s failed after its step", req.request_id)
                failed[req.request_id] = (req, HeadroomError(f"generating this request failed: {exc}"))
                continue
            generated += n_new
            prompt_tokens += req.num_prompt_tokens if req.num_output_tokens == n_new else 0
            computed = min(req.num_computed_tokens, len(req.token_ids))
            self.kv.cache_full_blocks(req.request_id, req.token_ids, computed, req.cache_key)
            if req.finished:
                self._retire(req, now)
            outs.append(self._output(req, n_new, delta, now))
        for req, err in failed.values():
            outs.extend(self._fail(req, err, now))
        self.spec_draft_tokens += spec.draft_tokens
        self.spec_accepted_tokens += spec.accepted_tokens
        self._report(before, decision.num_batched_tokens, len(decision.preempted), prompt_tokens, generated, spec)
        return outs

    def _report(self, before: KVCacheStats, num_batched_tokens: int, num_preempted: int, prompt_tokens: int,
                generated: int, spec: SpecTally | None = None, cancelled: bool = False) -> None:
        """Hand the observer the step's StepStats (`before`: the KV stats when the step began)."""
        if self.observer is not None:
            after = self.kv.stats()
            self.observer.on_step(
                StepStats(
                    num_running=len(self.scheduler.running),
                    num_waiting=len(self.scheduler.waiting),
                    kv_cache_usage=after.usage,
                    num_batched_tokens=num_batched_tokens,
                    num_preempted=num_preempted,
                    prompt_tokens=prompt_tokens,
                    generation_tokens=generated,
                    prefix_queries_tokens=after.prefix_queries_tokens - before.prefix_queries_tokens,
                    prefix_hits_tokens=after.prefix_hits_tokens - before.prefix_hits_tokens,
                    spec_draft_tokens=spec.draft_tokens if spec else 0,
                    spec_accepted_tokens=spec.accepted_tokens if spec else 0,
                    spec_drafts=spec.drafts if spec else 0,
                    spec_accepted_per_pos=tuple(spec.accepted_per_pos) if spec else (),
                    cancelled=cancelled,
                )
            )

    def _append(self, req: Request, emitted: tuple[list[int], list[TokenLogprob | None]],
                now: float) -> tuple[int, str]:
        """Append a sequence's new tokens up to a stop condition; (tokens appended, new text)."""
        delta = ""
        n_new = 0
        for token, lp in zip(*emitted, strict=True):
            first = req.num_output_tokens == 0
            req.token_ids.append(token)
            n_new += 1
            if lp is not None:
                req.logprobs.append(lp)
            if first:
                req.first_token_s = now
            if self.observer is not None:
                self.observer.on_token(req, now, first)
            req.last_token_s = now
            delta += check_stop(req, token, self.eos_token_id, self.max_model_len)
            if req.finished:
                break
        return n_new, delta

    def _fail(self, req: Request, err: HeadroomError, now: float) -> list[SequenceOutput]:
        """Finish a failed sequence with its error (first), then abort its siblings."""
        if req.finished:
            return []  # a sibling failed first and aborted it
        req.finish_reason = FinishReason.ERROR
        self._retire(req, now)
        return [self._output(req, 0, "", now, err), *self.abort(req.parent_id)]

    def _retire(self, req: Request, now: float) -> None:
        self.scheduler.finish(req)
        self._host_kv.pop(req.request_id, None)
        if self.observer is not None:
            self.observer.on_finish(req, now)
        kids = self._children.get(req.parent_id, [])
        if req.request_id in kids:
            kids.remove(req.request_id)
            if not kids:
                del self._children[req.parent_id]

    def _output(self, req: Request, num_new: int, delta: str, now: float,
                error: HeadroomError | None = None) -> SequenceOutput:
        out_ids = req.output_token_ids
        return SequenceOutput(
            request_id=req.request_id,
            parent_id=req.parent_id,
            index=req.index,
            prompt_token_ids=tuple(req.prompt_token_ids),
            token_ids=tuple(out_ids),
            new_token_ids=tuple(out_ids[len(out_ids) - num_new :]) if num_new else (),
            text=req.text[: int(req.extra.get("emitted", len(req.text)))],
            delta_text=delta,
            finish_reason=req.finish_reason,
            logprobs=tuple(req.logprobs),
            num_cached_tokens=req.num_cached_tokens,
            arrival_s=req.arrival_s,
            first_token_s=req.first_token_s,
            finished_s=now if req.finished else None,
            timeline=RequestTimeline(
                arrival_s=req.arrival_s,
                first_scheduled_s=req.first_scheduled_s,
                first_token_s=req.first_token_s,
                last_token_s=req.last_token_s,
                finished_s=now if req.finished else None,
            ),
            error=error,
        )
