"""``plangate init DIR``: a starter project, your tools, policy and plans, that checks as written.

The files are package data (``plangate/data/starter/``), copied as they are.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

import click

from plangate.errors import UsageError

STARTER = ("README.md", "tools.py", "policy.yaml", "plans/lookup.json", "plans/close.json")


@click.command("init")
@click.argument("folder", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Write into DIR even if it is not empty (overwriting the starter's files).")
def init_command(*, folder: Path, force: bool) -> None:
    """Write a starter project in DIR: typed tools, a policy, two plans and a README."""
    if folder.exists() and any(folder.iterdir()) and not force:
        raise UsageError(f"{folder} is not empty: choose another folder, or add --force to write into it")
    source = files("plangate") / "data" / "starter"
    for name in STARTER:
        _copy(source.joinpath(*name.split("/")), folder / name)
    click.echo(f"wrote a starter project in {folder}: {', '.join(STARTER)}")
    click.echo(f"next: cd {folder} && plangate check plans/close.json --tools tools.py --policy policy.yaml --as alice")
    click.echo("(its README.md has the rest: submit, approve, execute, trace)")


def _copy(source: Traversable, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())


COMMANDS = (init_command,)
