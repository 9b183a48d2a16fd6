"""The discrete-event simulator: arrivals, a router, replica queues, the server's batching policy, service
times from a profile, admission control, shedding and autoscaling with cold starts, on a FakeClock.

Events live in a heapq ordered by (time, sequence); arrivals are merged in from the sorted schedule without
entering the heap. Batching decisions call `headroom.batching.policy.decide` — the very function the
server's batcher calls — with a snapshot of the queue's head (at most `max_batch_size` items are visible,
which changes nothing: the policy never looks further than one full batch), built from the queue's
`headroom.batching.estimator.LoadEstimates` — the batcher's own arrival-rate and service-time estimators,
fed with arrivals and with each batch's service time at its end, as the server feeds them — and, with a
finite `latency_budget_s`, arrivals are admitted by the batcher's `headroom.batching.admission.admit`
(tests/batching/test_sim_parity.py drives both with one trace and gets the same batches). Autoscaling calls
`headroom.autoscaler.policy.decide`. Continuous batching (LLM iterations) lives in `headroom.sim.continuous`.
With `host_cpu_per_request_s > 0` each batch's time is stretched by the host work of the arrivals that come in
while it runs (`headroom.sim.cpu_share`, called from one place: `_stretched`), and with
`host_cpu_per_batch_s > 0` by the front end's work at each completion (`_on_done` queues it); before that, every batch's
profile time is multiplied by `service_time_scale` (an in-service slowdown measured on the real server).
"""

from __future__ import annotations

import heapq
import math
import random
import time
from typing import cast

import numpy as np
import numpy.typing as npt

from headroom.batching.admission import admit
from headroom.batching.policy import QueuedItem
from headroom.batching.policy import decide as batch_decide
from headroom.core.clock import FakeClock
from headroom.router.snapshot import peak_ewma_update
from headroom.sim.config import SimConfig, SimResult
from headroom.sim.continuous import ContinuousReplica
from headroom.sim.cpu_share import HostBacklog, add_work, advance, batch_end_s
from headroom.sim.profile import Jitter, ServiceProfile
from headroom.sim.result import Tally, autoscale_step, build_result
from headroom.sim.router import ReplicaRouter
from headroom.sim.state import ReplicaState as _Replica
from headroom.sim.state import ScaleState as _ScaleState
from headroom.sim.state import SimQueue as _Queue
from headroom.sim.tokens import TokenStats

_DONE, _WAKE, _TICK, _READY, _ITER = 0, 1, 2, 3, 4


class Simulator:
    """Run one configuration over one arrival schedule: ``Simulator(cfg, profile).run(arrivals_s)`` (once)."""

    def __init__(self, cfg: SimConfig, profile: ServiceProfile) -> None:
        if cfg.batching == "continuous" and profile.llm is None:
            raise ValueError("continuous batching needs an `llm:` section in the profile (docs/sim.md)")
        self.cfg = cfg
        self.profile = profile
        self.policy = cfg.batch_policy()
        self.clock = FakeClock()
        # A child stream, so a schedule drawn from default_rng(seed) is never correlated with service times.
        np_rng = np.random.default_rng(np.random.SeedSequence(cfg.seed).spawn(1)[0])
        self._jitter = Jitter(profile.distribution, profile.cv, np_rng)
        self._np_rng = np_rng
        self._rng = random.Random(cfg.seed)
        cap = max(1, self.policy.max_batch_size)
        self._scale = cfg.service_time_scale  # in-service slowdown on every batch's profile time
        self._mean_s = [profile.mean_service_s(max(1, b)) * self._scale for b in range(cap + 1)]
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.queues: list[_Queue] = []
        self.replicas: list[_Replica] = []
        self._router = ReplicaRouter(cfg.router, self._rng)  # the server's router policies over the replicas
        self._track_ewma = cfg.router == "peak_ewma"
        self._timeline: list[tuple[float, int]] = []
        # metrics
        self._lat: list[float] = []
        self._wait_sum = 0.0
        self._tokens = TokenStats()  # continuous batching: TTFT, TPOT, ITL
        self._batches = 0
        self._batch_items = 0
        self._busy_done_s = 0.0
        self._ready_s = 0.0  # accumulated ready replica-seconds
        self._ready_count = 0
        self._ready_mark_s = 0.0
        self._rejected = 0
        self._expired = 0
        self._max_depth = 0
        self._depth = 0
        self._cut_s = cfg.warmup_s
        self._last_done_s = 0.0
        self._host_cost_s = cfg.host_cpu_per_request_s  # > 0: host work on the model's cores stretches batches
        self._host_batch_s = cfg.host_cpu_per_batch_s  # > 0: host work at each completion delays the next batch
        self._host = HostBacklog()
        self._arrivals: list[float] = []  # the schedule (host work of future arrivals preempts a running batch)

    # ---------------------------------------------------------------- events and replicas
    def _push(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    def _account_ready(self, now: float, delta: int) -> None:
        self._ready_s += self._ready_count * (now - self._ready_mark_s)
        self._ready_mark_s = now
        self._ready_count += delta
        self._timeline.append((now, self._ready_count))

    def _add_replica(self, now: float, ready_at: float) -> _Replica:
        if self.cfg.shared_queue and self.queues:
            q = self.queues[0]
        else:
            q = _Queue()
            self.queues.append(q)
        r = _Replica(q, f"r{len(self.replicas):06d}")
        if self.cfg.batching == "continuous" and self.profile.llm is not None:
            r.cont = ContinuousReplica(self.profile.llm, self._np_rng)
        q.replicas.append(r)
        self.replicas.append(r)
        if ready_at <= now:
            self._make_ready(r, now)
        else:
            self._push(ready_at, _READY, r)
        return r

    def _make_ready(self, r: _Replica, now: float) -> None:
        if r.retired or r.ready:
            return
        r.ready = True
        self._router.invalidate()
        self._account_ready(now, +1)
        r.queue.idle.append(r)
        self._dispatch(r.queue, now)

    def _retire(self, r: _Replica, now: float) -> None:
        r.retired = True
        r.ready = False
        self._router.invalidate()
        self._account_ready(now, -1)
        if r in r.queue.idle:
            r.queue.idle.remove(r)

    def _serving(self) -> list[_Replica]:
        return [r for r in self.replicas if not r.retired and not r.draining]

    # ---------------------------------------------------------------- batching
    def _dispatch(self, q: _Queue, now: float) -> None:
        if self.cfg.batching == "continuous":
            for r in list(q.idle):
                q.idle.remove(r)
                self._start_iterations(r, now)
            return
        policy = self.policy
        cap = policy.max_batch_size
        while q.idle and q.items:
            snap = q.snapshot(now, cap)
            d = batch_decide(snap, now, policy)
            if d.expire:
                self._drop(q, d.expire)
                continue
            if not d.take:
                if d.wake_at_s is not None:
                    q.wake_token += 1
                    self._push(d.wake_at_s, _WAKE, (q, q.wake_token))
                return
            batch = q.take(d.take, len(snap.items))
            k = len(batch)
            self._depth -= k
            q.running += k
            r = q.idle.pop()
            mean = self._mean_s[k] if k < len(self._mean_s) else self.profile.mean_service_s(k) * self._scale
            svc = mean * self._jitter.draw()
            if self._host_cost_s > 0 or self._host_batch_s > 0:
                svc = self._stretched(now, svc)
            r.batch = batch
            r.busy_since_s = now
            self._batches += 1
            self._batch_items += k
            cut = self._cut_s
            for it in batch:
                if it.enqueued_s >= cut:
                    self._wait_sum += now - it.enqueued_s
            self._seq += 1
            heapq.heappush(self._heap, (now + svc, self._seq, _DONE, r))

    def _admitted(self, q: _Queue, budget_s: float) -> float | None:
        """The server batcher's admission by predicted delay, on this queue's estimates: None when refused,
        else the mean prediction the delay calibration judges it by (as the batcher's `check_admission`)."""
        d = admit(q.load.backlog(len(q.items) + q.running, self.policy.max_batch_size, q.instances(),
                                 self.clock.now_s()), budget_s)
        return d.expected_s if d.admitted else None

    def _stretched(self, now: float, svc: float) -> float:
        """The batch's wall time when the arrivals' host work shares its core (headroom.sim.cpu_share)."""
        self._host = advance(self._host, self._arrivals, now, self._host_cost_s)
        return batch_end_s(now, svc, self._arrivals, self._host, self._host_cost_s) - now

    def _drop(self, q: _Queue, expire: tuple[int, ...]) -> None:
        dropped = q.drop(expire)
        self._depth -= len(dropped)
        self._expired += sum(1 for it in dropped if it.enqueued_s >= self._cut_s)

    def _on_done(self, r: _Replica, now: float) -> None:
        cut = self._cut_s
        lat = self._lat
        load = r.queue.load
        for it in r.batch:
            if it.enqueued_s >= cut:
                lat.append(now - it.enqueued_s)
            load.delays.observe(now - it.enqueued_s, it.budget_s, it.expected_s, now)  # as the batcher feeds it
        if self._track_ewma:
            for it in r.batch:
                r.ewma_s = peak_ewma_update(r.ewma_s, now - it.enqueued_s, now - r.ewma_t)
                r.ewma_t = now
        # the batch's service time, measured as the server's batcher measures it, into the same estimator
        load.service.observe(now - r.busy_since_s, len(r.batch))
        r.queue.running -= len(r.batch)
        self._busy_done_s += now - r.busy_since_s
        self._last_done_s = now
        if self._host_batch_s > 0:  # the front end's per-batch work, queued behind the host work already due
            self._host = add_work(advance(self._host, self._arrivals, now, self._host_cost_s), now,
                                  self._host_batch_s)
        r.batch = []
        r.busy_since_s = -1.0
        self._after_work(r, now)

    def _after_work(self, r: _Replica, now: float) -> None:
        q = r.queue
        if r.draining and (not q.items or self.cfg.shared_queue):
            self._retire(r, now)
            if q.items and self.cfg.shared_queue:
                self._dispatch(q, now)
            return
        q.idle.append(r)
        self._dispatch(q, now)

    # ---------------------------------------------------------------- continuous batching
    def _start_iterations(self, r: _Replica, now: float) -> None:
        cont = r.cont
        if cont is None:
            return
        q = r.queue
        before = len(q.items)
        _, expired = cont.admit(q.items, now, self._cut_s)
        self._depth -= before - len(q.items)
        self._expired += expired
        if cont.running == 0:
            q.idle.append(r)
            return
        r.busy_since_s = now
        end_s = cont.plan(now)
        self._push(end_s, _ITER, (r, cont.token))

    def _on_iterations(self, r: _Replica, token: int, now: float) -> None:
        cont = r.cont
        if cont is None or token != cont.token:
            return
        self._batches += cont.planned_iterations
        self._batch_items += cont.planned_iterations * cont.running
        cont.finish(now, self._lat, self._tokens, self._cut_s)
        self._busy_done_s += now - r.busy_since_s
        self._last_done_s = now
        r.busy_since_s = -1.0
        if r.draining and cont.running == 0 and (not r.queue.items or self.cfg.shared_queue):
            self._retire(r, now)
            return
        self._start_iterations(r, now)

    def _nudge_continuous(self, q: _Queue, now: float) -> None:
        """A new arrival: a replica with free slots stops its macro-step at the next iteration boundary."""
        for r in q.replicas:
            cont = r.cont
            if cont is not None and r.ready and r.busy_since_s >= 0 and cont.has_free_slot():
                end_s = cont.interrupt(now)
                if end_s is not None:
                    self._push(end_s, _ITER, (r, cont.token))
                return

    # ---------------------------------------------------------------- autoscaling
    def _tick(self, now: float, st: _ScaleState) -> None:
        cfg = self.cfg.autoscale
        if cfg is None:
            return
        busy_now = self._busy_done_s + sum(now - r.busy_since_s for r in self.replicas if r.busy_since_s >= 0)
        want = autoscale_step(st, cfg, now, busy_now, self._ready_count, self._depth)
        serving = self._serving()
        if want > len(serving):
            for _ in range(want - len(serving)):
                self._add_replica(now, now + self.cfg.cold_start_s)
        elif want < len(serving):
            victims = sorted(serving, key=lambda r: (r.ready, len(r.queue.items)))[: len(serving) - want]
            for r in victims:
                r.draining = True
                self._router.invalidate()
                if not r.ready and not r.queue.items:
                    r.retired = True
                elif r.busy_since_s < 0 and (not r.queue.items or self.cfg.shared_queue):
                    self._retire(r, now)

    # ---------------------------------------------------------------- main loop
    def run(self, arrivals_s: npt.NDArray[np.float64]) -> SimResult:
        """Simulate `arrivals_s` (sorted seconds from t = 0) until every admitted request is finished."""
        wall0 = time.perf_counter()
        cfg = self.cfg
        arrivals = arrivals_s.tolist()
        self._arrivals = arrivals
        for _ in range(cfg.replicas):
            self._add_replica(0.0, 0.0)
        n = len(arrivals)
        scale_state = _ScaleState(cfg.replicas)
        if cfg.autoscale is not None and n:
            self._push(cfg.autoscale_interval_s, _TICK, None)
        last_arrival_s = arrivals[-1] if n else 0.0
        heap = self._heap
        i = 0
        offered = 0
        queue_at_end = 0
        max_queue = cfg.max_queue
        timeout = cfg.timeout_s
        budget_s = cfg.latency_budget_s
        shared = cfg.shared_queue
        continuous = cfg.batching == "continuous"
        inf = math.inf
        cut = self._cut_s
        while True:
            next_arrival = arrivals[i] if i < n else inf
            if heap and heap[0][0] <= next_arrival:
                now, _, kind, payload = heapq.heappop(heap)
                self.clock.set(now)
                if kind == _DONE:
                    self._on_done(cast(_Replica, payload), now)
                elif kind == _WAKE:
                    wq, wtoken = cast(tuple[_Queue, int], payload)
                    if wtoken == wq.wake_token:
                        self._dispatch(wq, now)
                elif kind == _ITER:
                    ir, itoken = cast(tuple[_Replica, int], payload)
                    self._on_iterations(ir, itoken, now)
                elif kind == _READY:
                    self._make_ready(cast(_Replica, payload), now)
                elif kind == _TICK and now <= last_arrival_s + cfg.autoscale_interval_s:
                    self._tick(now, scale_state)
                    self._push(now + cfg.autoscale_interval_s, _TICK, None)
                continue
            if i >= n:
                break
            now = next_arrival
            i += 1
            scale_state.arrivals = i
            self.clock.set(now)
            if now >= cut:
                offered += 1
            q = self.queues[0] if shared else self._router.pick(self.replicas, now).queue
            if max_queue and len(q.items) >= max_queue:
                if now >= cut:
                    self._rejected += 1
                if i == n:
                    queue_at_end = self._depth
                continue
            expected_s = self._admitted(q, budget_s) if budget_s < inf else 0.0
            if expected_s is None:
                if now >= cut:
                    self._rejected += 1
                if i == n:
                    queue_at_end = self._depth
                continue
            q.load.arrivals.observe(now)
            q.items.append(QueuedItem(now, now + timeout, budget_s=budget_s, expected_s=expected_s))
            self._depth += 1
            if self._depth > self._max_depth:
                self._max_depth = self._depth
            if i == n:
                queue_at_end = self._depth
            if q.idle:
                self._dispatch(q, now)
            elif continuous:
                self._nudge_continuous(q, now)
        end = max(self._last_done_s, last_arrival_s)
        self._account_ready(end, 0)
        return build_result(Tally(offered=offered, completed_latencies_s=self._lat, rejected=self._rejected,
                                  expired=self._expired, wait_sum_s=self._wait_sum, batches=self._batches,
                                  batch_items=self._batch_items, busy_s=self._busy_done_s, ready_s=self._ready_s,
                                  max_queue_depth=self._max_depth, queue_at_end=queue_at_end),
                            self._tokens, first_s=next((a for a in arrivals if a >= self._cut_s), 0.0), end_s=end,
                            timeline=tuple(self._timeline), wall_s=time.perf_counter() - wall0)

def simulate(cfg: SimConfig, profile: ServiceProfile, arrivals_s: npt.NDArray[np.float64]) -> SimResult:
    """Convenience: ``Simulator(cfg, profile).run(arrivals_s)``."""
    return Simulator(cfg, profile).run(arrivals_s)
