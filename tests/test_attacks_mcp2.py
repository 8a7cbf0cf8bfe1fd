"""More attacks by a hostile MCP server: a tool list that never comes, or never ends."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from plangate import Runtime
from plangate.errors import CatalogueError
from plangate.policy import Policy
from plangate.tools import Catalogue
from tests.test_attacks_mcp import POLICY, Server, approved


def _within(seconds: float, fn: Any) -> Any:
    """``fn()``'s result or exception, or a test failure when it has not returned within ``seconds``."""
    found: dict[str, Any] = {}

    def run() -> None:
        try:
            found["value"] = fn()
        except BaseException as exc:  # handed to the test
            found["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still waiting after {seconds:g} s")
    if "error" in found:
        raise found["error"]
    return found["value"]


@pytest.mark.parametrize("state", ["list-hangs", "endless"])
def test_a_tool_list_that_never_comes_or_never_ends_is_one_line_not_a_hang(tmp_path: Path, state: str) -> None:
    server = Server(tmp_path, state)
    with pytest.raises(CatalogueError, match="tool list cannot be read"):
        _within(30, lambda: Catalogue.from_mcp(server.spec, connect_seconds=3).close())


def test_a_server_that_comes_back_and_never_lists_its_tools_is_drift_not_a_hang(tmp_path: Path) -> None:
    server = Server(tmp_path)
    catalogue = Catalogue.from_mcp(server.spec, connect_seconds=3)
    runtime = Runtime(catalogue, Policy.from_yaml(POLICY), db=f"sqlite:///{tmp_path}/p.db", tools=server.spec)
    with catalogue:
        plan_id = approved(runtime, "liar", note="x")
        server.state.write_text("list-hangs")
        for held in catalogue._holds:  # type: ignore[attr-defined]
            held.close()  # the server restarts; the next call opens it again
        refused = _within(30, lambda: runtime.execute(plan_id, actor="bob"))
        assert refused.status == "halted" and "(drift): nothing was called" in (refused.error or ""), refused.error
    assert server.calls("liar") == []
