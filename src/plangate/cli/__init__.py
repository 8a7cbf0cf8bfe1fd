"""The ``plangate`` command line: one module per group of commands.

Exit codes (``_errors.py`` holds the mapping): 0 success; 1 the plan has violations (or
was rejected); 2 the input could not be read (a missing file, text that is not JSON, a
plan of the wrong shape, a bad policy or tools module); 3 the run halted; 4 the request
was refused by a governance rule (self-approval, a stale hash, executing an unapproved
plan...).

Commands import what they alone need (the server, Temporal, model SDKs) when they run,
so ``plangate --help`` stays quick.
"""

from __future__ import annotations

import click

from plangate import __version__, tracing
from plangate.cli import (
    _admin,
    _audit,
    _demo,
    _eval,
    _governance,
    _init,
    _mcp,
    _planning,
    _plans,
    _react,
    _replay,
    _retention,
    _run,
    _users,
    _versions,
)
from plangate.cli._errors import PlainErrors

__all__ = ["main"]


@click.group(cls=PlainErrors, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="plangate")
def main() -> None:
    """plangate: a governed agent runtime. Plans are typed, checked, approved, then run.

    \b
    Who you are: a store with no accounts is in local mode (one operator; the name given
    with --as is recorded). Once it has accounts (plangate users add), every command that
    records a decision or starts work needs your API token: plangate login NAME, or
    --token / PLANGATE_TOKEN. See docs/security.md.
    """
    click.get_current_context().call_on_close(tracing.flush)  # a short command's spans go out before it ends


for _module in (
    _plans,
    _versions,
    _run,
    _replay,
    _audit,
    _planning,
    _react,
    _eval,
    _admin,
    _governance,
    _retention,
    _users,
    _demo,
    _init,
    _mcp,
):
    for _command in _module.COMMANDS:
        main.add_command(_command)
