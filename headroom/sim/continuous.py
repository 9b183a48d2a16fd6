"""Continuous (iteration-level) batching of one simulated LLM replica.

Every engine iteration runs each running sequence one token; a sequence with T output tokens finishes after
T iterations, the first of which also pays its prompt's prefill. New sequences join at iteration boundaries
while slots are free (vLLM's `max_num_seqs`). To stay fast the replica plans a *macro-step*: all iterations
until the next sequence finishes, in one event; an arrival that finds a free slot cuts the macro-step at the
next iteration boundary (`interrupt`), exactly where a real engine would admit it.

Per-token latencies (TTFT, TPOT, ITL; `headroom.sim.tokens`) come out of the same bookkeeping: a sequence's
first token ends the first iteration after it joined, the others end the iterations after that.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from headroom.batching.policy import QueuedItem
from headroom.sim.profile import LlmProfile
from headroom.sim.tokens import TokenStats


class ContinuousReplica:
    """Running set, iteration counter and the current macro-step of one replica."""

    __slots__ = ("_d1_s", "_fin", "_first_s", "_iter", "_k", "_measured", "_new", "_prefill_s", "_prof", "_rng",
                 "_seq", "_step_s", "_t0_s", "token")

    def __init__(self, profile: LlmProfile, rng: np.random.Generator) -> None:
        self._prof = profile
        self._rng = rng
        self._iter = 0  # iterations completed so far
        # heap of (finishing iteration, seq, enqueue time, output tokens)
        self._fin: list[tuple[int, int, float, int]] = []
        self._seq = 0
        self._new: list[tuple[int, float]] = []  # (seq, enqueue time) admitted at this boundary (TTFT pending)
        self._first_s: dict[int, float] = {}  # seq -> time of its first token (for TPOT)
        self._measured = 0  # running sequences that arrived after the warm-up cut (their tokens are measured)
        self._prefill_s = 0.0  # prefill work of those admissions
        self._t0_s = 0.0  # start of the macro-step
        self._d1_s = 0.0  # its first iteration (decode step + prefill)
        self._step_s = 0.0  # every later iteration
        self._k = 0  # iterations in the macro-step
        self.token = 0  # invalidates a macro-step's end event after an interrupt

    @property
    def running(self) -> int:
        """Sequences in the batch."""
        return len(self._fin)

    @property
    def planned_iterations(self) -> int:
        """Iterations of the current macro-step."""
        return self._k

    def has_free_slot(self) -> bool:
        """Whether an arrival could join at the next boundary."""
        return len(self._fin) < self._prof.max_num_seqs

    def _output_tokens(self) -> int:
        mean = self._prof.output_tokens
        if self._prof.output_dist == "geometric" and mean > 1:
            return int(self._rng.geometric(1.0 / mean))
        return max(1, mean)

    def admit(self, items: deque[QueuedItem], now_s: float, cut_s: float) -> tuple[int, int]:
        """Move queued requests into free slots (FIFO); returns (joined, expired). Requests whose deadline
        passed while queued are dropped, never started; `expired` counts those arriving after `cut_s`."""
        free = self._prof.max_num_seqs - len(self._fin)
        joined = expired = 0
        while free > 0 and items:
            item = items.popleft()
            if item.deadline_s <= now_s:
                expired += item.enqueued_s >= cut_s
                continue
            self._seq += 1
            tokens = self._output_tokens()
            heapq.heappush(self._fin, (self._iter + tokens, self._seq, item.enqueued_s, tokens))
            self._new.append((self._seq, item.enqueued_s))
            self._measured += item.enqueued_s >= cut_s
            self._prefill_s += self._prof.prompt_tokens * self._prof.prefill_s_per_token
            free -= 1
            joined += 1
        return joined, expired

    def plan(self, now_s: float) -> float:
        """Start a macro-step at `now_s`; returns when it ends (the next completion)."""
        self.token += 1
        self._t0_s = now_s
        self._step_s = self._prof.step_s(len(self._fin))
        self._d1_s = self._step_s + self._prefill_s
        self._k = max(1, self._fin[0][0] - self._iter)
        return now_s + self._d1_s + (self._k - 1) * self._step_s

    def interrupt(self, now_s: float) -> float | None:
        """Cut the macro-step at the first iteration boundary after `now_s`; None if it ends there anyway."""
        first_end = self._t0_s + self._d1_s
        m = 1 if now_s <= first_end else 1 + math.ceil((now_s - first_end) / self._step_s - 1e-12)
        if m >= self._k:
            return None
        self._k = m
        self.token += 1
        return first_end + (m - 1) * self._step_s

    def finish(self, now_s: float, latencies: list[float], tokens: TokenStats, cut_s: float) -> None:
        """Close the macro-step at `now_s`: record first tokens, inter-token gaps and finished sequences."""
        first_end = self._t0_s + self._d1_s
        measured = self._measured
        if self._new:
            first_s = self._first_s
            ttft = tokens.ttft_s
            for seq, e in self._new:
                if e >= cut_s:
                    ttft.append(first_end - e)
                    first_s[seq] = first_end
                    measured -= 1
            self._new = []
        # Sequences already running got a token after each of the k iterations; new ones after all but the first.
        if measured > 0:
            tokens.itl_s.append(self._d1_s)
            tokens.itl_weights.append(measured)
        if self._k > 1 and self._measured > 0:
            tokens.itl_s.append(self._step_s)
            tokens.itl_weights.append((self._k - 1) * self._measured)
        self._prefill_s = 0.0
        self._iter += self._k
        fin = self._fin
        while fin and fin[0][0] <= self._iter:
            _, seq, e, n_tokens = heapq.heappop(fin)
            if e >= cut_s:
                latencies.append(now_s - e)
                self._measured -= 1
                t_first = self._first_s.pop(seq)
                if n_tokens > 1:
                    tokens.tpot_s.append((now_s - t_first) / (n_tokens - 1))
