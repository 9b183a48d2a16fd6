"""`headroom models list | add | pull | quality`: look after a model repository (no network).

    headroom models list                                  # the repository's models, sizes, pins, drift refs
    headroom models list --url http://127.0.0.1:8000      # + what a running server has loaded
    headroom models add mnist --onnx mnist.onnx           # config.yaml written from the ONNX graph
    headroom models add echo --python echo.py --input x:FP32:2 --output y:FP32:2
    headroom models pull digits                           # a packaged default, built here
    headroom models pull /path/to/model_dir --name other  # copy a model directory
    headroom models quality smollm2                       # an LLM's quality gate: native vs fp32 perplexity
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Manage the model repository: list its models, add one from an ONNX file or a Python "
                  "class, pull a packaged default or a local model directory, gate an LLM's quantised weights.",
                  no_args_is_help=True)

REPOSITORY_HELP = "Model repository directory (the one `headroom serve --model-repository` reads)."


def _fail(message: str) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=2)


def _server_states(url: str) -> dict[str, str]:
    """name -> "READY v1, v2" / "UNAVAILABLE: reason" from a running server's repository index."""
    import httpx

    try:
        response = httpx.post(url.rstrip("/") + "/v2/repository/index", timeout=10)
        response.raise_for_status()
        rows = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise _fail(f"cannot read the repository index from {url}: {exc}; is `headroom serve` running there?") \
            from None
    states: dict[str, list[str]] = {}
    for row in rows:
        state = str(row.get("state", ""))
        text = f"READY v{row['version']}" if state == "READY" and row.get("version") else state
        reason = str(row.get("reason") or "")
        if "not resident" in reason:
            text = "not resident (loads on demand)"
        elif state != "READY" and reason:
            text += f": {reason}"
        states.setdefault(str(row.get("name")), []).append(text)
    return {name: ", ".join(values) for name, values in states.items()}


def _weights(backend: str, parameters: Mapping[str, Any]) -> str:
    """An LLM's weight format as served ("gguf:Q4_1+Q8_0" native, "fp32" reference); "" for other backends."""
    if backend != "llm":
        return ""
    from headroom.llm.config import EngineConfig
    from headroom.llm.offline import DEFAULT_MODEL, describe_weights

    try:
        spec = str(parameters.get("model") or parameters.get("gguf") or DEFAULT_MODEL)
        return describe_weights(spec, EngineConfig.from_parameters(parameters))
    except ValueError as exc:
        return f"[red]{exc}[/]"


@app.command("list")
def list_models(
    model_repository: Path = typer.Option(Path("models"), help=REPOSITORY_HELP),
    url: str = typer.Option("", help="Also show each model's state on the server at this URL "
                            "(e.g. http://127.0.0.1:8000)."),
) -> None:
    """List the repository's models: backend, versions served / on disk, size on disk (the memory-budget
    estimate), pinned, drift reference, and with --url their state on a running server."""
    from headroom.lifecycle.scaffold import survey

    try:
        rows = survey(model_repository)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    states = _server_states(url) if url else {}
    table = Table(title=f"models in {model_repository}")
    for column in ("name", "backend", "weights", "versions", "MiB", "pinned", "drift ref"):
        table.add_column(column, justify="right" if column == "MiB" else "left")
    if url:
        table.add_column("server")
    for row in rows:
        if row.entry is None:
            cells = [row.name, "[red]invalid[/]", "", row.error, "", "", ""]
        else:
            cfg = row.entry.config
            versions = f"{','.join(map(str, row.entry.versions)) or '-'} of {len(row.entry.available_versions)}"
            cells = [row.name, cfg.backend, _weights(cfg.backend, cfg.parameters), versions,
                     f"{row.size_bytes / 2**20:.2f}", "yes" if cfg.pinned else "", "yes" if row.drift_reference else ""]
        if url:
            cells.append(states.get(row.name, "not served"))
        table.add_row(*cells)
    Console(soft_wrap=True).print(table if rows else f"no models in {model_repository}; try `headroom models "
                                  "pull digits`")


@app.command("add")
def add(
    name: str = typer.Argument(..., help="Model name: the directory created in the repository."),
    onnx: Path = typer.Option(None, "--onnx", help="An ONNX file: inputs/outputs are read from its graph."),
    python: str = typer.Option("", "--python", help="A Python file with one class that has predict() "
                               "(FILE.py or FILE.py:ClassName); needs --input and --output."),
    input_spec: list[str] = typer.Option([], "--input", help="Python models: an input as name:DATATYPE:dims, "
                                         "dims without the batch dimension, e.g. x:FP32:3,32,32 (repeatable)."),
    output_spec: list[str] = typer.Option([], "--output", help="Python models: an output, same format."),
    max_batch_size: int = typer.Option(-1, help="Largest batch (0 = the model does not batch). Default: 32 for "
                                       "ONNX graphs with a dynamic batch dimension, 8 for Python models."),
    version: int = typer.Option(1, min=0, help="Version directory to put the files in."),
    model_repository: Path = typer.Option(Path("models"), help=REPOSITORY_HELP),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing model directory."),
) -> None:
    """Scaffold a model directory (config.yaml + <version>/) from an ONNX file or a Python class."""
    from headroom.lifecycle.scaffold import add_onnx, add_python, parse_tensor_spec

    if (onnx is None) == (not python):
        raise _fail("give exactly one of --onnx FILE or --python FILE.py[:Class]")
    try:
        if onnx is not None:
            if not onnx.is_file():
                raise ValueError(f"{onnx} does not exist")
            path = add_onnx(model_repository, name, onnx, 32 if max_batch_size < 0 else max_batch_size, version,
                            force)
        else:
            file, _, class_name = python.partition(":")
            if not Path(file).is_file():
                raise ValueError(f"{file} does not exist")
            path = add_python(model_repository, name, Path(file), [parse_tensor_spec(s) for s in input_spec],
                              [parse_tensor_spec(s) for s in output_spec], class_name,
                              8 if max_batch_size < 0 else max_batch_size, version, force)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    console = Console(soft_wrap=True)
    console.print(f"[green]added[/] {name} -> {path}")
    console.print((path / "config.yaml").read_text().rstrip())
    console.print(f"serve it: headroom serve --model-repository {model_repository} --model {name}")


@app.command("pull")
def pull(
    source: str = typer.Argument(..., help="A packaged default (digits, minilm, noop) or a local model "
                                 "directory containing config.yaml."),
    name: str = typer.Option("", help="Name in the repository (default: the default's or directory's name)."),
    model_repository: Path = typer.Option(Path("models"), help=REPOSITORY_HELP),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing model directory."),
) -> None:
    """Install a model into the repository without network: copy a local model directory, or write a packaged
    default's config and build its artifacts (digits trains in ~15 s; minilm needs its weights package)."""
    from headroom.lifecycle.scaffold import pull as pull_model

    try:
        with Console(stderr=True).status(f"pulling {source}"):
            path, summary = pull_model(model_repository, source, name, force)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    Console(soft_wrap=True).print(f"[green]pulled[/] {source} -> {path} ({summary})")


@app.command("quality")
def quality(
    name: str = typer.Argument(..., help="An LLM of the repository (backend: llm), e.g. smollm2."),
    model_repository: Path = typer.Option(Path("models"), help=REPOSITORY_HELP),
    window_tokens: int = typer.Option(512, min=8, help="Tokens per teacher-forced window (llama-perplexity's -c)."),
    max_tokens: int = typer.Option(0, min=0, help="Score only the corpus's first this-many tokens (0 = all)."),
    num_threads: int = typer.Option(0, min=0, help="Threads per runner (0 = auto)."),
    llama_perplexity: Path = typer.Option(None, "--llama-perplexity", help="llama.cpp's llama-perplexity binary: "
                                          "also run it on the same GGUF and text, as the anchor."),
) -> None:
    """The quality gate of an LLM's native weights: perplexity of the native default and of the fp32 reference
    on the shipped held-out corpus, and their teacher-forced top-1 agreement. Passes when the native perplexity
    is within 1% of the reference's and >= 97% of the argmaxes agree; the result is written next to the model's
    cache (the server shows it at start and refuses a format that failed). Exit code 1 when it fails."""
    import json
    from dataclasses import asdict

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from headroom.llm.offline import DEFAULT_MODEL
    from headroom.llm.quality_run import QualityRun, run_quality
    from headroom.models.config import load_model_config

    try:
        cfg = load_model_config(model_repository / name)
    except (OSError, ValueError) as exc:
        raise _fail(f"{model_repository / name}: {exc}") from None
    if cfg.backend != "llm":
        raise _fail(f"{name} is a {cfg.backend} model; the quality gate is for LLMs (backend: llm)")
    params = cfg.parameters
    cache = params.get("cache_dir")
    run = QualityRun(
        model=str(params.get("model") or params.get("gguf") or DEFAULT_MODEL),
        cache_root=Path(str(cache)).expanduser() / "llm" if cache else None,
        window_tokens=window_tokens, max_tokens=max_tokens, num_threads=num_threads,
        llama_perplexity=llama_perplexity,
    )  # fmt: skip
    console = Console(soft_wrap=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as bars:

        def progress(label: str, total: int) -> Callable[[], None]:
            task = bars.add_task(f"{name} {label}", total=total)
            return lambda: bars.advance(task)

        try:
            result = run_quality(run, progress)
        except ValueError as exc:
            raise _fail(str(exc)) from None
    console.print_json(json.dumps(asdict(result)))
    anchor = f"; llama-perplexity {result.llama_perplexity:.4f}" if result.llama_perplexity is not None else ""
    console.print(f"{name} {result.weight_format}: {result.verdict}{anchor}")
    if not result.passed:
        raise typer.Exit(code=1)
