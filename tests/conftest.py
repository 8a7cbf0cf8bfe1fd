from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp.client.stdio  # noqa: F401  (see below)
import pytest

from plangate import Catalogue, Policy

# The MCP SDK's stdio_client takes `errlog=sys.stderr` as a default bound when its module is
# first imported. Imported here, that is a stream with a file descriptor; imported first by a
# test that runs a command through click's CliRunner (which swaps sys.stderr for an in-memory
# one), every later stdio_client in that process would fail to start its server.

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture(autouse=True, scope="session")
def audit_key_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One audit key and one server secret for the session, made in a temporary folder on first use,
    and a configuration folder of its own: no test touches ~/.config or picks up a token from outside.

    Set in the environment, so the plangate processes tests start use them too.
    """
    folder = tmp_path_factory.mktemp("keys")
    path = folder / "audit.key"
    with pytest.MonkeyPatch.context() as patch:
        for variable in ("PLANGATE_AUDIT_KEY", "PLANGATE_SECRET_KEY", "PLANGATE_TOKEN", "PLANGATE_SERVER"):
            patch.delenv(variable, raising=False)
        patch.setenv("PLANGATE_AUDIT_KEY_FILE", str(path))
        patch.setenv("PLANGATE_SECRET_KEY_FILE", str(folder / "secret.key"))
        patch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
        yield path


@pytest.fixture(autouse=True)
def example_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own example-business database."""
    path = tmp_path / "business.db"
    monkeypatch.setenv("PLANGATE_EXAMPLE_DB", str(path))
    yield path


@pytest.fixture(scope="session")
def catalogue() -> Catalogue:
    return Catalogue.from_module(EXAMPLES / "business.py")


@pytest.fixture(scope="session")
def policy() -> Policy:
    return Policy.load(EXAMPLES / "policy.yaml")


def load_plan(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EXAMPLES / "plans" / f"{name}.json").read_text())
    return data


@pytest.fixture
def refund_plan() -> dict[str, Any]:
    return load_plan("refund")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """One throwaway PostgreSQL cluster on loopback for the session (per test worker)."""
    from plangate.testing import postgres_cluster

    with postgres_cluster() as url:
        yield url


_DATABASES = itertools.count()


@pytest.fixture
def pg_db(pg_server: str) -> str:
    """A fresh database on the session's PostgreSQL cluster."""
    from plangate.testing import fresh_database

    return fresh_database(pg_server, f"test_{os.getpid()}_{next(_DATABASES)}")


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL, once on SQLite and once on PostgreSQL: for tests where the store matters."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/plangate.db"
    from plangate.testing import fresh_database

    return fresh_database(request.getfixturevalue("pg_server"), f"test_{os.getpid()}_{next(_DATABASES)}")
