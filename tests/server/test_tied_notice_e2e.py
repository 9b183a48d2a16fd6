"""A real `headroom serve` tells the router when a tied copy starts executing (headroom.server.tied): one
`POST /router/tied/<tag>` to the connection's peer on the port the copy names, sent when the batch starts
(while the model still runs), never for an untagged request or a malformed tag or port."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.server.conftest import seen_tags
from tests.support.server import RunningServer
from tests.support.waiting import until


class NoticeListener:
    """A stand-in for the router's notice endpoint: records (path, monotonic time) of each POST."""

    def __init__(self) -> None:
        self.notices: list[tuple[str, float]] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> NoticeListener:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, path = head.split(b" ")[:2]
        self.notices.append((f"{method.decode()} {path.decode()}", time.monotonic()))
        writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()


def _slow(delay_ms: float, tag: int) -> dict[str, object]:
    return {"inputs": [{"name": "delay_ms", "datatype": "FP32", "shape": [1, 1], "data": [delay_ms]},
                       {"name": "tag", "datatype": "INT64", "shape": [1, 1], "data": [tag]}]}


async def test_a_tied_copy_notifies_its_router_when_its_batch_starts(server: RunningServer, test_repo: Path) -> None:
    async with NoticeListener() as router, httpx.AsyncClient(base_url=server.url, timeout=30.0) as client:
        headers = {"x-headroom-tied": "Tok3n_abc-12.1", "x-headroom-tied-port": str(router.port)}
        r = await client.post("/v2/models/slow/infer", json=_slow(600.0, 71001), headers=headers)
        answered = time.monotonic()
        assert r.status_code == 200, r.text
        assert [p for p, _ in router.notices] == ["POST /router/tied/Tok3n_abc-12.1"]
        # sent as the batch started, not when it finished: the model still had most of its 600 ms to run
        assert answered - router.notices[0][1] > 0.3
    assert 71001 in seen_tags(test_repo)


async def test_untagged_or_malformed_copies_send_no_notice(server: RunningServer) -> None:
    async with NoticeListener() as router, httpx.AsyncClient(base_url=server.url, timeout=30.0) as client:
        port = str(router.port)
        bad = [{},  # not tied
               {"x-headroom-tied": "Tok3n_abc-12.1"},  # no port
               {"x-headroom-tied-port": port},  # no tag
               {"x-headroom-tied": "short.1", "x-headroom-tied-port": port},  # token too short
               {"x-headroom-tied": "Tok3n_abc-12.2", "x-headroom-tied-port": port},  # copy is 0 or 1
               {"x-headroom-tied": "Tok3n/../x12.0", "x-headroom-tied-port": port},  # not url-safe
               {"x-headroom-tied": "Tok3n_abc-12.0", "x-headroom-tied-port": "0"},
               {"x-headroom-tied": "Tok3n_abc-12.0", "x-headroom-tied-port": "65536"},
               {"x-headroom-tied": "Tok3n_abc-12.0", "x-headroom-tied-port": "-1"},
               {"x-headroom-tied": "Tok3n_abc-12.0", "x-headroom-tied-port": f"{port}0"}]
        for i, headers in enumerate(bad):
            r = await client.post("/v2/models/slow/infer", json=_slow(1.0, 72000 + i), headers=headers)
            assert r.status_code == 200, (headers, r.text)  # a bad tag is ignored, never an error
        # a well-formed one last: its notice shows that notices were being delivered all along
        good = {"x-headroom-tied": "Tok3n_abc-12.0", "x-headroom-tied-port": port}
        assert (await client.post("/v2/models/slow/infer", json=_slow(1.0, 72100), headers=good)).status_code == 200
        await until(lambda: bool(router.notices), "the notice")
        assert [p for p, _ in router.notices] == ["POST /router/tied/Tok3n_abc-12.0"]
