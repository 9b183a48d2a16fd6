"""`headroom keys create|list|revoke` (the typer app the lead mounts as `headroom keys`)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from headroom.gateway.auth import KeyStore, create_key, split_key
from headroom.gateway.keys_cli import app


def test_create_list_revoke(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.yaml"
    runner = CliRunner()
    created = runner.invoke(
        app, ["create", "--tenant", "acme", "--role", "admin", "--name", "ops", "--keys-file", str(keys_file)]
    )
    assert created.exit_code == 0, created.output
    key = created.stdout.strip().splitlines()[-1]
    key_id = split_key(key)
    assert key_id is not None and KeyStore.from_file(keys_file).authenticate(key).role == "admin"
    listed = runner.invoke(app, ["list", "--keys-file", str(keys_file)])
    assert key_id in listed.stdout and "acme" in listed.stdout and key not in listed.stdout
    assert runner.invoke(app, ["revoke", key_id, "--keys-file", str(keys_file)]).exit_code == 0
    assert runner.invoke(app, ["revoke", key_id, "--keys-file", str(keys_file)]).exit_code == 1
    assert len(KeyStore.from_file(keys_file)) == 0


def test_bad_role_and_tenant_are_explained(tmp_path: Path) -> None:
    runner = CliRunner()
    keys_file = str(tmp_path / "k.yaml")
    bad_role = runner.invoke(app, ["create", "--tenant", "a", "--role", "root", "--keys-file", keys_file])
    assert bad_role.exit_code != 0 and "role must be one of" in bad_role.output
    bad_tenant = runner.invoke(app, ["create", "--tenant", "a/b", "--keys-file", keys_file])
    assert bad_tenant.exit_code == 2 and "tenant must be" in bad_tenant.output


def test_exposure_warning(tmp_path: Path) -> None:
    from headroom.gateway.app import GatewaySetup, exposure_warning, gateway_setup

    assert exposure_warning("127.0.0.1", GatewaySetup(), tls_enabled=False) is None
    warning = exposure_warning("0.0.0.0", GatewaySetup(), tls_enabled=False)
    assert warning is not None and "--api-keys-file" in warning and "--tls-certfile" in warning
    keys_file = tmp_path / "k.yaml"
    create_key(keys_file, "t")
    keyed = gateway_setup(api_keys_file=keys_file, rate_limit_rps=5, cors_origins=["http://a.example"])
    assert keyed.config.auth_enabled and keyed.config.rate_limits.requests.burst == 5
    assert exposure_warning("0.0.0.0", keyed, tls_enabled=True) is None
