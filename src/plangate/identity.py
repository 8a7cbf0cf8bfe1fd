"""Who is acting, and what they may do: one answer for the command line and the server.

A store with no accounts is in **local mode**: one operator, who holds the database and
the audit key, types names with ``--as`` and plangate records them (in canonical form,
:mod:`plangate.names`). Once the store has an account, it is in **token mode**: every
command that records a decision or starts work needs an API token (``--token``,
``PLANGATE_TOKEN``, or the file ``plangate login`` keeps at
``$XDG_CONFIG_HOME/plangate/token``, mode 0600), and the actor is the token's account;
``--as``, if given, must name it. The server asks the same questions of a session or a
bearer token, and :func:`permit` is the one table of who may do what.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from plangate._clock import Clock
from plangate._keys import config_dir
from plangate.accounts import Accounts, User
from plangate.errors import NotPermittedError, SignInRequiredError, UsageError
from plangate.names import canonical
from plangate.store import Store

TOKEN_VARIABLE = "PLANGATE_TOKEN"
SIGN_IN = "sign in with `plangate login NAME`, or pass --token / set PLANGATE_TOKEN to an API token"
Doing = Literal["submit", "edit", "execute", "decide", "register", "accounts", "library", "retention"]


@dataclass(frozen=True)
class Actor:
    """The name to record, and the account behind it (``None`` in local mode)."""

    name: str
    user: User | None = None


def token_path() -> Path:
    return config_dir() / "token"


def find_token(explicit: str | None = None) -> str | None:
    """The token to use: ``--token``, else ``PLANGATE_TOKEN``, else the one ``plangate login`` kept."""
    if explicit:
        return explicit.strip()
    if value := os.environ.get(TOKEN_VARIABLE, "").strip():
        return value
    path = token_path()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot read the token file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            raise UsageError(f"the token file {path} must be a regular file only you may read: chmod 600 {path}")
        return os.read(fd, 4096).decode("ascii", errors="replace").strip() or None
    finally:
        os.close(fd)


def save_token(token: str) -> Path:
    """Keep ``token`` for later commands, in a file only this user may read."""
    path = token_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".token.")  # mode 0600
    with os.fdopen(fd, "w") as file:
        file.write(token + "\n")
    os.replace(temporary, path)
    return path


def forget_token() -> bool:
    try:
        token_path().unlink()
    except FileNotFoundError:
        return False
    return True


def actor(
    store: Store, *, token: str | None, claimed: str | None, default: str | None = None, clock: Clock | None = None
) -> Actor:
    """Who acts: in token mode the account of ``token`` (``claimed`` must name it); in local mode ``claimed``.

    Refused when the store has accounts and no live token is given
    (:class:`~plangate.errors.SignInRequiredError`), or the token's account is not the one
    claimed (:class:`~plangate.errors.NotPermittedError`).
    """
    accounts = Accounts(store, clock)
    user = accounts.by_token(token) if token else None  # a live token proves accounts exist: one fold, not two
    if user is None and not accounts.any():
        name = claimed if claimed is not None else default
        if name is None or not canonical(name):
            raise UsageError("say who you are with --as NAME")
        return Actor(canonical(name))
    if not token:
        raise SignInRequiredError(f"this store has accounts: {SIGN_IN}")
    if user is None:
        raise SignInRequiredError(f"the token is unknown, expired or revoked, or its account is disabled: {SIGN_IN}")
    if claimed is not None and canonical(claimed) != user.name:
        raise NotPermittedError(f"--as {claimed} does not match the token's account {user.name}")
    return Actor(user.name, user)


def permit(user: User | None, doing: Doing, category: str | None = None, *, requested_by: str | None = None) -> None:
    """Refuse ``doing`` to an account whose role does not allow it; the local operator (``None``) may do all.

    With ``requested_by``, the plan must also be one the account may see (its own, or of a
    category it decides, or any for auditors and governance): nobody runs a plan hidden from them.
    """
    if user is None:
        return
    if requested_by is not None and not user.may_read(category=category or "", requested_by=requested_by):
        raise NotPermittedError(
            f"{user.name} ({user.role}) may not see plans of {requested_by} in category {category!r}"
        )
    if user.disabled:
        raise NotPermittedError(f"the account {user.name} is disabled")
    if user.read_only:
        raise NotPermittedError(f"{user.name} is an auditor: auditors read, they do not change anything")
    if doing in ("register", "accounts", "retention") and user.role != "governance":
        raise NotPermittedError(f"{user.name} ({user.role}) may not change the {doing}; governance does that")
    if doing in ("decide", "library") and not user.may_approve(category or ""):
        raise NotPermittedError(f"{user.name} ({user.role}) may not decide on plans of category {category!r}")
