"""People and machines that use plangate: accounts, roles, passwords, tokens and sessions.

Roles: ``requester`` (submits plans), ``approver`` (decides on plans in the categories
they are allowed, patterns such as ``refunds`` or ``*``), ``governance`` (also manages
accounts and the auto-approval register) and ``auditor`` (reads everything, changes
nothing). A person's *policy* role (the one named approvals ask for, such as
``privacy-officer``) is what the policy's ``users`` mapping gives the account's name, or
its ``default_role``; see docs/security.md.

Every change to an account (made, role or categories changed, password set, disabled,
enabled, token issued or revoked, chat id linked) is an audit event, chained under the
audit key like every other. An account is what those events say: the ``users`` and
``api_tokens`` tables only mirror them, so a row added or changed in the database makes
no one anyone. Passwords are hashed with Argon2id (argon2-cffi) and the event records
a digest of the hash, so a hash swapped in the database logs no one in; API tokens are
random, expire (90 days unless told otherwise), and are stored only as their SHA-256
digest. A browser session is a cookie signed with the server's secret key, which lives
outside the database (:mod:`plangate._keys`): it names the account, when the session
began and when it ends, so no row in the database can make it anyone else's or longer.
Logging out is an audit event that ends it; disabling the account or revoking all its
tokens ends every session that began before.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Literal, get_args

from plangate._clock import Clock, SystemClock, iso, parse_iso
from plangate._extras import need
from plangate._input import check_text
from plangate._patterns import matches_any
from plangate.errors import GovernanceError, NotFoundError, UsageError
from plangate.names import canonical, new_name, skeleton
from plangate.store import ReadScope, Store

Role = Literal["requester", "approver", "governance", "auditor"]
ROLES: tuple[Role, ...] = get_args(Role)
EVENT = "account.changed"
TOKEN_DAYS = 90
MAX_TOKEN_DAYS = 366
_DURATION = re.compile(r"(\d+)([dh])")
_SLACK_ID = re.compile(r"[UW][A-Z0-9]{2,20}")


@dataclass(frozen=True, kw_only=True)
class User:
    name: str
    role: Role
    categories: tuple[str, ...] = ()
    slack_id: str | None = None
    disabled: bool = False

    def may_approve(self, category: str) -> bool:
        return self.role in ("approver", "governance") and matches_any(self.categories, category)

    def may_read(self, *, category: str, requested_by: str) -> bool:
        """Whether a plan of ``category`` that ``requested_by`` asked for is one this user may read."""
        scope = self.scope
        return scope is None or scope.admits(category=category, requested_by=requested_by)

    @property
    def scope(self) -> ReadScope | None:
        """Auditors and governance read every plan (None); approvers the categories they decide; everyone their own."""
        if self.role in ("auditor", "governance"):
            return None
        return ReadScope(requester=self.name, categories=self.categories if self.role == "approver" else ())

    @property
    def read_only(self) -> bool:
        return self.role == "auditor"


@dataclass(frozen=True, kw_only=True)
class Token:
    id: str
    user: str
    label: str
    created_at: str
    expires_at: str
    revoked_at: str | None = None

    def live(self, now: datetime) -> bool:
        return self.revoked_at is None and parse_iso(self.expires_at) > now


@dataclass(frozen=True, kw_only=True)
class Session:
    """A browser session, as its signed cookie carries it."""

    id: str
    user: str
    opened_at: str
    expires_at: str

    def to_cookie(self) -> dict[str, str]:
        return {"sid": self.id, "user": self.user, "opened": self.opened_at, "expires": self.expires_at}

    @classmethod
    def from_cookie(cls, data: object) -> Session | None:
        if not isinstance(data, dict) or not all(
            isinstance(data.get(k), str) for k in ("sid", "user", "opened", "expires")
        ):
            return None
        return cls(id=data["sid"], user=data["user"], opened_at=data["opened"], expires_at=data["expires"])


@dataclass(kw_only=True)
class _Account:
    user: User
    password: str | None  # the digest of the Argon2 hash the log last recorded
    tokens: dict[str, tuple[str, Token]] = field(default_factory=dict)  # token id -> (digest, token)
    sessions_cut: str = ""  # sessions that began before this (disabled, every token revoked) are over
    signed_out: set[str] = field(default_factory=set)  # digests of sessions ended at logout


def duration(text: str) -> timedelta:
    """``90d`` or ``12h``: how long a token lives (at most a year)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"a token's lifetime is a number of days or hours, such as 90d or 12h, not {text!r}")
    amount = int(match.group(1))
    span = timedelta(days=amount) if match.group(2) == "d" else timedelta(hours=amount)
    if not timedelta(hours=1) <= span <= timedelta(days=MAX_TOKEN_DAYS):
        raise UsageError(f"a token lives between 1 hour and {MAX_TOKEN_DAYS} days, not {text}")
    return span


class Accounts:
    """The accounts the audit log records, with their tokens and sessions."""

    def __init__(self, store: Store, clock: Clock | None = None) -> None:
        self.store = store
        self.clock = clock or SystemClock()

    # -- reading ------------------------------------------------------------------------------
    def _fold(self) -> dict[str, _Account]:
        """Every account as its events tell it, each event checked under the audit key.

        An ``account.changed`` event changed in the database is refused
        (:class:`~plangate.errors.StoreError`); rows in ``users`` or ``api_tokens`` are not read.
        """
        accounts: dict[str, _Account] = {}
        for event in self.store.verified_events(EVENT):
            name, change = str(event.data["name"]), event.data["change"]
            if change == "saved":
                _saved(accounts, name, event.data, event.at)
            else:
                _CHANGES[change](accounts[name], event.data, event.at)
        return accounts

    def any(self) -> bool:
        """Whether the store has accounts (if not, it is in single-operator local mode)."""
        return bool(self._fold())

    def get(self, name: str) -> User | None:
        account = self._fold().get(canonical(name))
        return account.user if account else None

    def active(self, name: str) -> User | None:
        """The account, unless it is unknown or disabled."""
        user = self.get(name)
        return user if user is not None and not user.disabled else None

    def all(self) -> list[User]:
        return [account.user for _, account in sorted(self._fold().items())]

    def tokens(self, name: str | None = None) -> list[Token]:
        folded = self._fold()
        names = [self._known(folded, name).user.name] if name is not None else sorted(folded)
        return [token for n in names for _, token in folded[n].tokens.values()]

    def by_slack_id(self, slack_id: str) -> User | None:
        found = [a.user for a in self._fold().values() if a.user.slack_id == slack_id and not a.user.disabled]
        return found[0] if len(found) == 1 else None

    # -- signing in ---------------------------------------------------------------------------
    def login(self, name: str, password: str) -> User | None:
        """The user when the password is right and the account active; ``None`` otherwise (whatever was wrong)."""
        account = self._fold().get(canonical(name))
        rows = self.store.query("SELECT password_hash FROM users WHERE name = ?", (canonical(name),))
        stored = rows[0][0] if rows and rows[0][0] else None
        if account is None or account.password is None or stored is None or _digest(stored) != account.password:
            _hasher().hash(password)  # spend the same time as a real check
            return None
        from argon2.exceptions import InvalidHashError, VerificationError

        try:
            _hasher().verify(stored, password)
        except (VerificationError, InvalidHashError):
            return None
        return None if account.user.disabled else account.user

    def by_token(self, token: str) -> User | None:
        """The account a live token belongs to (not expired, not revoked, the account active)."""
        digest, now = _digest(token), self.clock.now()
        for account in self._fold().values():
            for known, record in account.tokens.values():
                if secrets.compare_digest(known, digest) and record.live(now) and not account.user.disabled:
                    return account.user
        return None

    def open_session(self, user: User, *, hours: float) -> Session:
        """A new browser session for ``user``, to be carried in a cookie signed with the server's secret."""
        now = self.clock.now()
        return Session(
            id=secrets.token_urlsafe(24),
            user=user.name,
            opened_at=iso(now),
            expires_at=iso(now + timedelta(hours=hours)),
        )

    def session_user(self, session: Session) -> User | None:
        """The session's account, while it lasts: not expired, not signed out, not cut short, the account active."""
        try:
            if parse_iso(session.expires_at) <= self.clock.now():
                return None
            account = self._fold().get(session.user)
            if account is None or account.user.disabled or _digest(session.id) in account.signed_out:
                return None
            if account.sessions_cut and parse_iso(session.opened_at) <= parse_iso(account.sessions_cut):
                return None
        except ValueError:  # a timestamp that is not one: not a cookie this server made
            return None
        return account.user

    def end_session(self, session: Session) -> None:
        """Log out: an audit event ends the session, so no copy of its cookie works again."""
        user = self.active(session.user)
        if user is None:
            return
        with self.store.transaction():
            self._changing(user, for_self=user.name)
            self._record(user, "", user.name, "signed-out", session=_digest(session.id))

    # -- changing (each change an audit event) ------------------------------------------------
    def add(
        self,
        name: str,
        role: str,
        *,
        password: str | None = None,
        categories: Iterable[str] = (),
        slack_id: str | None = None,
        by: User | None = None,
        at: str = "",
    ) -> User:
        """Make an account, or change one's role, categories, password or chat id."""
        if role not in ROLES:
            raise UsageError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        if password is not None and len(password) < 8:
            raise UsageError("a password has at least 8 characters")
        if slack_id is not None and not _SLACK_ID.fullmatch(slack_id):
            raise UsageError(f"a chat user id looks like U012AB3CD, not {slack_id!r}")
        name = new_name(name)
        categories = [check_text(c, f"categories[{i}]", what="account") for i, c in enumerate(categories)]
        with self.store.transaction():
            folded = self._changing(by)
            old = folded.get(name)
            if old is None:
                _refuse_look_alike(name, folded)
            if slack_id is not None and any(
                a.user.slack_id == slack_id and a.user.name != name for a in folded.values()
            ):
                raise UsageError(f"chat user id {slack_id} already belongs to another account")
            stored = _hasher().hash(password) if password is not None else None
            digest = _digest(stored) if stored is not None else (old.password if old else None)
            user = User(
                name=name,
                role=role,
                categories=tuple(categories),
                slack_id=slack_id if slack_id is not None else (old.user.slack_id if old else None),
                disabled=old.user.disabled if old else False,
            )
            record = {"role": role, "categories": list(user.categories), "slack_id": user.slack_id}
            self._record(by, at, name, "saved", **record, password=digest)
            self.store.command(
                "INSERT INTO users (name, role, categories, password_hash, created_at, slack_id)"
                " VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET role = excluded.role, categories = excluded.categories,"
                " password_hash = COALESCE(excluded.password_hash, users.password_hash), slack_id = excluded.slack_id",
                (name, role, json.dumps(list(user.categories)), stored, at or self._now(), user.slack_id),
            )
        return user

    def disable(self, name: str, *, by: User | None = None, at: str = "") -> User:
        """Disable an account: its tokens and sessions stop working at once (``enable`` undoes it)."""
        return self._set_disabled(name, True, by, at)

    def enable(self, name: str, *, by: User | None = None, at: str = "") -> User:
        return self._set_disabled(name, False, by, at)

    def issue_token(
        self,
        name: str,
        label: str = "api",
        *,
        lifetime: timedelta = timedelta(days=TOKEN_DAYS),
        by: User | None = None,
        at: str = "",
    ) -> str:
        """A new API token for ``name``; only its digest is kept. Give it to its holder once."""
        if not check_text(label, "label", what="token").strip() or len(label) > 64:
            raise UsageError("a token's label is 1 to 64 characters")
        with self.store.transaction():
            account = self._known(self._changing(by, for_self=name), name)
            token_id = secrets.token_hex(4)
            token = f"pgt_{token_id}_{secrets.token_urlsafe(32)}"
            expires = iso(self.clock.now() + lifetime)
            data = {"token": token_id, "digest": _digest(token), "label": label.strip(), "expires_at": expires}
            self._record(by, at, account.user.name, "token.issued", **data)
            self.store.command(
                "INSERT INTO api_tokens (digest, user_name, label, created_at, id, expires_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (data["digest"], account.user.name, data["label"], at or self._now(), token_id, expires),
            )
        return token

    def revoke(self, name: str, token_id: str | None = None, *, by: User | None = None, at: str = "") -> list[Token]:
        """Revoke one token, or every live token of ``name`` and end their sessions; the tokens revoked.

        Governance revokes anyone's; everyone may revoke their own."""
        with self.store.transaction():
            account = self._known(self._changing(by, for_self=name), name)
            now = self.clock.now()
            live = [t for _, t in account.tokens.values() if t.revoked_at is None]
            if token_id is not None:
                live = [t for t in live if t.id == token_id]
                if not live:
                    raise NotFoundError(f"{account.user.name} has no live token {token_id!r}")
            if live or token_id is None:  # revoking all also ends every session, with or without live tokens
                ids = [t.id for t in live]
                self._record(by, at, account.user.name, "token.revoked", tokens=ids, all=token_id is None)
            if live:
                self.store.command(
                    f"UPDATE api_tokens SET revoked_at = ? WHERE id IN ({', '.join('?' for _ in live)})",
                    (iso(now), *(t.id for t in live)),
                )
        return live

    # -- internals ----------------------------------------------------------------------------
    def _changing(self, by: User | None, *, for_self: str | None = None) -> dict[str, _Account]:
        """The accounts, once ``by`` is shown to be allowed to change them.

        ``by`` is the account a request came from (the command line's token, the server's
        session): only an active governance account changes accounts, though anyone may get
        (or revoke) a token for themselves. ``None`` is the local operator, who holds the store and the
        audit key and so is trusted (recorded as ``local operator``).
        """
        self.store.lock_log()
        folded = self._fold()
        if by is None:
            return folded
        current = folded.get(by.name)
        if current is None or current.user.disabled:
            raise GovernanceError(f"{by.name} is not an active account")
        if current.user.role != "governance" and (for_self is None or canonical(for_self) != by.name):
            raise GovernanceError(f"{by.name} ({current.user.role}) may not change accounts; governance does that")
        return folded

    def _set_disabled(self, name: str, disabled: bool, by: User | None, at: str) -> User:
        with self.store.transaction():
            account = self._known(self._changing(by), name)
            if by is not None and by.name == account.user.name and disabled:
                raise UsageError("an account cannot disable itself")
            if account.user.disabled != disabled:
                self._record(by, at, account.user.name, "disabled" if disabled else "enabled")
                self.store.command(
                    "UPDATE users SET disabled_at = ? WHERE name = ?",
                    (self._now() if disabled else None, account.user.name),
                )
        return replace(account.user, disabled=disabled)

    def _record(self, by: User | None, at: str, name: str, change: str, **data: Any) -> None:
        self.store.append_event(
            plan_id=None,
            version=None,
            step_id=None,
            kind=EVENT,
            actor=by.name if by is not None else "local operator",
            at=at or self._now(),
            data={"name": name, "change": change, **data},
        )

    def _known(self, folded: dict[str, _Account], name: str) -> _Account:
        account = folded.get(canonical(name))
        if account is None:
            raise NotFoundError(f"no account {canonical(name)!r}")
        return account

    def _now(self) -> str:
        return iso(self.clock.now())


def _saved(accounts: dict[str, _Account], name: str, data: dict[str, Any], at: str) -> None:
    old = accounts.get(name)
    user = User(
        name=name,
        role=data["role"],
        categories=tuple(data["categories"]),
        slack_id=data.get("slack_id"),
        disabled=old.user.disabled if old else False,
    )
    if old is None:
        accounts[name] = _Account(user=user, password=data["password"])
        return
    if old.password != data["password"]:  # a new password ends the sessions begun with the old
        old.sessions_cut = at
    old.user, old.password = user, data["password"]


def _switched(account: _Account, data: dict[str, Any], at: str, *, disabled: bool) -> None:
    account.user = replace(account.user, disabled=disabled)
    if disabled:
        account.sessions_cut = at


def _signed_out(account: _Account, data: dict[str, Any], at: str) -> None:
    account.signed_out.add(data["session"])


def _token_issued(account: _Account, data: dict[str, Any], at: str) -> None:
    token = Token(
        id=data["token"], user=account.user.name, label=data["label"], created_at=at, expires_at=data["expires_at"]
    )
    account.tokens[token.id] = (data["digest"], token)


def _token_revoked(account: _Account, data: dict[str, Any], at: str) -> None:
    for token_id in data["tokens"]:
        digest, token = account.tokens[token_id]
        account.tokens[token_id] = (digest, replace(token, revoked_at=at))
    if data.get("all"):
        account.sessions_cut = at


_CHANGES: dict[str, Callable[[_Account, dict[str, Any], str], None]] = {
    "disabled": partial(_switched, disabled=True),
    "enabled": partial(_switched, disabled=False),
    "signed-out": _signed_out,
    "token.issued": _token_issued,
    "token.revoked": _token_revoked,
}
"""How each change other than ``saved`` applies to the account it names."""


def _refuse_look_alike(name: str, folded: dict[str, _Account]) -> None:
    for other in folded:
        if skeleton(other) == skeleton(name):
            raise UsageError(f"the user name {name!r} looks like the existing account {other!r}")


@functools.cache
def _hasher() -> Any:
    """Argon2id, loaded only where a password is checked or set (tokens and sessions need no extra)."""
    need("server", "passwords", ("argon2",))
    from argon2 import PasswordHasher

    return PasswordHasher()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
