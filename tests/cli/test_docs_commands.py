"""Every `headroom ...` command written in README.md and docs/*.md parses against the real CLI.

Commands come from fenced code blocks (lines starting with `headroom`, joined over trailing backslashes) and
from inline code spans starting with `headroom ` (a `a|b` alternative is split into each spelling; `[...]`
marks an optional part and is kept). A complete command from a code block is dry-run: click resolves the
subcommand chain and parses every option and argument (names, types, choices, required ones) without invoking
anything. An inline span or an elided line (`...`) is a reference: its subcommands must exist and every
option it names must be one the command has. Either way a renamed flag or a subcommand the CLI does not have
fails here; `--help` then runs on the resolved command as a user would.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from headroom.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
# typer vendors its own click: take its exception base from typer's public exceptions
ClickError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
INLINE = re.compile(r"(?<!`)`(headroom [^`]+)`(?!`)")


def _alternatives(command: str) -> list[str]:
    """`headroom models list\\|add\\|pull` -> one command per spelling of the word carrying the `|`."""
    words = command.replace("\\|", "|").split()
    for i, word in enumerate(words):
        if "|" in word and not word.startswith(("-", "'", '"')):
            return [" ".join([*words[:i], alt, *words[i + 1:]]) for alt in word.split("|") if alt]
    return [" ".join(words)]


def commands_in(path: Path) -> list[str]:
    text = path.read_text()
    found: list[str] = []
    for block in FENCE.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("headroom "):
                found.append("block " + line.split("  #")[0].split(" # ")[0].strip())
    for span in INLINE.findall(FENCE.sub("", text)):
        found.extend("inline " + alt for alt in _alternatives(span))
    return found


CASES = sorted({(p.relative_to(ROOT).as_posix(), c) for p in DOCS for c in commands_in(p)})


def reference_check(argv: list[str]) -> list[str]:
    """The subcommands named must exist and every `--option` must be one of the command's; returns the path."""
    command: Any = typer.main.get_command(app)
    path: list[str] = []
    rest = list(argv)
    while hasattr(command, "resolve_command"):  # let the group route (`headroom bench URL` = `bench run URL`)
        ctx = command.make_context(path[-1] if path else "headroom", list(rest), resilient_parsing=True)
        args = [*ctx._protected_args, *ctx.args]
        if not args or args[0] not in command.list_commands(ctx):
            break
        path.append(args[0])
        command, rest = command.get_command(ctx, args[0]), args[1:]
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}
    unknown = [w.split("=")[0] for w in rest if w.startswith("-") and w.split("=")[0] not in known]
    if unknown:
        raise ValueError(f"`headroom {' '.join(path)}` has no option {unknown[0]}")
    takes_arguments = any(type(p).__name__.endswith("Argument") for p in command.params)
    if rest and not rest[0].startswith("-") and not takes_arguments:
        raise ValueError(f"`headroom {' '.join(path)}` takes no argument {rest[0]!r} (no such subcommand)")
    return path


def dry_run(argv: list[str]) -> list[str]:
    """Parse `headroom argv` down to the leaf command without running it; returns the subcommand path."""
    command: Any = typer.main.get_command(app)
    ctx = command.make_context("headroom", list(argv), resilient_parsing=False)
    path: list[str] = []
    while hasattr(command, "resolve_command"):  # a group: the next word names a subcommand
        args = [*ctx._protected_args, *ctx.args]  # click keeps the subcommand here
        if not args:
            break
        name, sub, rest = command.resolve_command(ctx, args)
        if sub is None or name is None:
            raise ValueError(f"no subcommand {args[0]!r}")
        path.append(name)
        command, ctx = sub, sub.make_context(name, rest, parent=ctx)
    return path


def test_the_docs_name_commands() -> None:
    assert len(CASES) > 20 and any("deploy k8s" in c for _, c in CASES)
    with pytest.raises(ClickError):
        dry_run(["deploy", "kube"])
    with pytest.raises(ClickError):
        dry_run(["serve", "--http-port", "eighty"])
    with pytest.raises(ValueError, match="has no option --no-such-flag"):
        reference_check(["serve", "--no-such-flag"])
    with pytest.raises(ValueError, match="takes no argument 'k8z'"):
        reference_check(["deploy", "k8s", "k8z"])


@pytest.mark.parametrize(("doc", "command"), CASES, ids=[f"{d}:{c[:70]}" for d, c in CASES])
def test_documented_command_parses(doc: str, command: str) -> None:
    kind, _, text = command.partition(" ")
    argv = shlex.split(text.replace("[", " ").replace("]", " "))[1:]
    complete = kind == "block" and "..." not in argv
    try:
        path = dry_run(argv) if complete else reference_check([w for w in argv if w != "..."])
    except (ClickError, ValueError) as exc:
        message = exc.format_message() if isinstance(exc, ClickError) else str(exc)  # type: ignore[attr-defined]
        pytest.fail(f"{doc}: `{text}` does not parse: {message}")
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
