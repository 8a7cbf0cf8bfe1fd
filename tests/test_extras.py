"""Every command that needs an extra says which one, in one line, with exit code 2.

Each extra's modules are made to look missing (``sys.modules[name] = None`` makes an
import of them fail), then the command that needs them is run.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from plangate import accounts
from plangate._extras import EXTRAS, MissingExtraError, need
from plangate.cli import main
from tests.conftest import EXAMPLES, ROOT

TOOLS = str(EXAMPLES / "business.py")


def missing(monkeypatch: pytest.MonkeyPatch, extra: str) -> None:
    for module in EXTRAS[extra]:
        monkeypatch.setitem(sys.modules, module, None)


CASES = {
    "serve": ("server", ["serve", "--tools", TOOLS]),
    "passwords": ("server", ["users", "add", "gina", "--role", "governance", "--password-stdin"]),
    "worker --temporal": ("temporal", ["worker", "--temporal", "127.0.0.1:1", "--tools", TOOLS]),
    "worker --metrics-port": ("metrics", ["worker", "--metrics-port", "9", "--tools", TOOLS]),
    "mcp serve": ("mcp", ["mcp", "serve", "--tools", TOOLS, "--as", "alice"]),
    "a PostgreSQL store": ("postgres", ["list", "--db", "postgresql://nobody@127.0.0.1:1/none"]),
    "the anthropic model provider": ("anthropic", ["plan", "a task", "--tools", TOOLS, "--model", "anthropic:m"]),
    "the openai model provider": ("openai", ["plan", "a task", "--tools", TOOLS, "--model", "openai:m"]),
    "the openai-compatible model provider": (
        "openai",
        ["plan", "a task", "--tools", TOOLS, "--model", "openai-compatible:m", "--base-url", "http://127.0.0.1:1/v1"],
    ),
    "the llamacpp model provider": ("llamacpp", ["plan", "a task", "--tools", TOOLS, "--model", "llamacpp:m.gguf"]),
}


@pytest.mark.parametrize("what", CASES)
def test_a_command_without_its_extra_names_the_install_in_one_line(
    what: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    extra, args = CASES[what]
    missing(monkeypatch, extra)
    accounts._hasher.cache_clear()  # an earlier test in this process may have loaded argon2 already
    monkeypatch.setenv("PLANGATE_DB", f"sqlite:///{tmp_path}/plangate.db")
    result = CliRunner().invoke(main, args, input="a-password\n")
    assert result.exit_code == 2, result.output
    accounts._hasher.cache_clear()
    assert result.stderr == f"plangate: {what} needs the {extra} extra: pip install 'plangate[{extra}]'\n"


def test_every_extra_in_the_project_is_known() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) == set(declared) - {"test", "bench"}


def test_need_passes_when_the_modules_import(monkeypatch: pytest.MonkeyPatch) -> None:
    need("server", "serve", ("json",))
    monkeypatch.setitem(sys.modules, "json", None)
    with pytest.raises(MissingExtraError, match=r"^x needs the server extra"):
        need("server", "x", ("json",))
