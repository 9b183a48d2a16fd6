"""A lean HTTP/1.1 load generator for the reliability suite: raw asyncio streams, keep-alive connections and one
pre-encoded request, so that the client, not the server, is never the bottleneck on a 2-core machine.

httpx spends ~1 ms of CPU per request; at 200 req/s next to the server that was most of a core, and the open loop
fell behind its own schedule (the overload scenario never finished). Here a request is one `write` of ready bytes
and a minimal parse of the answer (status line, Content-Length or chunked body): tens of microseconds.

`open_loop` sends at a constant rate whatever the answers (requests in flight pile up on more connections, up to
`max_connections`) and records, per request, its latency from the *intended* send time (no coordinated omission)
and the client's own lag from its schedule (`lag_s`: when it actually wrote the request). `closed_loop` measures
capacity with the same code. Every wait is bounded by `timeout_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from benchmarks.reliability.common import Outcome, percentile_ms

IDLE_REUSE_S = 2.0  # a kept-alive connection idle longer than this is closed, not reused (uvicorn drops them at 5 s)


def encode_post(url: str, body: bytes, content_type: str = "application/json") -> tuple[str, int, bytes]:
    """(host, port, the request's bytes) for a keep-alive POST of `body` to `url` (http only)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None or parts.port is None:
        raise ValueError(f"the lean client needs an http://host:port/ url, got {url!r}")
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    head = (f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return parts.hostname, parts.port, head.encode("ascii") + body


class _Conn:
    """One keep-alive connection; `exchange` writes a request and reads its whole answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since_s = time.monotonic()
        self.last_head = b""  # the last answer's status line and headers, lower-cased

    async def exchange(self, payload: bytes) -> tuple[int, bytes, bool]:
        """(status, body, keep-alive) of one request; the answer's head stays in `last_head`."""
        self.writer.write(payload)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        self.last_head = lower
        if b"\r\ntransfer-encoding: chunked" in lower:
            body = await self._chunked()
        else:
            at = lower.find(b"\r\ncontent-length:")
            if at < 0:
                raise ValueError("an answer without Content-Length or chunked encoding")
            end = lower.index(b"\r\n", at + 2)
            body = await self.reader.readexactly(int(lower[at + 17 : end]))
        return status, body, b"\r\nconnection: close" not in lower

    async def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    def close(self) -> None:
        self.writer.close()


class _Pool:
    """Idle keep-alive connections to one host, opened on demand."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[_Conn] = []
        self.opened = 0  # connections opened so far

    async def take(self) -> _Conn:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            if now - conn.idle_since_s <= IDLE_REUSE_S:
                return conn
            conn.close()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        self.opened += 1
        return _Conn(reader, writer)

    def give_back(self, conn: _Conn, keep_alive: bool) -> None:
        if keep_alive:
            conn.idle_since_s = time.monotonic()
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


def _header(head: bytes, name: bytes) -> str:
    """One header's value from a lower-cased answer head ('' when absent)."""
    at = head.find(b"\r\n" + name + b":")
    if at < 0:
        return ""
    start = at + len(name) + 3
    return head[start : head.index(b"\r\n", start)].decode("latin-1").strip()


_FAILURES = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError)


@dataclass(frozen=True, slots=True)
class LoadRun:
    """An open-loop run: every request's outcome and what the client itself cost."""

    outcomes: list[Outcome]
    wall_s: float  # first intended send to the last answer
    client_cpu_s: float  # this process's CPU time over the run
    connections_opened: int

    def lag_summary(self) -> dict[str, float | None]:
        """The client's lag from its schedule (ms) and its CPU share: is the client keeping up?"""
        lags = [o.lag_s for o in self.outcomes]
        return {"client_lag_p50_ms": percentile_ms(lags, 0.5), "client_lag_p99_ms": percentile_ms(lags, 0.99),
                "client_lag_max_ms": max(lags) * 1e3 if lags else None,
                "client_cpu_share": self.client_cpu_s / self.wall_s if self.wall_s > 0 else None}


async def open_loop(url: str, body: bytes, rate_per_s: float, duration_s: float, timeout_s: float = 30.0,
                    max_connections: int = 512) -> LoadRun:
    """POST `body` to `url` at `rate_per_s` for `duration_s` (an open loop); every request is bounded by
    `timeout_s`, so the run ends by duration_s + timeout_s."""
    host, port, payload = encode_post(url, body)
    pool = _Pool(host, port)
    slots = asyncio.Semaphore(max_connections)
    loop = asyncio.get_running_loop()
    n = int(rate_per_s * duration_s)
    outcomes: list[Outcome | None] = [None] * n
    t0 = loop.time() + 0.05
    cpu0 = time.process_time()

    async def one(i: int, intended: float) -> None:
        async with slots:
            sent = max(intended, loop.time() - t0)  # a timer may fire a clock tick early
            conn: _Conn | None = None
            try:
                async with asyncio.timeout(timeout_s):
                    conn = await pool.take()
                    status, answer, keep = await conn.exchange(payload)
            except _FAILURES as exc:
                if conn is not None:
                    conn.close()
                outcomes[i] = Outcome(intended, loop.time() - t0 - intended, 0, type(exc).__name__, sent - intended)
                return
            pool.give_back(conn, keep)
            why = "" if status == 200 else answer[:400].decode("utf-8", "replace")
            outcomes[i] = Outcome(intended, loop.time() - t0 - intended, status, why, sent - intended,
                                  _header(conn.last_head, b"server-timing"))

    # Only the requests still in flight are held: gathering every task at the end walked ~17,000 of them in one
    # go and held the last answers ~50 ms on the client's loop (they showed as the run's slowest 1%). The
    # collector is off for the run: a full collection over that many objects stalled the loop for tens of ms.
    pending: set[asyncio.Task[None]] = set()
    collecting = gc.isenabled()
    gc.disable()
    try:
        for i in range(n):
            intended = i / rate_per_s
            delay = t0 + intended - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = loop.create_task(one(i, intended))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.wait(set(pending))
    finally:
        for task in list(pending):
            task.cancel()
        pool.close()
        if collecting:
            gc.enable()
    done = [o for o in outcomes if o is not None]
    return LoadRun(done, loop.time() - t0, time.process_time() - cpu0, pool.opened)


async def closed_loop(url: str, body: bytes, seconds: float, concurrency: int = 8, timeout_s: float = 30.0) -> float:
    """`concurrency` connections sending back to back for `seconds`: answers 200 per second (the capacity)."""
    statuses, wall_s = await closed_loop_statuses(url, body, seconds, concurrency, timeout_s)
    return statuses.get(200, 0) / wall_s


async def closed_loop_statuses(url: str, body: bytes, seconds: float, concurrency: int = 8,
                               timeout_s: float = 30.0) -> tuple[dict[int, int], float]:
    """`concurrency` connections, each sending its next request the moment the previous one is answered, whatever
    the answer (a 503 too: a retry loop without backoff) for `seconds`: answers per status, and the wall time."""
    host, port, payload = encode_post(url, body)
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        conn = _Conn(reader, writer)
        try:
            while time.monotonic() < deadline:
                async with asyncio.timeout(timeout_s):
                    status, _, keep = await conn.exchange(payload)
                statuses[status] = statuses.get(status, 0) + 1
                if not keep:
                    conn.close()
                    reader, writer = await asyncio.open_connection(host, port)
                    conn = _Conn(reader, writer)
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses, time.monotonic() - t0
