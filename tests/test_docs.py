"""The README's and the docs' examples run, and print what they say they print."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plangate import Plan, Policy
from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(path: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang == language]


def cases(language: str) -> list[tuple[Path, int, str]]:
    return [(path, i, body) for path in DOCS for i, body in enumerate(blocks(path, language))]


def ident(case: tuple[Path, int, str]) -> str:
    return f"{case[0].name}#{case[1]}"


def test_the_docs_have_examples() -> None:
    assert len(cases("console")) >= 4 and len(cases("python")) >= 3
    assert cases("yaml") and cases("json")


@pytest.mark.parametrize("path", [p for p in DOCS if blocks(p, "python")], ids=lambda p: p.name)
def test_python_examples_run(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    # Examples start plangate processes in folders of their own: a relative PYTHONPATH must still find this code.
    if os.environ.get("PYTHONPATH"):
        absolute = [str(Path(entry).resolve()) for entry in os.environ["PYTHONPATH"].split(os.pathsep) if entry]
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(absolute))
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    for body in blocks(path, "python"):
        exec(compile(body, str(path), "exec"), namespace)


@pytest.mark.parametrize("case", cases("console"), ids=ident)
def test_console_examples_print_what_they_show(case: tuple[Path, int, str]) -> None:
    _, _, body = case
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command, expected in split_console(body):
        done = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        output = (done.stdout + done.stderr).rstrip("\n")
        assert done.returncode in (0, 1), f"{command}\n{output}"
        assert output == expected, f"$ {command}"


def split_console(body: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, list[str]]] = []
    for line in body.rstrip("\n").splitlines():
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        else:
            pairs[-1][1].append(line)
    return [(command, "\n".join(lines)) for command, lines in pairs]


@pytest.mark.parametrize("case", cases("yaml"), ids=ident)
def test_yaml_examples_are_valid_policies(case: tuple[Path, int, str]) -> None:
    Policy.from_yaml(case[2])


@pytest.mark.parametrize("case", cases("json"), ids=ident)
def test_json_examples_are_valid_plans(case: tuple[Path, int, str]) -> None:
    Plan.parse(case[2])


def test_every_control_in_the_security_doc_names_a_test_that_exists() -> None:
    """docs/security.md maps each control to the test that proves it: each must be there to run."""
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", (ROOT / "docs" / "security.md").read_text())
    assert len(named) >= 30
    missing = [
        f"{file}::{test}"
        for file, test in named
        if not re.search(rf"^def {test}\(", (ROOT / "tests" / file).read_text(), re.MULTILINE)
    ]
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"
