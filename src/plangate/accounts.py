"""People and machines that use the dashboard and the API: accounts, roles, passwords, tokens.

Roles: ``requester`` (submits plans), ``approver`` (decides on plans in the categories
they are allowed, patterns such as ``refunds`` or ``*``), ``governance`` (also manages
the auto-approval register) and ``auditor`` (reads everything, changes nothing).
Passwords are hashed with Argon2id (argon2-cffi); API tokens are random and stored only
as their SHA-256 digest.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal, get_args

from plangate.errors import UsageError
from plangate.store import Store

try:
    from argon2 import PasswordHasher
    from argon2.exceptions import InvalidHashError, VerificationError
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("accounts need argon2-cffi: pip install 'plangate[server]'") from exc

Role = Literal["requester", "approver", "governance", "auditor"]
ROLES: tuple[Role, ...] = get_args(Role)
_HASHER = PasswordHasher()


@dataclass(frozen=True, kw_only=True)
class User:
    name: str
    role: Role
    categories: tuple[str, ...] = ()

    def may_approve(self, category: str) -> bool:
        return self.role in ("approver", "governance") and any(fnmatchcase(category, p) for p in self.categories)

    @property
    def read_only(self) -> bool:
        return self.role == "auditor"


class Accounts:
    """Accounts kept in the plangate store (tables ``users`` and ``api_tokens``)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(
        self, name: str, role: str, *, password: str | None = None, categories: tuple[str, ...] = (), at: str = ""
    ) -> User:
        if role not in ROLES:
            raise UsageError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise UsageError("a user name is letters, digits, '-', '_' and '.'")
        if password is not None and len(password) < 8:
            raise UsageError("a password has at least 8 characters")
        digest = _HASHER.hash(password) if password is not None else None
        with self.store.transaction():
            self.store.command(
                "INSERT INTO users (name, role, categories, password_hash, created_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET role = excluded.role, categories = excluded.categories,"
                " password_hash = COALESCE(excluded.password_hash, users.password_hash)",
                (name, role, json.dumps(list(categories)), digest, at),
            )
        return User(name=name, role=role, categories=tuple(categories))

    def get(self, name: str) -> User | None:
        rows = self.store.query("SELECT name, role, categories FROM users WHERE name = ?", (name,))
        return _user(rows[0]) if rows else None

    def all(self) -> list[User]:
        return [_user(r) for r in self.store.query("SELECT name, role, categories FROM users ORDER BY name")]

    def login(self, name: str, password: str) -> User | None:
        """The user when the password is right; ``None`` otherwise (whatever was wrong)."""
        rows = self.store.query("SELECT password_hash FROM users WHERE name = ?", (name,))
        row = rows[0] if rows else None
        if row is None or row[0] is None:
            _HASHER.hash(password)  # spend the same time as a real check
            return None
        try:
            _HASHER.verify(row[0], password)
        except (VerificationError, InvalidHashError):
            return None
        return self.get(name)

    def issue_token(self, name: str, label: str = "api", at: str = "") -> str:
        if self.get(name) is None:
            raise UsageError(f"no user {name!r}")
        token = "pgt_" + secrets.token_urlsafe(32)
        with self.store.transaction():
            self.store.command(
                "INSERT INTO api_tokens (digest, user_name, label, created_at) VALUES (?, ?, ?, ?)",
                (_digest(token), name, label, at),
            )
        return token

    def by_token(self, token: str) -> User | None:
        rows = self.store.query("SELECT user_name FROM api_tokens WHERE digest = ?", (_digest(token),))
        return self.get(rows[0][0]) if rows else None

    def secret(self) -> bytes:
        """The server's signing secret, made once and kept in the store."""
        rows = self.store.query("SELECT value FROM settings WHERE key = 'secret'")
        if rows:
            return bytes.fromhex(rows[0][0])
        with self.store.transaction():
            self.store.command(
                "INSERT INTO settings (key, value) VALUES ('secret', ?) ON CONFLICT (key) DO NOTHING",
                (secrets.token_hex(32),),
            )
        return self.secret()


def _user(row: tuple[Any, ...]) -> User:
    return User(name=row[0], role=row[1], categories=tuple(json.loads(row[2])))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
