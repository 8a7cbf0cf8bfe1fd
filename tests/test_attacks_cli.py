"""The command line under careless or hostile input: plain errors, documented exit codes, no tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from plangate.cli import main
from tests.test_cli_runtime import PLANS, POLICY, TOOLS


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path}/plangate.db"
    monkeypatch.setenv("PLANGATE_DB", url)
    return url


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("command", ["show", "trace", "replay", "diff", "approve"])
def test_a_huge_plan_id_is_an_unknown_plan_in_one_short_line(db: str, command: str) -> None:
    code, out, _ = run("submit", str(PLANS / "refund.json"), "--tools", TOOLS, "--policy", POLICY, "--as", "alice")
    assert code == 0, out
    code, _, err = run(command, "x" * 100_000)
    assert code == 2
    assert err.startswith("plangate: no plan ") and err.count("\n") == 1 and len(err) < 300
    code, out, _ = run("list", "--json")
    assert code == 0 and len(json.loads(out)) == 1


@pytest.mark.parametrize(
    "option",
    [
        ("--lease", "0"),
        ("--lease", "-5"),
        ("--lease", "nan"),
        ("--lease", "inf"),
        ("--lease", "0.01"),  # renewed every 3 ms: on a busy machine it ran out between renewals
        ("--drain-timeout", "nan"),
    ],
)
def test_a_worker_refuses_a_lease_or_drain_time_that_is_no_length_of_time(
    db: str, monkeypatch: pytest.MonkeyPatch, option: tuple[str, str]
) -> None:
    import plangate.cli._run as cli_run

    def leave() -> None:
        raise SystemExit(0)

    monkeypatch.setattr(cli_run, "_leave_now", leave)  # the worker ends its process at once otherwise
    code, _, err = run("worker", *option, "--drain", "--tools", TOOLS)
    assert code == 2, err
    assert f"Invalid value for '{option[0]}'" in err
