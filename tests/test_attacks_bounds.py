"""Answers of gigabytes from outside: an MCP server over HTTP and a model provider, each a hostile server of
the tests' own on loopback (tests/hostile_http.py). Each is cut off while read, not once read whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from plangate import Runtime
from plangate.models import Model
from plangate.models._base import MAX_RESPONSE_BYTES
from plangate.models.anthropic import AnthropicModel
from plangate.models.openai import OpenAIModel
from plangate.planner import Planner, PlanningError
from plangate.policy import Policy
from plangate.tools import Catalogue
from tests.helpers import FixedClock
from tests.hostile_http import mcp_answers, model_answers, serving
from tests.test_attacks_mcp import POLICY, approved

HUGE = 256 * 1024 * 1024  # far more than any socket buffer holds: the server cannot finish unless read
RECORDINGS = Path(__file__).with_name("recordings")
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


def _claude(url: str) -> Model:
    return AnthropicModel("claude-sonnet-4-6", api_key="k", base_url=url, max_retries=0)


def _gpt(url: str) -> Model:
    return OpenAIModel("o4-mini", api_key="k", base_url=url + "/v1", max_retries=0)


@pytest.mark.parametrize(
    ("recording", "text_at", "model"),
    [
        ("anthropic_answer.json", ("content", 0, "text"), _claude),
        ("openai_answer.json", ("choices", 0, "message", "content"), _gpt),
    ],
)
def test_a_model_reply_over_the_size_limit_is_cut_off_and_recorded_failed_at_no_cost(
    tmp_path: Path, catalogue: Catalogue, policy: Policy, recording: str, text_at: tuple[Any, ...], model: Any
) -> None:
    """A base URL that points at a server answering in the API's shape with 256 MiB of text: the SDK's read
    stops past the adapter's limit, the server cannot finish writing, and the planner records the call as
    failed, at cost 0, saying why."""
    recorded = json.loads((RECORDINGS / recording).read_text())
    runtime = Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/p.db", clock=FixedClock())
    assert runtime.catalogue is not None
    with serving(model_answers(recorded, text_at), HUGE) as hostile:
        planner = Planner(runtime.catalogue, model=model(hostile.url.rstrip("/")), store=runtime.store)
        with pytest.raises(PlanningError, match="malformed response") as err:
            planner.plan("Refund invoice 42")
        assert hostile.ended.wait(60), "the server is still writing: the client kept reading"
    assert not hostile.finished and hostile.written < HUGE // 8
    assert f"too-large: the answer is over the limit of {MAX_RESPONSE_BYTES} bytes" in str(err.value)
    (row,) = err.value.calls
    assert row.ok is False and row.cost == 0.0 and "max_response_bytes" in (row.error or "")
    assert [c.cost for c in runtime.store.calls()] == [0.0]
    assert len(hostile.received) == 1, "a reply cut off is not asked for again"
