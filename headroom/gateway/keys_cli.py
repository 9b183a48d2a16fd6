"""`headroom keys create|list|revoke`: manage API keys in a keys file (only hashes are stored)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from headroom.gateway.auth import ROLES, create_key, load_records, revoke_key

app = typer.Typer(
    help="Manage API keys: each key acts for one tenant with a role (user or admin).", no_args_is_help=True
)
KEYS_FILE = typer.Option(
    Path("keys.yaml"), "--keys-file", help="The keys file the server reads (--api-keys-file)."
)


@app.command("create")
def create(
    tenant: str = typer.Option(..., help="Tenant the key acts for (rate limits and logs are per tenant)."),
    role: str = typer.Option("user", help="user (inference) or admin (also load/unload and /admin)."),
    name: str = typer.Option("", help="A label to recognise the key by in `headroom keys list`."),
    keys_file: Path = KEYS_FILE,
) -> None:
    """Create a key and print it once; the file keeps only its SHA-256 hash."""
    if role not in ROLES:
        raise typer.BadParameter(f"role must be one of {', '.join(ROLES)}", param_hint="--role")
    try:
        key = create_key(keys_file, tenant, "admin" if role == "admin" else "user", name)
    except ValueError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(code=2) from None
    err = Console(stderr=True)
    err.print(
        f"created a {role} key for tenant [bold]{tenant}[/] in {keys_file}; store it now, it is not "
        "shown again:"
    )
    typer.echo(key)


@app.command("list")
def list_keys(keys_file: Path = KEYS_FILE) -> None:
    """List key ids, tenants and roles (never the keys: they are not stored)."""
    table = Table("id", "tenant", "role", "name", "created")
    for r in load_records(keys_file):
        table.add_row(r.key_id, r.tenant, r.role, r.name, r.created)
    Console().print(table)


@app.command("revoke")
def revoke(
    key_id: str = typer.Argument(..., help="The 8-hex-digit id from `headroom keys list`."),
    keys_file: Path = KEYS_FILE,
) -> None:
    """Remove a key; a running server notices within a few seconds."""
    if not revoke_key(keys_file, key_id):
        Console(stderr=True).print(f"[bold red]error:[/] no key with id {key_id} in {keys_file}")
        raise typer.Exit(code=1)
    Console(stderr=True).print(f"revoked {key_id}")
