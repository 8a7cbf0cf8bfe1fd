"""More attacks by a hostile MCP server: a tool list that never comes, or never ends; a result of megabytes."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from plangate import Runtime
from plangate.errors import CatalogueError
from plangate.policy import Policy
from plangate.tools import Catalogue
from plangate.tools._mcpconn import MAX_RESULT_BYTES
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


def test_a_result_over_the_size_limit_is_refused_and_its_call_not_made_again(tmp_path: Path) -> None:
    """A server that answers with megabytes: the output is refused (the log keeps none of it), and since
    the server answered, the call's effect may have happened: a tool that is not idempotent halts for a person."""
    server = Server(tmp_path)
    catalogue = Catalogue.from_spec(server.spec)
    runtime = Runtime(catalogue, Policy.from_yaml(POLICY), db=f"sqlite:///{tmp_path}/p.db", tools=server.spec)
    with catalogue:
        plan_id = approved(runtime, "huge", note=str(MAX_RESULT_BYTES))
        halted = runtime.execute(plan_id, actor="bob")
        assert halted.status == "halted" and "outcome unknown" in (halted.error or ""), halted.error
        assert f"over the limit of {MAX_RESULT_BYTES} bytes (max_result_bytes)" in (halted.error or "")
        assert runtime.resume(plan_id, actor="bob").status == "halted"  # not called again: a person settles it
    assert len(server.calls("huge")) == 1
    logged = sum(len(json.dumps(e.data)) for e in runtime.trace(plan_id))
    assert logged < 20_000, "the refused output is not in the audit log"


def test_a_line_of_output_past_the_result_limit_is_not_read_on(tmp_path: Path) -> None:
    """A server that writes one line that never ends: the reading stops at the bound a result may take on the
    wire (the SDK's own stdio client would keep it all until the call's time limit), and the call is refused."""
    server = Server(tmp_path)
    catalogue = Catalogue.from_mcp(server.spec, max_result_bytes=1_000)
    policy = Policy.from_yaml(POLICY + "limits: {tool_timeout: 60}\n")
    runtime = Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/p.db", tools=server.spec)
    with catalogue:
        halted = runtime.execute(approved(runtime, "flood", note=str(8 * 1024 * 1024)), actor="bob")
    assert halted.status == "halted" and "outcome unknown" in (halted.error or ""), halted.error
    said = "too-large: a line is over the limit of 71536 bytes: reading stopped (max_result_bytes is 1000)"
    assert said in (halted.error or ""), halted.error
    assert len(server.calls("flood")) == 1


@pytest.mark.parametrize(("note", "ok"), [("4000", True), ("6000", False), ("6000 error", False)])
def test_a_tools_file_sets_a_servers_result_limit(tmp_path: Path, note: str, ok: bool) -> None:
    server = Server(tmp_path)
    tools = tmp_path / "tools.yaml"
    tools.write_text(f"sources:\n  - mcp: {json.dumps(server.spec)}\n    max_result_bytes: 5000\n")
    catalogue = Catalogue.from_spec(str(tools))
    runtime = Runtime(catalogue, Policy.from_yaml(POLICY), db=f"sqlite:///{tmp_path}/p.db", tools=str(tools))
    with catalogue:
        result = runtime.execute(approved(runtime, "huge", note=note), actor="bob")
    assert result.ok is ok, result.error
    if note.endswith("error"):  # the server said the call failed: a failure, not an unknown outcome
        assert "McpToolError: the MCP tool 'huge' reported an error of" in (result.error or ""), result.error
        assert "outcome unknown" not in (result.error or "") and "xxxx" not in (result.error or "")
    elif not ok:
        assert "over the limit of 5000 bytes (max_result_bytes)" in (result.error or ""), result.error
