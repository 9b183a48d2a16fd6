"""Serve FakeDataPlane over gRPC in its own process (tritonclient's protobuf modules stay out of it).

    cd tests && python -m protocol.grpc_fake_server   # binds 127.0.0.1 on a free port, prints "PORT <n>"

Stops when stdin closes (the test's end of the pipe) or on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from headroom.protocol.grpc_service import bind_grpc_server, stop_grpc_server

from .fake_dataplane import FakeDataPlane


async def main() -> None:
    server, port = await bind_grpc_server(FakeDataPlane(), "127.0.0.1", 0)
    print(f"PORT {port}", flush=True)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, done.set)
    stdin = sys.stdin.fileno()
    loop.add_reader(stdin, lambda: None if os.read(stdin, 4096) else done.set())
    await done.wait()
    await stop_grpc_server(server, grace_s=1.0)


if __name__ == "__main__":
    asyncio.run(main())
