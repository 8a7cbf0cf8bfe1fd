from __future__ import annotations

import sys
from pathlib import Path

import pytest

from plangate import Catalogue, CatalogueError, tool
from tests.conftest import EXAMPLES


@tool
def alpha(x: int) -> int:
    return x


@tool(effect="write", compensate="alpha")
def beta(x: int) -> int:
    return x


def gamma(y: str) -> str:
    """A plain typed function becomes a read tool."""
    return y


def test_built_from_a_list_of_tools_and_plain_functions() -> None:
    cat = Catalogue([alpha, beta, gamma])
    assert cat.names == ["alpha", "beta", "gamma"]
    assert "gamma" in cat and len(cat) == 3
    assert cat["gamma"].description == "A plain typed function becomes a read tool."
    assert cat.get("nope") is None
    with pytest.raises(KeyError, match="no tool named 'nope'"):
        cat["nope"]
    assert [d["name"] for d in cat.describe()] == cat.names


def test_duplicates_and_dangling_compensations_are_refused() -> None:
    with pytest.raises(CatalogueError, match="two tools are named 'alpha'"):
        Catalogue([alpha, alpha])
    with pytest.raises(CatalogueError, match="undone by 'alpha', which is not in the catalogue"):
        Catalogue([beta])


def test_loaded_from_a_file_path() -> None:
    cat = Catalogue.from_module(EXAMPLES / "business.py")
    assert {"get_invoice", "issue_refund", "send_email"} <= set(cat.names)
    again = Catalogue.from_module(str(EXAMPLES / "business.py"))
    assert again["get_invoice"] is cat["get_invoice"], "a file is imported once"


def test_loaded_from_an_import_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "acme"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tools.py").write_text(
        "from plangate import tool\n\n@tool\ndef ping(host: str) -> bool:\n    return True\n\nalias = ping\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cat = Catalogue.from_module("acme.tools")
    assert cat.names == ["ping"], "a tool bound to two names is listed once"
    assert Catalogue.from_module(sys.modules["acme.tools"]).names == ["ping"]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("no_such_module_xyz", "cannot import tools module 'no_such_module_xyz'"),
        ("missing/tools.py", "does not exist"),
    ],
)
def test_unloadable_modules_fail_clearly(source: str, message: str) -> None:
    with pytest.raises(CatalogueError, match=message):
        Catalogue.from_module(source)


def test_a_module_that_raises_or_has_no_tools(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(CatalogueError, match="failed while importing: RuntimeError: boom"):
        Catalogue.from_module(broken)
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(CatalogueError, match="defines no tools"):
        Catalogue.from_module(empty)
