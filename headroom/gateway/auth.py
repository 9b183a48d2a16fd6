"""API keys: random secrets bound to a tenant and a role, stored only as SHA-256 hashes in a YAML file.

A key looks like `hr_<id>_<secret>`: `id` (8 hex digits) names the entry and is not secret; `secret` is 32
random bytes (URL-safe base64). Because a key is 256 bits of randomness (not a password a person chose),
one SHA-256 is enough to make a stolen keys file useless — a slow KDF (scrypt/PBKDF2) would only slow
every request. Comparison is constant-time (`hmac.compare_digest`) and no key ever reaches a log line or an
error message. Roles: `user` (inference) and `admin` (also management endpoints, see `required_role`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from headroom.gateway.errors import Forbidden, Unauthenticated

Role = Literal["user", "admin"]
ROLES: tuple[Role, ...] = ("user", "admin")
KEY_PREFIX = "hr_"
_ID_RE = re.compile(r"^[0-9a-f]{8}$")
TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEADER_HINT = "send `Authorization: Bearer <key>` or `X-API-Key: <key>`"

#: Endpoints that need the admin role (regular expressions over the request path).
DEFAULT_ADMIN_PATHS: tuple[str, ...] = (
    r"^/v2/repository/models/[^/]+/(load|unload)$", r"^/admin(/|$)",
    # Triton's server settings, admin as their gRPC RPCs (grpc_auth.ADMIN_RPCS): log and trace settings and
    # shared-memory registration
    r"^/v2/logging$", r"^/v2/(models/[^/]+/)?trace/setting$", r"^/v2/(system|cuda)sharedmemory/",
)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One stored key (what the keys file holds: never the key itself)."""

    key_id: str  # 8 hex digits, the non-secret part of the key; names the entry
    sha256_hex: str  # SHA-256 of the whole key string, hex
    tenant: str  # the tenant the key acts for (rate limits and logs are per tenant)
    role: Role  # "user" or "admin"
    name: str  # free-form label ("ci", "alice's laptop")
    created: str  # ISO-8601 UTC creation time


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is, once authenticated."""

    tenant: str  # tenant name
    role: Role  # granted role
    key_id: str  # which key (safe to log)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def split_key(key: str) -> str | None:
    """The key id of a well-formed key, else None."""
    if not key.startswith(KEY_PREFIX) or len(key) < len(KEY_PREFIX) + 10 or key[len(KEY_PREFIX) + 8] != "_":
        return None
    key_id = key[len(KEY_PREFIX) : len(KEY_PREFIX) + 8]
    return key_id if _ID_RE.match(key_id) else None


def _validate(record: KeyRecord, where: str) -> None:
    if not _ID_RE.match(record.key_id):
        raise ValueError(f"{where}: id must be 8 hex digits, got {record.key_id!r}")
    if not re.fullmatch(r"[0-9a-f]{64}", record.sha256_hex):
        raise ValueError(f"{where}: sha256 must be 64 hex digits")
    if not TENANT_RE.match(record.tenant):
        raise ValueError(
            f"{where}: tenant must be 1-64 letters, digits, '.', '_' or '-', got {record.tenant!r}"
        )
    if record.role not in ROLES:
        raise ValueError(f"{where}: role must be one of {', '.join(ROLES)}, got {record.role!r}")


def load_records(path: Path) -> list[KeyRecord]:
    """Read a keys file (YAML or JSON); a missing file is an empty list; ValueError says what to fix."""
    if not path.exists():
        return []
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"keys file {path} is not valid YAML/JSON: {exc}") from None
    raw = doc.get("keys", []) if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        raise ValueError(f"keys file {path} must be a mapping with a 'keys' list")
    records: list[KeyRecord] = []
    for i, item in enumerate(raw):
        where = f"{path}: keys[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be a mapping with id, sha256, tenant, role")
        record = KeyRecord(
            key_id=str(item.get("id", "")),
            sha256_hex=str(item.get("sha256", "")),
            tenant=str(item.get("tenant", "")),
            role=item.get("role", "user"),
            name=str(item.get("name", "")),
            created=str(item.get("created", "")),
        )
        _validate(record, where)
        records.append(record)
    if len({r.key_id for r in records}) != len(records):
        raise ValueError(f"keys file {path} has two entries with the same id; revoke one")
    return records


def save_records(path: Path, records: Sequence[KeyRecord]) -> None:
    """Write the keys file atomically, readable by its owner only (0600)."""
    doc = {
        "keys": [
            {
                "id": r.key_id,
                "sha256": r.sha256_hex,
                "tenant": r.tenant,
                "role": r.role,
                "name": r.name,
                "created": r.created,
            }
            for r in records
        ]
    }
    text = "# headroom API keys: SHA-256 hashes only. Manage with `headroom keys create|list|revoke`.\n"
    text += yaml.safe_dump(doc, sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".keys-", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def create_key(
    path: Path,
    tenant: str,
    role: Role = "user",
    name: str = "",
    random_bytes: Callable[[int], bytes] = secrets.token_bytes,
) -> str:
    """Add a new key to the keys file and return it. It is shown once: only its hash is stored."""
    records = load_records(path)
    taken = {r.key_id for r in records}
    while True:
        key_id = random_bytes(4).hex()
        if key_id not in taken:
            break
    secret = base64.urlsafe_b64encode(random_bytes(32)).decode("ascii").rstrip("=")
    key = f"{KEY_PREFIX}{key_id}_{secret}"
    record = KeyRecord(
        key_id, hash_key(key), tenant, role, name, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    )
    _validate(record, "new key")
    save_records(path, [*records, record])
    return key


def revoke_key(path: Path, key_id: str) -> bool:
    """Remove a key by id; False if there was none."""
    records = load_records(path)
    kept = [r for r in records if r.key_id != key_id]
    if len(kept) == len(records):
        return False
    save_records(path, kept)
    return True


class KeyStore:
    """Authenticates presented keys against the hashed records (re-read when the file changes)."""

    def __init__(self, records: Sequence[KeyRecord], path: Path | None = None) -> None:
        self.path = path
        self._by_id = {r.key_id: r for r in records}
        self._mtime_ns = path.stat().st_mtime_ns if path is not None and path.exists() else 0

    @classmethod
    def from_file(cls, path: Path) -> KeyStore:
        if not path.exists():
            raise ValueError(
                f"keys file {path} does not exist; create a key with "
                f"`headroom keys create --keys-file {path} --tenant NAME`"
            )
        return cls(load_records(path), path)

    def __len__(self) -> int:
        return len(self._by_id)

    def reload_if_changed(self) -> bool:
        """Re-read the file if its mtime changed (revocations take effect without a restart)."""
        if self.path is None:
            return False
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = -1
        if mtime == self._mtime_ns:
            return False
        self._by_id = {r.key_id: r for r in load_records(self.path)} if mtime >= 0 else {}
        self._mtime_ns = mtime
        return True

    def authenticate(self, key: str | None) -> Principal:
        """The principal for a presented key; Unauthenticated (never echoing the key) otherwise."""
        if not key:
            raise Unauthenticated(f"missing API key: {_HEADER_HINT}")
        key_id = split_key(key)
        record = self._by_id.get(key_id) if key_id is not None else None
        expected = record.sha256_hex if record is not None else "0" * 64
        ok = hmac.compare_digest(hash_key(key).encode(), expected.encode())
        if record is None or not ok:
            raise Unauthenticated(
                f"invalid API key: check it, or create one with `headroom keys create`; {_HEADER_HINT}"
            )
        return Principal(record.tenant, record.role, record.key_id)


def required_role(path: str, admin_paths: Sequence[re.Pattern[str]]) -> Role:
    """`admin` for management endpoints, `user` for everything else."""
    return "admin" if any(p.search(path) for p in admin_paths) else "user"


def authorize(principal: Principal, needed: Role) -> None:
    if needed == "admin" and principal.role != "admin":
        raise Forbidden(
            f"this endpoint needs an admin key; key {principal.key_id} of tenant "
            f"{principal.tenant!r} has role {principal.role!r}"
        )


def compile_paths(patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)
