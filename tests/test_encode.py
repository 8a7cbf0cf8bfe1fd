"""The hot paths' JSON encoder gives exactly the text ``json`` gives, and refuses what it refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from plangate._encode import reused_encoder
from plangate.plan import canonical

VALUES: list[Any] = [
    None,
    True,
    0,
    -(10**30),
    1.5,
    1e-7,
    "",
    'a "quoted" \\ line\nwith\u2028 é and 𝄞',
    [],
    {},
    (1, "two", None),
    {"b": [1, {"d": 2, "c": [True, False]}], "a": "x", "é": {}},
]


def reference(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@pytest.mark.parametrize("value", VALUES)
def test_canonical_is_the_text_json_gives(value: Any) -> None:
    assert canonical(value) == reference(value)


def test_an_unsorted_encoder_keeps_the_order_and_its_separators() -> None:
    encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    encode = reused_encoder(encoder)
    for value in VALUES:
        assert encode(value) == encoder.encode(value)
    assert encode({"b": 1, "a": 2}) == '{"b":1,"a":2}'


def test_a_value_that_contains_itself_is_refused_as_json_refuses_it() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular reference"):
        canonical(looped)
    assert canonical([1, 2]) == "[1,2]"  # and the encoder is still fine afterwards


def test_nan_and_unknown_types_are_refused_as_json_refuses_them() -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        canonical({"x": float("nan")})
    with pytest.raises(TypeError, match="not JSON serializable"):
        canonical({"x": object()})


def test_a_value_nested_too_deep_raises_what_json_raises() -> None:
    deep: Any = 1
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(RecursionError):
        reference(deep)
    with pytest.raises(RecursionError):
        canonical(deep)
