"""API keys: hashed at rest, bound to tenant and role, constant-time checked, admin paths."""

from __future__ import annotations

import itertools
import os
import stat
from pathlib import Path

import pytest

from headroom.gateway.auth import (
    DEFAULT_ADMIN_PATHS,
    KeyStore,
    Principal,
    authorize,
    compile_paths,
    create_key,
    load_records,
    required_role,
    revoke_key,
    split_key,
)
from headroom.gateway.errors import Forbidden, Unauthenticated


def test_created_key_is_stored_only_as_a_hash(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    key = create_key(path, "acme", "user", "ci")
    text = path.read_text()
    assert key not in text and key.split("_", 2)[2] not in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (record,) = load_records(path)
    assert (record.tenant, record.role, record.name, record.key_id) == ("acme", "user", "ci", split_key(key))


def test_authenticate_binds_tenant_and_role(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    user = create_key(path, "acme", "user")
    admin = create_key(path, "ops", "admin")
    store = KeyStore.from_file(path)
    assert store.authenticate(user).tenant == "acme"
    assert store.authenticate(admin) == Principal("ops", "admin", admin[3:11])


@pytest.mark.parametrize("presented", [None, "", "hr_", "nothex", "hr_zzzzzzzz_abc", "hr_00000000_abc"])
def test_missing_or_malformed_keys_are_401(tmp_path: Path, presented: str | None) -> None:
    path = tmp_path / "keys.yaml"
    create_key(path, "acme")
    with pytest.raises(Unauthenticated) as info:
        KeyStore.from_file(path).authenticate(presented)
    assert info.value.http_status == 401
    if presented:
        assert presented not in info.value.message


def test_right_id_wrong_secret_is_401_and_not_echoed(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    key = create_key(path, "acme")
    forged = key[:-3] + ("AAA" if not key.endswith("AAA") else "BBB")
    with pytest.raises(Unauthenticated) as info:
        KeyStore.from_file(path).authenticate(forged)
    assert forged not in info.value.message


def test_revocation_is_picked_up_on_reload(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    counter = itertools.count()
    key = create_key(path, "acme", random_bytes=lambda n: bytes([next(counter) % 256]) * n)
    store = KeyStore.from_file(path)
    store.authenticate(key)
    assert revoke_key(path, key[3:11]) and not revoke_key(path, key[3:11])
    os.utime(path, ns=(1, 1))  # make sure the mtime differs on coarse file systems
    assert store.reload_if_changed()
    with pytest.raises(Unauthenticated):
        store.authenticate(key)


def test_admin_paths_and_roles() -> None:
    admin = compile_paths(DEFAULT_ADMIN_PATHS)
    assert required_role("/v2/repository/models/echo/load", admin) == "admin"
    assert required_role("/v2/repository/models/echo/unload", admin) == "admin"
    assert required_role("/admin", admin) == "admin"
    assert required_role("/admin/scale", admin) == "admin"
    assert required_role("/administrator", admin) == "user"
    assert required_role("/v2/models/echo/infer", admin) == "user"
    for path in ("/v2/logging", "/v2/trace/setting", "/v2/models/echo/trace/setting",
                 "/v2/systemsharedmemory/region/r/register", "/v2/cudasharedmemory/status"):
        assert required_role(path, admin) == "admin", path  # as their gRPC RPCs
    assert required_role("/v2/models/echo/config", admin) == "user"
    assert required_role("/v2/repository/index", admin) == "user"
    authorize(Principal("t", "admin", "00000000"), "admin")
    authorize(Principal("t", "user", "00000000"), "user")
    with pytest.raises(Forbidden):
        authorize(Principal("t", "user", "00000000"), "admin")


@pytest.mark.parametrize(
    "text",
    [
        "keys: 3",
        "[1, 2]",
        "keys: [{id: zz, sha256: x, tenant: a}]",
        "keys: [{id: 0000000a, sha256: " + "0" * 64 + ", tenant: 'a/b'}]",
        "keys: [{id: 0000000a, sha256: " + "0" * 64 + ", tenant: a, role: root}]",
        "keys: {",
    ],
)
def test_bad_keys_files_say_what_is_wrong(tmp_path: Path, text: str) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=str(path)):
        load_records(path)


def test_missing_keys_file_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="headroom keys create"):
        KeyStore.from_file(tmp_path / "nope.yaml")
