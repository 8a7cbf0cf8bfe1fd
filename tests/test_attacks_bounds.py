"""Answers of gigabytes from outside: an MCP server over HTTP and a model provider, each a hostile server of
the tests' own on loopback (tests/hostile_http.py). Each is cut off while read, not once read whole."""

from __future__ import annotations

import json
from pathlib import Path

from plangate import Runtime
from plangate.policy import Policy
from plangate.tools import Catalogue
from tests.hostile_http import mcp_answers, serving
from tests.test_attacks_mcp import POLICY, approved

HUGE = 256 * 1024 * 1024  # far more than any socket buffer holds: the server cannot finish unless read
TEXT = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}


def test_over_http_a_json_answer_over_the_size_limit_is_cut_off_while_read(tmp_path: Path) -> None:
    """A server that answers a call with a plain JSON body of 256 MiB: reading stops past the bound, the
    server cannot finish writing, and the call's outcome is unknown (the server answered): the step halts."""
    tool = {"name": "huge", "inputSchema": TEXT}
    with serving(mcp_answers(tool), HUGE, "/mcp") as hostile:
        spec = "mcp:" + hostile.url
        catalogue = Catalogue.from_spec(spec)
        runtime = Runtime(catalogue, Policy.from_yaml(POLICY), db=f"sqlite:///{tmp_path}/p.db", tools=spec)
        with catalogue:
            plan_id = approved(runtime, "huge", note="x")
            halted = runtime.execute(plan_id, actor="bob")
            assert hostile.ended.wait(60), "the server is still writing: the client kept reading"
        assert not hostile.finished and hostile.written < HUGE // 8
        assert halted.status == "halted" and "outcome unknown" in (halted.error or ""), halted.error
        assert "too-large: the answer is over the limit of 6356992 bytes" in (halted.error or ""), halted.error
        calls = [r for r in hostile.received if r.get("method") == "tools/call"]
        assert len(calls) == 1
    logged = sum(len(json.dumps(e.data)) for e in runtime.trace(plan_id))
    assert logged < 20_000, "the refused answer is not in the audit log"
