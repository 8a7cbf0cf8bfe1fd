"""JSON encoding on the hot paths: one C encoder made once, the same text as ``json`` gives."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def reused_encoder(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode``, the same text, with the C encoder made once rather than for every value.

    ``json`` builds a C encoder for each call; the hot paths (each step's records and events)
    encode several small values per step. The reused encoder keeps no record of the objects it
    is inside (that record cannot be shared between calls), so a value that contains itself
    recurses until Python stops it: such a value (and one nested too deep) is encoded again
    the usual way, which raises what ``json`` raises.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or encoder.indent is not None or encoder.ensure_ascii:  # pragma: no cover - no C accelerator
        return encoder.encode
    quote = json.encoder.encode_basestring
    c_encode = make(
        None,
        encoder.default,
        quote,
        None,
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )

    def encode(value: Any) -> str:
        if isinstance(value, str):
            return quote(value)
        try:
            return "".join(c_encode(value, 0))
        except RecursionError:
            return encoder.encode(value)

    return encode
