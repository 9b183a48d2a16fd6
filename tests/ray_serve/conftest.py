"""A real local Ray cluster (127.0.0.1, 2 CPUs, no dashboard) with Serve's HTTP proxy on a free port, per test
module, and `deploy` to (re)deploy headroom's application on it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headroom.ray_serve.app import AppArgs, build_app, grpc_options
from headroom.router.ray_cluster import RayClusterConfig, connect_ray, shutdown_ray

APP = "headroom"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def serve_addresses() -> Iterator[tuple[str, str]]:
    """(Serve's HTTP URL, its gRPC proxy's host:port, serving KServe V2 gRPC)."""
    connect_ray(RayClusterConfig(num_cpus=2))  # a local cluster bound to 127.0.0.1, no dashboard
    from ray import serve

    port, grpc_port = _free_port(), _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port},
                grpc_options=grpc_options(grpc_port))
    try:
        yield f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]  # untyped in Ray
        shutdown_ray()


@pytest.fixture(scope="module")
def serve_url(serve_addresses: tuple[str, str]) -> str:
    return serve_addresses[0]


def deploy(repo: Path, **args: Any) -> None:
    """(Re)deploy the application; returns once Serve reports every replica ready."""
    from ray import serve

    base = {"model_repository": str(repo), "replica_num_cpus": 0.25, "ingress_num_cpus": 0.25}
    serve.run(build_app(AppArgs.model_validate({**base, **args})), name=APP, route_prefix="/")
