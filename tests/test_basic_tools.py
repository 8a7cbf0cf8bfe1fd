from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from plangate import RunContext
from plangate.tools.basic import CalculationError, SearchIndex, calculate, get_current_date, search, search_tool


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("4.90 * 1.2", 5.88),
        ("(2026 - 2011) * 12", 180),
        ("2 ** 10", 1024),
        ("-3 + +4", 1),
        ("7 // 2 + 7 % 2", 4),
        ("sqrt(16) + abs(-2)", 6),
        ("max(1, 5, 3) - min(4, 2)", 3),
        ("round(2.567, 2)", 2.57),
        ("1e3 / 8", 125),
    ],
)
def test_arithmetic(expression: str, value: float) -> None:
    assert calculate(expression) == pytest.approx(value)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("10**10**10", "exponent .* is too large"),
        ("9 ** 9 ** 9", "too large"),
        ("__import__('os')", "Call is not allowed"),
        ("().__class__", "is not allowed"),
        ("open('/etc/passwd').read()", "not allowed"),
        ("x + 1", "Name is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("[1, 2]", "List is not allowed"),
        ("'a' * 3", "Constant is not allowed"),
        ("1 / 0", "division by zero"),
        ("sqrt(-1)", "sqrt: math domain error"),
        ("1 +", "not an arithmetic expression"),
        ("9" * 1_000_000, "the limit is 1000"),
        ("+".join(["1"] * 300), "parts; the limit is 200"),
        ("(" * 300 + "1" + ")" * 300, "limit is 1000|not an arithmetic"),
    ],
)
def test_refused_quickly(expression: str, message: str) -> None:
    start = time.perf_counter()
    with pytest.raises(CalculationError, match=message):
        calculate(expression)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("round(1, -10**300)", r"^round: ndigits -1000000\.\.\. \(301 digits\) is outside -300\.\.300$"),
        ("round(1, -10**7)", r"^round: ndigits -10000000 is outside -300\.\.300$"),
        ("round(2.5, 10**6)", r"^round: ndigits 1000000 is outside"),
        ("(-1) ** 0.5", r"^the result is not a real number \(it is complex\)$"),
        ("(-8) ** (1 / 3)", r"^the result is not a real number \(it is complex\)$"),
        ("10**300 * 10**300", r"^the result is too large$"),
        ("(10**300 - 1) * 10**300 * 10**300", r"^the result is too large$"),
        ("(-1) ** 10**300", r"^the exponent 10000000\.\.\. \(301 digits\) is too large$"),
        ("1e999 - 1e999", r"^the result is not a finite number$"),
        ("1e300 / 1e-300", r"^the result is not a finite number$"),
        ("round(1.5, 0.5)", r"^round: 'float' object cannot be interpreted as an integer$"),
        ("max()", r"^max: max expected at least 1 argument, got 0$"),
    ],
)
def test_every_operation_is_bounded_before_it_runs(expression: str, message: str) -> None:
    with pytest.raises(CalculationError, match=message):
        calculate(expression)


def test_bounded_operations_still_answer() -> None:
    assert calculate("round(123456, -3)") == 123000
    assert calculate("round(1, -300)") == 0
    assert calculate("10**150 * 10**150") == 1e300
    assert calculate("(-8) ** 2") == 64


def test_the_date_comes_from_the_run_context() -> None:
    ctx = RunContext(plan_id="p", step_id=1, now=datetime(2026, 2, 3, 23, 59, tzinfo=UTC))
    assert get_current_date(ctx) == "2026-02-03"
    assert get_current_date.params_schema.get("properties") == {}


def test_bm25_search_over_the_bundled_collection() -> None:
    hits = search(query="refund window days", k=2)
    assert hits[0]["document"] == "refunds.md" and "30 days" in hits[0]["text"]
    assert len(hits) == 2 and hits[0]["score"] > hits[1]["score"]
    assert search(query="zebra xylophone") == []
    assert search.untrusted_output


def test_search_over_a_folder_of_my_own(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("Kittens like warm milk and naps.")
    (tmp_path / "b.txt").write_text("Warm weather brings long naps to dogs. Dogs dogs dogs.")
    (tmp_path / "c.json").write_text("{}")
    index = SearchIndex.from_folder(tmp_path)
    assert sorted(index.documents) == ["a.md", "b.txt"]
    assert [h["document"] for h in index.search("dogs naps")] == ["b.txt", "a.md"]
    mine = search_tool(tmp_path, name="notes")
    assert mine.name == "notes" and mine(query="kittens")[0]["document"] == "a.md"
    with pytest.raises(ValueError, match="no folder"):
        SearchIndex.from_folder(tmp_path / "missing")
