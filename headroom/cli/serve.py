"""`headroom serve`: start the inference server (flags follow Triton's names)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

if TYPE_CHECKING:
    from headroom.server.app import Server


def _banner(server: Server) -> None:
    host, http, grpc = server.config.host, server.http_port, server.grpc_port
    scheme = "https" if server.config.tls is not None else "http"
    console = Console(stderr=True, soft_wrap=True)  # copy-paste examples must not be wrapped
    names = server.dataplane.model_names() + server.llm_model_names()
    console.print(f"[bold green]headroom is ready[/] — models: {', '.join(names) or '(none)'}")
    console.print(f"  HTTP  (KServe V2, OpenAI, /metrics)  {scheme}://{host}:{http}")
    if grpc >= 0:
        console.print(f"  gRPC  (inference.GRPCInferenceService)  {host}:{grpc}")
    console.print("  try:")
    console.print(f"    curl -s {scheme}://{host}:{http}/v2/health/ready")
    if "minilm" in names:
        console.print(f"    curl -s {scheme}://{host}:{http}/v1/embeddings -H 'content-type: application/json' "
                      "-d '{\"model\": \"minilm\", \"input\": [\"hello world\"]}'")
    if "digits" in names:
        console.print(f"    curl -s {scheme}://{host}:{http}/v2/models/digits")


def serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind HTTP and gRPC to (loopback by default)."),
    http_port: int = typer.Option(8000, help="HTTP port: KServe V2 REST, OpenAI API, /metrics. 0 = any free."),
    grpc_port: int = typer.Option(8001, help="gRPC port (inference.GRPCInferenceService). 0 = any free, -1 = off."),
    model_repository: Path = typer.Option(Path("models"), help="Directory of <model>/config.yaml + <version>/."),
    model: list[str] = typer.Option([], "--model", help="Serve only this model directory (repeatable)."),
    model_control_mode: str = typer.Option("none", help="Triton's model control: none (load every model at start; "
                                           "the repository load/unload API is refused), explicit (load "
                                           "--load-model at start; load/unload open) or poll (reload changed "
                                           "model directories every --repository-poll-secs)."),
    load_model: list[str] = typer.Option([], "--load-model", help="With --model-control-mode explicit: load this "
                                         "model at start (repeatable; '*' = all; none given = all)."),
    repository_poll_secs: float = typer.Option(15.0, min=0.1, help="With --model-control-mode poll: seconds "
                                               "between repository scans."),
    max_body_mb: float = typer.Option(64.0, help="Largest accepted request body in MiB (larger: 413)."),
    drain_timeout_s: float = typer.Option(30.0, help="On SIGTERM, how long to let in-flight requests finish."),
    log_level: str = typer.Option("info", help="Log level for headroom's JSON logs on stderr."),
    access_log: bool = typer.Option(True, help="One JSON log line per request."),
    gc_freeze: bool = typer.Option(True, help="Freeze the garbage collector's start-up heap once the models are "
                                   "loaded, so full collections skip it (each one otherwise paused the server "
                                   "~0.2 s about once a minute under load; pauses are in /metrics as "
                                   "headroom_gc_pause_seconds)."),
    api_keys_file: Path = typer.Option(None, help="Turn on API-key auth with this keys file "
                                       "(create keys with `headroom keys create`)."),
    rate_limit_rps: float = typer.Option(0.0, help="Per-tenant requests per second (0 = unlimited); 429 beyond."),
    rate_limit_burst: float = typer.Option(0.0, help="Per-tenant request burst (0 = one second's worth)."),
    llm_tokens_per_s: float = typer.Option(0.0, help="Per-tenant LLM tokens per second (0 = unlimited)."),
    llm_token_burst: float = typer.Option(0.0, help="Per-tenant LLM token burst."),
    body_timeout_s: float = typer.Option(30.0, help="A request body must arrive within this (slow clients: 408)."),
    headers_timeout_s: float = typer.Option(10.0, min=0.0, help="The request line and headers must arrive within "
                                            "this (slowloris: 408 and the connection closed; 0 = no deadline)."),
    cors_origin: list[str] = typer.Option([], "--cors-origin", help="Allow this browser origin (repeatable)."),
    trust_tenant_header: bool = typer.Option(False, help="Without --api-keys-file: take the tenant (prefix-cache "
                                             "isolation, rate limits, logs) from a router's x-headroom-tenant "
                                             "header. Only for replicas that no client can reach but the router "
                                             "(`route`/`serve --replicas` set it on their loopback replicas)."),
    tls_certfile: Path = typer.Option(None, help="PEM certificate chain: serve HTTPS and gRPC over TLS."),
    tls_keyfile: Path = typer.Option(None, help="PEM private key for --tls-certfile."),
    tls_client_ca_file: Path = typer.Option(None, help="PEM CA: require client certificates it signed (mTLS)."),
    trace_spans_file: Path = typer.Option(None, help="Write OpenTelemetry spans here as JSON lines."),
    precomputed: Path = typer.Option(None, help="SQLite predictions from `headroom batch`: answered from the store "
                                     "when every row is there, else the model runs (hit/miss in /metrics)."),
    model_memory_budget_mb: float = typer.Option(0.0, min=0.0, help="Load models on demand within this many MiB "
                                                 "(size = their files on disk) and evict the least recently used "
                                                 "idle ones; `pinned: true` in config.yaml keeps a model. "
                                                 "0 = load all at start."),
    drift_threshold_psi: float = typer.Option(0.2, help="Warn when a model's mean input PSI against its training "
                                              "reference (drift_reference.npz) exceeds this."),
    drift_sample_every: int = typer.Option(1, min=1, help="Feed every N-th request into the input-drift monitor."),
    cpus: str = typer.Option("", "--cpus", help="Pin the server (and its replicas) to these CPUs before models "
                             "load, as taskset -c: 0, 0-1, 0,2-3. Thread counts are per model: "
                             "runtime.intra_op_threads in config.yaml."),
    trusted_backends: str = typer.Option("onnxruntime,torch,llm", help="Model code this server may load, comma "
                                         "separated from onnxruntime, torch, llm, python (a model.py from the "
                                         "repository), pickle (allow_pickle: true); other models are refused at "
                                         "load. Whoever writes the repository runs this code: docs/SECURITY.md."),
    replicas: int = typer.Option(1, min=1, help="N > 1: a router (peak-EWMA, health checks, shedding) in front "
                                 "of N replica processes; see `headroom route` for every router option."),
) -> None:
    """Serve every model in the repository over KServe V2 (HTTP + gRPC) and the OpenAI API.

    The server answers liveness at once and readiness once every model is loaded and warmed up.
    """
    import dataclasses

    import uvloop  # ships with uvicorn[standard]

    if cpus:
        from headroom.profiling.affinity import pin_process

        try:
            pin_process(cpus)  # first: the runtimes' thread pools, created later, inherit it
        except ValueError as exc:
            Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {exc}")
            raise typer.Exit(code=2) from None

    from headroom.models.trust import parse_trusted

    try:
        trusted = parse_trusted(trusted_backends)
    except ValueError as exc:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(code=2) from None

    if replicas > 1:
        from headroom.gateway.app import gateway_setup as router_gateway
        from headroom.router import cli as router_cli
        from headroom.router.config import ProxyConfig
        from headroom.router.replicas import ReplicaManagerConfig

        err = Console(stderr=True, soft_wrap=True)
        if model_control_mode != "none":
            err.print("[bold red]error:[/] --model-control-mode explicit/poll with --replicas is not supported: a "
                      "load through the router would reach one replica; run one replica to manage models")
            raise typer.Exit(code=2)
        if tls_certfile is not None or tls_keyfile is not None:
            err.print("[bold red]error:[/] TLS with --replicas is not supported yet: terminate TLS in front of the "
                      "router (Envoy, nginx), or run one replica without --replicas")
            raise typer.Exit(code=2)
        try:  # the gateway (keys, tenant buckets, input limits) runs once, at the router, for the whole fleet
            gateway = router_gateway(api_keys_file, int(max_body_mb * 1024 * 1024), rate_limit_rps, rate_limit_burst,
                                     llm_tokens_per_s, llm_token_burst, cors_origin, body_timeout_s,
                                     headers_timeout_s=headers_timeout_s)
        except ValueError as exc:
            err.print(f"[bold red]error:[/] {exc}")
            raise typer.Exit(code=2) from None
        per_replica = ["--drift-threshold-psi", str(drift_threshold_psi), "--drift-sample-every",
                       str(drift_sample_every), "--trusted-backends", ",".join(sorted(trusted))]
        if model_memory_budget_mb > 0:
            per_replica += ["--model-memory-budget-mb", str(model_memory_budget_mb)]
        if precomputed is not None:
            per_replica += ["--precomputed", str(precomputed.resolve())]
        command = router_cli.serve_command(model_repository, model, drain_timeout_s, per_replica)
        uvloop.run(router_cli.run_cluster(command, replicas, ProxyConfig(), ReplicaManagerConfig(), host, http_port,
                                          grpc_port=grpc_port, gateway=gateway))
        return

    from headroom.gateway.app import exposure_warning, gateway_setup
    from headroom.gateway.context import install_log_context
    from headroom.gateway.tls import TlsConfig
    from headroom.lifecycle.drift import DriftConfig
    from headroom.lifecycle.drift_feed import DriftFeedConfig
    from headroom.server.app import Server, ServerConfig  # heavy imports: not at `headroom --help`
    from headroom.server.http_app import HttpLimits
    from headroom.server.logging import configure_logging

    configure_logging(log_level, access_log)
    install_log_context()
    max_body_bytes = int(max_body_mb * 1024 * 1024)
    try:
        setup = gateway_setup(api_keys_file, max_body_bytes, rate_limit_rps, rate_limit_burst, llm_tokens_per_s,
                              llm_token_burst, cors_origin, body_timeout_s,
                              headers_timeout_s=headers_timeout_s)
        # The data plane writes the per-request access line (server.app.Server keeps the gateway's quiet).
        setup = dataclasses.replace(setup, config=dataclasses.replace(setup.config,
                                                                      trust_tenant_header=trust_tenant_header))
        tls = None
        if tls_certfile is not None or tls_keyfile is not None:
            if tls_certfile is None or tls_keyfile is None:
                raise ValueError("TLS needs both --tls-certfile and --tls-keyfile")
            tls = TlsConfig(tls_certfile, tls_keyfile, tls_client_ca_file)
        warning = exposure_warning(host, setup, tls is not None)
        if warning:
            Console(stderr=True, soft_wrap=True).print(f"[bold yellow]warning:[/] {warning}")
        if model_control_mode not in ("none", "explicit", "poll"):
            raise ValueError(f"--model-control-mode must be none, explicit or poll, got {model_control_mode!r}")
        if load_model and model_control_mode != "explicit":
            raise ValueError("--load-model needs --model-control-mode explicit (as Triton)")
        config = ServerConfig(
            model_control_mode=model_control_mode, load_models=tuple(load_model) or ("*",),
            repository_poll_s=repository_poll_secs,
            model_repository=model_repository, host=host, http_port=http_port, grpc_port=grpc_port,
            models=tuple(model) or None, limits=HttpLimits(max_body_bytes=max_body_bytes),
            drain_timeout_s=drain_timeout_s, log_level=log_level, gateway=setup, tls=tls,
            trace_spans_file=trace_spans_file, precomputed=precomputed,
            model_memory_budget_bytes=int(model_memory_budget_mb * 2**20), freeze_gc_at_ready=gc_freeze,
            trusted_backends=trusted,
            drift=DriftFeedConfig(sample_every=drift_sample_every,
                                  monitor=DriftConfig(threshold_psi=drift_threshold_psi)),
        )
        server = Server(config)
        uvloop.run(server.run(on_ready=_banner))
    except ValueError as exc:  # configuration problems: say what to fix, no traceback
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(code=2) from None
    if server.exit_code:  # a background loop died (logged with its traceback): let a supervisor restart us
        raise typer.Exit(code=server.exit_code)
