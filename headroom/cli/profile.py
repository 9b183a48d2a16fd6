"""`headroom profile MODEL`: service time by batch size on this machine, as a profile for plan/sim; with
`--runtimes eager,compile,onnx`, the same model under each runtime side by side (the textbook's runtime table).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from headroom.profiling.affinity import available_cpus
from headroom.profiling.measure import (
    BatchTiming,
    default_batch_sizes,
    peak_rss_bytes,
    profile_document,
    profile_model,
)

if TYPE_CHECKING:
    from headroom.models.repository import ModelEntry, ModelRepository
    from headroom.profiling.runtimes import RuntimeProfile


def profile(
    model: str = typer.Argument(..., help="Model directory name in the repository (e.g. minilm, digits)."),
    model_repository: Path = typer.Option(Path("models"), help="Model repository directory."),
    batch_size: list[int] = typer.Option([], "--batch-size", help="Batch sizes to measure (repeatable); "
                                         "default 1, 2, 4, ... up to max_batch_size."),
    batch_sizes: str = typer.Option("", "--batch-sizes", help="The same as a comma list, e.g. 1,8,32."),
    repeats: int = typer.Option(20, min=1, help="Timed predict calls per batch size."),
    output: Path = typer.Option(None, "--output", "-o", help="Write the JSON here (default: print it)."),
    runtimes: str = typer.Option("", "--runtimes", help="Compare runtimes instead: a comma list of eager "
                                 "(PyTorch), compile (torch.compile; the first compile takes a while, later "
                                 "loads reuse the cached artifacts), onnx (ONNX Runtime)."),
    threads: int = typer.Option(-1, "--threads", help="--runtimes: intra-op threads for every runtime "
                                "(default: the model config's; 0 = each runtime decides)."),
    cache_dir: str = typer.Option("", "--cache-dir", help="--runtimes: root of the compiled-artifact caches "
                                  "(default: the config's runtime.cache_dir, $HEADROOM_CACHE_DIR or "
                                  "~/.cache/headroom)."),
    as_json: bool = typer.Option(False, "--json", help="--runtimes: also print the comparison as JSON on stdout."),
    cache_artifacts: bool = typer.Option(True, help="--runtimes: cache ONNX Runtime's optimized graph and "
                                         "torch.compile's artifacts (run twice to see the cached load time)."),
) -> None:
    """Measure how long one batched model call takes at each batch size, and write a service-time profile.

    The profile feeds `headroom plan ... --from-profile` and `headroom sim --profile`. Only the model call is
    timed (preprocessing is per request and overlaps batches in the server).

    With --runtimes the model is loaded once per runtime (cold start timed, compilation included) and a table
    of p50/p99 latency, throughput and speed-up over eager by batch size is printed, e.g.
    `headroom profile digits --runtimes eager,compile,onnx --batch-sizes 1,8,32`.
    """
    from headroom.models.repository import ModelRepository  # heavy (torch): not at `headroom --help`

    console = Console(stderr=True)
    repo = ModelRepository(model_repository)
    try:
        index = repo.scan([model])
        sizes = _sizes(batch_size, batch_sizes)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(code=2) from None
    if not index.models:
        console.print(f"[red]error:[/] {model!r} is not a tensor model (LLM profiling: see docs/llm.md)")
        raise typer.Exit(code=2)
    entry = index.models[0]
    if runtimes:
        _compare_runtimes(console, repo, entry, runtimes, sizes or (1, 8, 32), repeats, threads, cache_dir,
                          output, as_json, cache_artifacts)
        return
    with console.status(f"loading {model} ..."):
        loaded = repo.load_version(entry, entry.versions[-1])
    sizes = sizes or default_batch_sizes(entry.config.max_batch_size)
    table = Table(title=f"{model} v{loaded.version}: predict time by batch size ({repeats} repeats)")
    for col in ("batch", "mean ms", "p50 ms", "p99 ms", "items/s", "cv"):
        table.add_column(col, justify="right")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("measuring", total=len(sizes))

        def done(t: BatchTiming) -> None:
            progress.advance(task)
            table.add_row(str(t.batch_size), f"{t.mean_ms:.2f}", f"{t.percentile_ms(50):.2f}",
                          f"{t.percentile_ms(99):.2f}", f"{t.batch_size / (t.mean_ms / 1e3):.0f}", f"{t.cv:.3f}")

        timings = profile_model(loaded.model, sizes, repeats, done)
    loaded.unload()
    console.print(table)
    shape = {"cpus": len(available_cpus()), "peak_rss_bytes": peak_rss_bytes()}  # what the times hold for
    doc = json.dumps(profile_document(model, timings, repeats, **shape), indent=2)
    if output is None:
        typer.echo(doc)
    else:
        output.write_text(doc + "\n")
        console.print(f"profile written to {output}")


def _sizes(repeated: list[int], spec: str) -> tuple[int, ...]:
    from headroom.profiling.runtimes import parse_batch_sizes

    sizes = tuple(repeated) + (parse_batch_sizes(spec) if spec else ())
    if any(s < 1 for s in sizes):
        raise ValueError("--batch-size: every size must be >= 1")
    return tuple(dict.fromkeys(sizes))


def _compare_runtimes(console: Console, repo: ModelRepository, entry: ModelEntry, spec: str,
                      sizes: tuple[int, ...], repeats: int, threads: int, cache_dir: str, output: Path | None,
                      as_json: bool, cache_artifacts: bool) -> None:
    from headroom.profiling.runtimes import configured_threads, parse_runtimes, profile_runtimes, runtimes_document

    try:
        names = parse_runtimes(spec)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(code=2) from None
    threads = configured_threads(entry.config) if threads < 0 else threads
    version = entry.versions[-1]
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"loading {entry.name} ({names[0]})", total=len(names) * (1 + len(sizes)))

        def done(runtime: str, timing: BatchTiming | None) -> None:
            progress.advance(task)
            what = "loaded" if timing is None else f"batch {timing.batch_size} done"
            progress.update(task, description=f"{entry.name} {runtime}: {what}")

        try:
            profiles = profile_runtimes(repo, entry, version, names, sizes, repeats, threads, cache_dir, done,
                                        cache_artifacts)
        except ValueError as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(code=2) from None
    console.print(runtimes_table(entry.name, version, profiles, repeats))
    doc = runtimes_document(entry.name, version, profiles, repeats, repo.root)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"comparison written to {output}")
    if as_json:
        typer.echo(json.dumps(doc, indent=2))


def runtimes_table(model: str, version: int, profiles: list[RuntimeProfile], repeats: int) -> Table:
    """Runtime x batch size: p50/p99 latency, throughput, speed-up over eager, load time, notes."""
    from headroom.profiling.runtimes import NOTES, speedups

    threads = profiles[0].threads if profiles else 0
    table = Table(title=f"{model} v{version}: runtime comparison on this machine "
                        f"({repeats} repeats per batch, {threads or 'default'} intra-op threads)")
    for col in ("runtime", "batch", "p50 ms", "p99 ms", "items/s", "speed-up", "load s", "notes"):
        table.add_column(col, justify="left" if col in ("runtime", "notes") else "right")
    ups = speedups(profiles)
    for p in profiles:
        load_s = sum(s.duration_s for s in p.cold_start)
        cache = f" [dim](artifact cache: {p.cache})[/]" if p.cache and p.cache != "off" else ""
        for i, t in enumerate(p.timings):
            up = ups.get((p.runtime, t.batch_size))
            table.add_row(
                p.runtime if i == 0 else "", str(t.batch_size), f"{t.percentile_ms(50):.3f}",
                f"{t.percentile_ms(99):.3f}", f"{t.batch_size / (t.mean_ms / 1e3):,.0f}",
                f"{up:.2f}x" if up is not None else "-", f"{load_s:.2f}" if i == 0 else "",
                (NOTES[p.runtime] + cache) if i == 0 else "",
            )
        table.add_section()
    return table
