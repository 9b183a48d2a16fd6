"""The Ray side of Ray-actor replicas: connecting to (or starting) a cluster, the argv of one replica, and the
actor body (`ReplicaProcess`) that owns one `headroom serve` process on the node Ray placed it on.

`headroom.router.ray_replicas.RayReplicaManager` drives these actors from the router's event loop. Ray is
imported lazily (only inside functions), so headroom works without it; install the `dev` extra. The replica
process dies with its actor (Linux `PR_SET_PDEATHSIG`), so `ray.kill` never leaves it orphaned.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from headroom.router.replicas import free_port

log = logging.getLogger("headroom.ray_replicas")

#: (bind host, HTTP port, gRPC port or -1 when the manager runs replicas without gRPC) -> argv; runs ON the
#: replica's node (inside its actor), so `sys.executable` and paths are that node's.
RayCommandFactory = Callable[[str, int, int], Sequence[str]]
#: Ray reads this at import: "0" keeps a local cluster on 127.0.0.1 instead of the machine's network address.
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@dataclass(frozen=True, slots=True)
class RayClusterConfig:
    """Which Ray cluster to use: an existing one by address, or a local one started in this process."""

    address: str | None = None  # "auto", "HOST:6379" or "ray://HOST:10001"; None = start a local cluster
    num_cpus: int = 2  # CPUs a local cluster offers (ignored when connecting to an existing one)
    namespace: str = "headroom"  # Ray namespace the replica actors live in
    object_store_memory_bytes: int = 80 * 1024 * 1024  # local cluster only: replicas pass nothing through it
    loopback_only: bool = True  # local cluster only: bind Ray itself to 127.0.0.1 (set before Ray's import)


def connect_ray(cluster: RayClusterConfig | None = None) -> None:
    """Connect to (or start) the Ray cluster; blocking (seconds), so call it before the event loop or in a
    thread. A no-op when Ray is already initialised in this process."""
    cluster = cluster or RayClusterConfig()
    if cluster.address is None and cluster.loopback_only:
        if "ray" in sys.modules and os.environ.get(_LOOPBACK_ENV) != "0":
            log.warning("ray was imported before connect_ray(); the local cluster may bind a network address")
        os.environ.setdefault(_LOOPBACK_ENV, "0")
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("the Ray backend needs ray: pip install -c constraints.txt ray==2.60.0 "
                           "(it is in headroom's dev extra)") from exc
    if ray.is_initialized():
        return
    if cluster.address is not None:
        ray.init(address=cluster.address, namespace=cluster.namespace, log_to_driver=False)
    else:
        # address="local": always a new cluster; None would join the last cluster started on this machine
        # (another process's `ray start` or `ray.cluster_utils.Cluster`), where num_cpus is refused
        # _node_ip_address: a single-machine cluster binds loopback (its replicas are reached on 127.0.0.1)
        ray.init(address="local", num_cpus=cluster.num_cpus, include_dashboard=False, log_to_driver=False,
                 namespace=cluster.namespace, object_store_memory=cluster.object_store_memory_bytes,
                 _node_ip_address="127.0.0.1")


def shutdown_ray() -> None:
    """Disconnect (and stop a local cluster started by `connect_ray`)."""
    import ray
    ray.shutdown()


def ray_serve_command(model_repository: Path, models: Sequence[str], drain_timeout_s: float,
                      extra_args: Sequence[str] = ()) -> RayCommandFactory:
    """argv for one `headroom serve` replica bound to (host, HTTP port, gRPC port or -1) on its node; the model
    repository path must exist on every node that may host a replica (a shared volume or the same image)."""
    def command(host: str, port: int, grpc_port: int) -> Sequence[str]:
        argv = [sys.executable, "-m", "headroom.cli.main", "serve", "--host", host, "--http-port", str(port),
                "--grpc-port", str(grpc_port), "--model-repository", str(model_repository),
                "--drain-timeout-s", str(drain_timeout_s), "--no-access-log"]
        for m in models:
            argv += ["--model", m]
        return [*argv, *extra_args]
    return command


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL it when the actor process dies (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


class ReplicaProcess:
    """The Ray actor body: owns one `headroom serve` process on the node it was placed on."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = Path(tempfile.mkdtemp(prefix="headroom-ray-replica-")) / "replica.log"

    def node_ip(self) -> str:
        import ray
        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]  # untyped in Ray

    def node(self) -> tuple[str, str]:
        """(IP, Ray node id) of the node this actor was placed on."""
        import ray
        return self.node_ip(), str(ray.get_runtime_context().get_node_id())

    def spawn(self, command: RayCommandFactory, host: str | None, grpc: bool) -> tuple[str, int, int, int]:
        """Pick free ports on this node, start the process; returns (host, HTTP port, gRPC port, pid)."""
        if self._proc is not None:
            raise RuntimeError("this replica actor already runs a process")
        bind = host or self.node_ip()
        port = free_port(bind)
        grpc_port = free_port(bind) if grpc else -1
        with self._log_path.open("wb") as log_file:
            self._proc = subprocess.Popen(list(command(bind, port, grpc_port)), stdout=log_file, stderr=log_file,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          preexec_fn=_die_with_parent)
        return bind, port, grpc_port, self._proc.pid

    def poll(self) -> int | None:
        """The process's exit code, or None while it runs."""
        return None if self._proc is None else self._proc.poll()

    def send_signal(self, signum: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signum)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

