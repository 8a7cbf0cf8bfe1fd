"""Attacks on "what the reviewer sees is what runs": text in a plan that a person cannot see, kept as
regression tests (each failed before its fix)."""

from __future__ import annotations

import pytest

from plangate.errors import PlanError, RefusedInputError
from plangate.plan import Plan
from tests.helpers import plan

ZWJ, ZWNJ = "\u200d", "\u200c"


def refusal(params: dict[str, object], task: str = "Write to the customer") -> str:
    body = plan({"id": 1, "tool": "send_email", "params": {"subject": "s", "body": "b", **params}}, task=task)
    with pytest.raises(PlanError) as error:
        Plan.parse(body)
        pytest.fail(f"accepted: {params!r}")
    return str(error.value.problems[0])


# -- the joiners: invisible, allowed only where a script or an emoji needs them ------------------------


@pytest.mark.parametrize("joiner", [ZWJ, ZWNJ], ids=["zwj", "zwnj"])
def test_a_joiner_in_a_key_is_refused(joiner: str) -> None:
    """``"to"`` and ``"to\\u200d"`` both show as ``"to"``: a tool that takes more properties gets a second
    recipient the reviewer reads as the first one written twice, and a deny rule on ``to`` reads neither."""
    found = refusal({"to": "ceo@example.com", f"to{joiner}": "drop@attacker.example"})
    assert found.startswith(f'steps[0].params["to\\u{ord(joiner):04x}"]: invisible-character: U+{ord(joiner):04X}')
    assert "joins nothing" in found


@pytest.mark.parametrize(
    "value",
    [f"ceo@exa{ZWJ}mple.com", f"ceo@example.com{ZWNJ}", f"{ZWJ}ceo@example.com", f"ceo@example{ZWJ}.com"],
    ids=["between-latin", "at-the-end", "at-the-start", "before-a-dot"],
)
def test_a_joiner_next_to_ascii_is_refused(value: str) -> None:
    """A value a reviewer reads as ceo@example.com is another address, and a deny rule on it misses."""
    assert refusal({"to": value}).startswith("steps[0].params.to: invisible-character: U+200")


def test_two_joiners_in_a_row_are_refused() -> None:
    assert "invisible-character" in refusal({"to": "ceo@example.com"}, task=f"Write to \u0645{ZWNJ}{ZWNJ}\u06cc")


@pytest.mark.parametrize(
    "text",
    [
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian "I want": ZWNJ between two letters
        "\u0915\u094d\u200d\u0937",  # Devanagari: ZWJ after a virama
        "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # a family emoji: ZWJ between emoji
        "\U0001f3f3\ufe0f\u200d\U0001f308",  # the rainbow flag: a selector, then a joiner
        "\u2764\ufe0f thanks",  # a red heart: the emoji selector after a symbol
        "\u2714\ufe0e done",  # the text selector after a symbol
    ],
    ids=["persian-zwnj", "devanagari-zwj", "family", "rainbow-flag", "heart", "check-text"],
)
def test_scripts_and_emoji_keep_their_joiners_and_selectors(text: str) -> None:
    Plan.parse(plan({"id": 1, "tool": "calculate", "params": {"expression": "1+1"}, "rationale": text}, task=text))


# -- the emoji selectors: only right after a character they can select ---------------------------------


@pytest.mark.parametrize(
    "value",
    ["ceo@exa\ufe0fmple.com", "\ufe0fceo@example.com", "\u2764\ufe0f\ufe0f\ufe0f", "\u2764 \ufe0f"],
    ids=["after-latin", "at-the-start", "a-run", "after-a-space"],
)
def test_an_emoji_selector_that_selects_nothing_is_refused(value: str) -> None:
    assert refusal({"to": value}).startswith("steps[0].params.to: invisible-character: U+FE0F")


def test_an_approval_comment_may_carry_an_emoji() -> None:
    from plangate._input import check_text

    assert check_text("\u2714\ufe0f looks right", "comment", what="approval") == "\u2714\ufe0f looks right"
    with pytest.raises(RefusedInputError, match=r"^approval: comment: invisible-character: U\+200D .* joins nothing"):
        check_text(f"approved{ZWJ}", "comment", what="approval")
