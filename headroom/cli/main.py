"""`headroom` entry point. Each subcommand lives in its own module; this file only wires them.

Subcommand modules are imported when their command is looked up, not at start-up: `headroom serve` does not pay
for the load generator, the router or the planner (about 0.7 s of imports on a 2-core machine, a quarter of the
LLM's cold start). `headroom --help` still lists every command (it imports them all to read their help).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperGroup


@dataclass(frozen=True, slots=True)
class Subcommand:
    """Where one subcommand is defined."""

    module: str  # module to import when the command is used
    attribute: str  # a command function, or a typer.Typer holding a group of commands
    group: bool  # True: `attribute` is a typer.Typer (`headroom bench run`, ...); False: one function


SUBCOMMANDS: dict[str, Subcommand] = {
    "serve": Subcommand("headroom.cli.serve", "serve", False),
    "build-models": Subcommand("headroom.cli.build_models", "build_models", False),
    "profile": Subcommand("headroom.cli.profile", "profile", False),
    "models": Subcommand("headroom.cli.models", "app", True),
    "bench": Subcommand("headroom.cli.bench", "app", True),
    "plan": Subcommand("headroom.cli.plan", "app", True),
    "sim": Subcommand("headroom.cli.sim", "app", True),
    "keys": Subcommand("headroom.gateway.keys_cli", "app", True),
    "route": Subcommand("headroom.router.cli", "route", False),
    "route-ray": Subcommand("headroom.router.ray_cli", "route_ray", False),
    "batch": Subcommand("headroom.lifecycle.batch_cli", "batch", False),
    "deploy": Subcommand("headroom.cli.deploy", "app", True),
    "rollout": Subcommand("headroom.cli.rollout", "app", True),
}


#: top-level module -> the extra that installs it (`pip install 'headroom[EXTRA]'`)
OPTIONAL_MODULES: dict[str, str] = {
    "matplotlib": "bench",
    "hdrh": "bench",
    "tritonclient": "bench",
    "aiohttp": "bench",
    "plotly": "bench",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The extra whose absence raised `exc`, or None when the missing module is not an optional one."""
    top = (exc.name or "").split(".")[0]
    return OPTIONAL_MODULES.get(top)


def unavailable_command(name: str, extra: str, module: str) -> Any:
    """A stand-in for a subcommand whose optional dependencies are not installed: `--help` lists it, running it
    says how to install them (exit 2) instead of a traceback."""
    fix = f"pip install 'headroom[{extra}]'  (make serve / make test install it)"

    def run() -> None:
        typer.echo(f"headroom {name} needs the optional dependency {module!r}: {fix}", err=True)
        raise typer.Exit(2)

    holder = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    holder.command(
        name,
        help=escape(f"Not installed: needs the '{extra}' extra. {fix}"),
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )(run)
    command = typer.main.get_command(holder)
    command.name = name
    return command


def load_subcommand(name: str) -> Any:
    """The click command behind `headroom NAME` (imports its module; a stand-in that names the missing extra when
    the module needs an optional dependency that is not installed)."""
    spec = SUBCOMMANDS[name]
    try:
        module = importlib.import_module(spec.module)
    except ModuleNotFoundError as exc:
        extra = missing_extra(exc)
        if extra is None:
            raise
        return unavailable_command(name, extra, (exc.name or "?").split(".")[0])
    target = getattr(module, spec.attribute)
    if not spec.group:
        holder = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        holder.command(name)(target)
        target = holder
    command = typer.main.get_command(target)
    command.name = name
    return command


class LazyCommands(TyperGroup):
    """A typer group whose subcommands are imported on first lookup."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in SUBCOMMANDS:
            self.commands[cmd_name] = load_subcommand(cmd_name)
        return self.commands.get(cmd_name)


app = typer.Typer(
    name="headroom",
    cls=LazyCommands,
    help="Serve models within their latency SLOs, load-test them, and plan the hardware a load needs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Serve models within their latency SLOs, load-test them, and plan the hardware a load needs."""


#: OpenMP barriers spin briefly, then sleep. The LLM step meets at ~150 barriers per decode step: with pure
#: sleeping barriers (PASSIVE alone) each is a futex wake-up and a 2-thread batch-1 step took 10.4 ms on a quiet
#: 2-core Xeon; with a bounded spin of 20,000 rounds first it took 5.9 ms (one-stream TPOT served 10.8 -> 6.2-8.1
#: ms). Unbounded spinning (libgomp's ACTIVE) collapsed a loaded 2-core box (818 ms per step); under a 2-process
#: CPU hog the bounded spin costs ~0-5% with the thread tuner (num_threads: 0), which then drops to 1 thread
#: (docs/native_kernels.md, "Barriers"). Read when libgomp loads, so it is set before any subcommand is
#: imported; a value the user exported wins (GOMP_SPINCOUNT=0: sleep at once).
OPENMP_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "20000"}


def main() -> None:
    for key, value in OPENMP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        app()
    except ModuleNotFoundError as exc:  # an optional dependency imported when a feature is used (plots, reports)
        extra = missing_extra(exc)
        if extra is None:
            raise
        top = (exc.name or "?").split(".")[0]
        typer.echo(f"this needs the optional dependency {top!r}: pip install 'headroom[{extra}]'", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
