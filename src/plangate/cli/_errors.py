"""How a command ends: its exit code, and plangate's own errors as one plain line.

    0  done
    1  the plan has violations or was rejected (or the audit log does not verify)
    2  the input could not be read or used: a missing file, text that is not JSON, a plan
       of the wrong shape, a bad policy or tools module, an unknown id (any PlangateError
       that is not a refusal)
    3  the run halted
    4  refused by a governance rule (a GovernanceError: self-approval, a stale hash,
       executing an unapproved plan...)

Commands exit with 1 and 3 themselves, from the result they got. Codes 2 and 4 come from
one place, :class:`PlainErrors`, the class of the top group: a plangate error raised by
any command below it ends the command with ``plangate: ...`` on standard error, never a
traceback; so does the database's driver when the store goes away mid-command (exit 2). Any other
exception is a bug (plangate's or a tool's) and keeps its traceback.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from plangate.errors import GovernanceError, PlangateError

EXIT_VIOLATIONS = 1
EXIT_BAD_INPUT = 2
EXIT_HALTED = 3
EXIT_REFUSED = 4


def exit_code(exc: PlangateError) -> int:
    """The exit code for one of plangate's errors: 4 for a refusal, 2 for the rest."""
    return EXIT_REFUSED if isinstance(exc, GovernanceError) else EXIT_BAD_INPUT


def message(exc: PlangateError) -> str:
    """The one line shown for one of plangate's errors."""
    return f"plangate: refused: {exc}" if isinstance(exc, GovernanceError) else f"plangate: {exc}"


class PlainErrors(click.Group):
    """A group whose commands, and its subgroups' commands, end a plangate error plainly.

    The catch sits around the whole invocation, so a command cannot be added without it.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PlangateError as exc:
            click.echo(message(exc), err=True)
            sys.exit(exit_code(exc))
        except Exception as exc:
            if not store_failed(exc):
                raise
            said = " ".join(str(exc).split()) or type(exc).__name__
            click.echo(
                f"plangate: the store could not be used ({said}); what was recorded before stays recorded, and the "
                "command can be run again once the store answers",
                err=True,
            )
            sys.exit(EXIT_BAD_INPUT)


def store_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the database's driver saying the store could not be used mid-command (a connection
    cut by a server restart or a network, a disk error), not a bug: the store's own errors are plangate's."""
    import sqlite3

    if isinstance(exc, sqlite3.OperationalError):  # not "no such table" and the like: those are bugs
        return any(said in str(exc) for said in _SQLITE_FAILURES)
    psycopg = sys.modules.get("psycopg")  # loaded only where a PostgreSQL store was opened
    return psycopg is not None and isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))


_SQLITE_FAILURES = ("database is locked", "disk I/O error", "unable to open database file", "database or disk is full")
