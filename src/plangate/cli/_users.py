"""Accounts and signing in: users add, list, token, disable, enable, revoke; login, logout.

With no accounts the store is in local mode and the first ``users add`` needs nothing.
Once there are accounts, changing them takes a governance account's token, and every
change is an audit event; ``plangate login`` gets a token for yourself with your password.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from plangate.cli import _remote
from plangate.cli._common import db_option, open_runtime, token_option
from plangate.cli._remote import server_option
from plangate.errors import UsageError

_EXPIRES = click.option(
    "--expires",
    default="90d",
    show_default=True,
    metavar="DURATION",
    help="How long the token lives: days or hours, such as 30d or 12h (at most 366d).",
)


def _by(runtime: Any, token: str | None) -> Any:
    """The account making a change to accounts: the token's, or the local operator (None) in local mode."""
    from plangate import identity

    return identity.actor(runtime.store, token=identity.find_token(token), claimed=None, default="local").user


@click.group("users")
def users_group() -> None:
    """Accounts for the command line, the dashboard and the API (each change an audit event)."""


@users_group.command("add")
@click.argument("name")
@click.option("--role", required=True, type=click.Choice(["requester", "approver", "governance", "auditor"]))
@click.option(
    "--category",
    "categories",
    multiple=True,
    metavar="PATTERN",
    help="Plan categories an approver may decide on (repeat; '*' for all).",
)
@click.option("--slack-id", metavar="ID", help="The person's chat user id (U…), for approving from chat messages.")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@token_option
@db_option
def users_add_command(
    *,
    name: str,
    role: str,
    categories: tuple[str, ...],
    slack_id: str | None,
    password_stdin: bool,
    token: str | None,
    db: str | None,
) -> None:
    """Add (or change) user NAME with a role; asks for a password at a terminal.

    Names are kept in one form (case-folded, Unicode NFKC): Alice and alice are one
    account, and a name that mixes scripts or looks like an existing one is refused.
    """
    from plangate.accounts import Accounts

    password = _password(password_stdin)
    runtime = open_runtime(db)
    accounts = Accounts(runtime.store, runtime.clock)
    user = accounts.add(name, role, password=password, categories=categories, slack_id=slack_id, by=_by(runtime, token))
    scope = f", may decide on {', '.join(categories)}" if categories else ""
    click.echo(f"user {user.name}: {user.role}{scope}" + ("" if password else " (no password: API tokens only)"))


def _password(from_stdin: bool) -> str | None:
    if from_stdin:
        try:
            return sys.stdin.readline().rstrip("\n")
        except UnicodeDecodeError:
            raise UsageError("the password on standard input is not text") from None
    if sys.stdin.isatty():
        return str(click.prompt("password", hide_input=True, confirmation_prompt=True))
    return None


@users_group.command("list")
@db_option
def users_list_command(*, db: str | None) -> None:
    """List the accounts, with their roles, categories and live tokens."""
    from plangate.accounts import Accounts

    runtime = open_runtime(db)
    accounts = Accounts(runtime.store, runtime.clock)
    now = runtime.clock.now()
    users = accounts.all()
    for user in users:
        live = [t for t in accounts.tokens(user.name) if t.live(now)]
        state = "DISABLED " if user.disabled else ""
        scope = f" [{', '.join(user.categories)}]" if user.categories else ""
        chat = f" chat:{user.slack_id}" if user.slack_id else ""
        click.echo(f"{user.name:<16} {state}{user.role}{scope}{chat}  {len(live)} live token(s)")
        for t in live:
            click.echo(f"    token {t.id}  {t.label!r}  expires {t.expires_at[:16]}")
    if not users:
        click.echo("no accounts: the store is in local mode (names given with --as are recorded as given)")


@users_group.command("token")
@click.argument("name")
@click.option("--label", default="api", show_default=True, help="What the token is for.")
@_EXPIRES
@token_option
@db_option
def users_token_command(*, name: str, label: str, expires: str, token: str | None, db: str | None) -> None:
    """Issue an API token for NAME (shown once; only its digest is kept)."""
    from plangate.accounts import Accounts, duration

    runtime = open_runtime(db)
    accounts = Accounts(runtime.store, runtime.clock)
    click.echo(accounts.issue_token(name, label, lifetime=duration(expires), by=_by(runtime, token)))


def _switch(disabled: bool, done: str) -> Callable[[Callable[..., None]], click.Command]:
    """``users disable`` and ``users enable``: one account switched off or on."""

    def command(fn: Callable[..., None]) -> click.Command:
        @users_group.command(fn.__name__.removeprefix("users_"), help=fn.__doc__)
        @click.argument("name")
        @token_option
        @db_option
        def switch(*, name: str, token: str | None, db: str | None) -> None:
            from plangate.accounts import Accounts

            runtime = open_runtime(db)
            accounts = Accounts(runtime.store, runtime.clock)
            by = _by(runtime, token)
            user = accounts.disable(name, by=by) if disabled else accounts.enable(name, by=by)
            click.echo(f"user {user.name} {done}")

        return switch

    return command


@_switch(True, "disabled: tokens refused, sessions ended")
def users_disable() -> None:
    """Disable NAME: their tokens and sessions stop working at once."""


@_switch(False, "enabled")
def users_enable() -> None:
    """Enable NAME again (ended sessions stay ended)."""


@users_group.command("revoke")
@click.argument("name")
@click.option("--token-id", "token_id", metavar="ID", help="Only this token (see users list); default: all of them.")
@token_option
@db_option
def users_revoke_command(*, name: str, token_id: str | None, token: str | None, db: str | None) -> None:
    """Revoke NAME's tokens (all, ending their sessions too, or one with --token-id)."""
    from plangate.accounts import Accounts

    runtime = open_runtime(db)
    revoked = Accounts(runtime.store, runtime.clock).revoke(name, token_id, by=_by(runtime, token))
    ids = ", ".join(t.id for t in revoked) or "none were live"
    click.echo(f"revoked {name}'s token(s): {ids}" + ("" if token_id else "; sessions ended"))


@click.command("login")
@click.argument("name")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@_EXPIRES
@click.option("--print", "print_only", is_flag=True, help="Print the token instead of keeping it.")
@db_option
@server_option
def login_command(
    *, name: str, password_stdin: bool, expires: str, print_only: bool, db: str | None, server: str | None
) -> None:
    """Sign in as NAME with your password: get an API token for this command line.

    The token is kept in $XDG_CONFIG_HOME/plangate/token (mode 0600), where later commands
    find it; --print shows it instead (for PLANGATE_TOKEN).
    """
    import platform

    from plangate import identity
    from plangate.accounts import Accounts, duration
    from plangate.errors import SignInRequiredError

    password = _password(password_stdin)
    lifetime, label = duration(expires), f"cli {platform.node()}"[:64]
    if server:
        body = {"name": name, "password": password or "", "label": label, "expires": expires}
        reply = _remote.client(server, None).call("POST", "/tokens", body)
        token, who, role = reply["token"], reply["user"], reply["role"]
    else:
        runtime = open_runtime(db)
        accounts = Accounts(runtime.store, runtime.clock)
        user = accounts.login(name, password or "")
        if user is None:
            raise SignInRequiredError(f"wrong user or password for {name!r} (or the account is disabled)")
        token, who, role = accounts.issue_token(user.name, label, lifetime=lifetime, by=user), user.name, user.role
    if print_only:
        click.echo(token)
        return
    path = identity.save_token(token)
    click.echo(f"signed in as {who} ({role}); token kept in {path}, expires in {expires}")


@click.command("logout")
@db_option
def logout_command(*, db: str | None) -> None:
    """Revoke the token `plangate login` kept, and forget it."""
    from plangate import identity
    from plangate.accounts import Accounts

    token = identity.find_token()
    if token is None:
        click.echo("not signed in")
        return
    runtime = open_runtime(db)
    accounts = Accounts(runtime.store, runtime.clock)
    user = accounts.by_token(token)
    token_id = token.split("_")[1] if token.count("_") >= 2 else None
    if user is not None and token_id:
        accounts.revoke(user.name, token_id, by=user)
    identity.forget_token()
    click.echo("signed out" + (f" ({user.name}'s token revoked)" if user else ""))


COMMANDS = (users_group, login_command, logout_command)
