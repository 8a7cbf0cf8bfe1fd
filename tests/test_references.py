from __future__ import annotations

import pytest

from plangate import RefError
from plangate.references import Found, Ref, find, lookup, resolve, scan, whole_ref

OUTPUTS = {1: {"total": 12.5, "customer": {"email": "a@x"}, "lines": [{"sku": "A"}, {"sku": "B"}]}, 2: "text"}


def test_scan_finds_every_reference_and_skips_escapes() -> None:
    assert scan("a ${1} b ${2.x.y} $${3} c") == [Ref(1, ()), Ref(2, ("x", "y"))]
    assert whole_ref("${1.total}") == Ref(1, ("total",))
    assert whole_ref("${1} and ${2}") is None
    assert whole_ref("total: ${1}") is None


@pytest.mark.parametrize("bad", ["${x}", "${1.}", "${}", "${1..a}", "${1 }", "open ${1"])
def test_malformed_references_are_refused(bad: str) -> None:
    with pytest.raises(RefError):
        scan(bad)


@pytest.mark.parametrize("text", ["${\u0661}", "${\u09ea.total}", "pay ${\uff11}", "${1\u0660}"])
def test_a_step_number_in_digits_other_than_0_to_9_is_refused(text: str) -> None:
    """Other scripts' digits read as numbers (Bengali's four, like an 8, is 4): a reviewer could read another step than
    the one run, so a reference's step number is written in 0-9 alone."""
    with pytest.raises(RefError, match="malformed reference"):
        scan(text)
    found, bad = find({"amount": text})
    assert not found and bad, (found, bad)


def test_whole_value_references_keep_their_type_and_strings_interpolate() -> None:
    params = {
        "amount": "${1.total}",
        "body": "We refunded ${1.total} to ${1.customer.email}.",
        "n": 3,
        "nested": ["${1.lines.1.sku}", {"k": "${2}"}],
        "literal": "costs $${1.total}",
    }
    assert resolve(params, OUTPUTS) == {
        "amount": 12.5,
        "body": "We refunded 12.5 to a@x.",
        "n": 3,
        "nested": ["B", {"k": "text"}],
        "literal": "costs ${1.total}",
    }
    assert resolve("all: ${1.customer}", OUTPUTS) == 'all: {"email":"a@x"}'


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        (Ref(3, ()), "step 3 has no recorded output"),
        (Ref(1, ("nope",)), "has no field 'nope'"),
        (Ref(1, ("lines", "9")), "index 9 is past the end"),
        (Ref(1, ("total", "x")), "is a number, not an object or list"),
    ],
)
def test_lookup_errors_say_what_is_missing(ref: Ref, message: str) -> None:
    with pytest.raises(RefError, match=message):
        lookup(ref, OUTPUTS)


def test_find_reports_locations_and_errors() -> None:
    found, errors = find({"a": ["x ${1.b}", "${2}"], "b": "${oops}"})
    assert found == [Found(("a", 0), Ref(1, ("b",)), whole=False), Found(("a", 1), Ref(2, ()), whole=True)]
    assert len(errors) == 1 and errors[0][0] == ("b",) and "malformed reference '${oops}'" in str(errors[0][1])
