"""HTTP over httpx: several small pooled `httpx.AsyncClient`s (`max_connections` in all)."""

from __future__ import annotations

import ssl

import httpx

from headroom.core.clock import Clock
from headroom.loadgen.clients import ClientConfig, HttpClient, SseCollector, encode_request, is_streamed, unary_reply
from headroom.loadgen.records import ClientReply
from headroom.loadgen.workloads import Sample

SHARD_CONNECTIONS = 8  # connections per httpx pool: httpcore's pool does O(requests x connections) work


class _ShardedPool:
    """Several small httpx pools instead of one big one; each request goes to the least-loaded pool.

    One `httpx.AsyncClient` with hundreds of connections and requests spends most of its CPU matching
    requests to connections (quadratic), which would make the generator itself the bottleneck. Pools of
    `SHARD_CONNECTIONS` keep that cost flat; pools are created only when the existing ones are full.
    """

    def __init__(self, timeout_s: float, max_connections: int) -> None:
        self._timeout = httpx.Timeout(timeout_s)
        self._per_shard = min(SHARD_CONNECTIONS, max_connections)
        self._max_shards = -(-max_connections // self._per_shard)
        self._shards: list[httpx.AsyncClient] = []
        self._load: list[int] = []
        self._ssl: ssl.SSLContext | None = None

    def acquire(self) -> tuple[int, httpx.AsyncClient]:
        best = min(range(len(self._load)), key=self._load.__getitem__, default=-1)
        if best < 0 or (self._load[best] >= self._per_shard and len(self._shards) < self._max_shards):
            limits = httpx.Limits(max_connections=self._per_shard, max_keepalive_connections=self._per_shard)
            if self._ssl is None:  # one TLS context for every pool: building one costs ~0.1 s of CPU
                self._ssl = ssl.create_default_context()
            self._shards.append(httpx.AsyncClient(timeout=self._timeout, limits=limits, verify=self._ssl))
            self._load.append(0)
            best = len(self._shards) - 1
        self._load[best] += 1
        return best, self._shards[best]

    def release(self, index: int) -> None:
        self._load[index] -= 1

    async def aclose(self) -> None:
        for shard in self._shards:
            await shard.aclose()
        self._shards.clear()
        self._load.clear()


class HttpxClient(HttpClient):
    """Every HTTP protocol (all but v2-grpc) over pooled httpx.AsyncClients."""

    def __init__(self, config: ClientConfig, clock: Clock) -> None:
        super().__init__(config, clock)
        self._pool = _ShardedPool(config.timeout_s, config.max_connections)

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def send(self, sample: Sample) -> ClientReply:
        shard, http = self._pool.acquire()
        sent_s = self._clock.now_s()
        try:
            body, headers = encode_request(self._config, sample)
            if is_streamed(self._config):
                return await self._send_stream(http, body, headers, sent_s)
            resp = await http.post(self._target, content=body, headers=headers)
            return unary_reply(
                self._config,
                resp.status_code,
                sent_s,
                self._clock.now_s(),
                resp.headers.get_list("server-timing"),
                resp.content,
            )
        except httpx.TimeoutException as exc:
            return self._failure("timeout", sent_s, f"timed out: {exc!r}")
        except httpx.ConnectError as exc:
            return self._failure("connect_error", sent_s, f"cannot connect: {exc!r}")
        except (httpx.HTTPError, ValueError) as exc:
            return self._failure("error", sent_s, repr(exc))
        finally:
            self._pool.release(shard)

    async def _send_stream(
        self, http: httpx.AsyncClient, body: bytes, headers: dict[str, str], sent_s: float
    ) -> ClientReply:
        sse = SseCollector(self._config.protocol)
        async with http.stream("POST", self._target, content=body, headers=headers) as resp:
            timing = resp.headers.get_list("server-timing")
            if resp.status_code // 100 != 2:
                text = await resp.aread()
                return unary_reply(self._config, resp.status_code, sent_s, self._clock.now_s(), timing, text)
            async for line in resp.aiter_lines():
                if sse.feed(line, self._clock.now_s()):
                    break
        return sse.reply(sent_s, self._clock.now_s(), timing)
