"""`headroom` entry point. Each subcommand lives in its own module; this file only wires them.

Subcommand modules are imported when their command is looked up, not at start-up: `headroom serve` does not pay
for the load generator, the router or the planner (about 0.7 s of imports on a 2-core machine, a quarter of the
LLM's cold start). `headroom --help` still lists every command (it imports them all to read their help).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import typer
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
    "deploy": Subcommand("headroom.router.k8s", "deploy_app", True),
}


def load_subcommand(name: str) -> Any:
    """The click command behind `headroom NAME` (imports its module)."""
    spec = SUBCOMMANDS[name]
    target = getattr(importlib.import_module(spec.module), spec.attribute)
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
