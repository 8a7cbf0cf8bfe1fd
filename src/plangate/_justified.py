"""The two governance fields a policy's rules may carry: a business justification and a compliance requirement."""

from __future__ import annotations

from pydantic import Field

from plangate._frozen import Frozen


def _absent(value: object) -> bool:
    return value is None


class Justified(Frozen):
    """A rule's governance record: why the business has it and what requirement it meets.

    Neither field changes a decision. Left out, they are left out of the policy's hash as
    well, so a policy written before they existed keeps its hash; given, they are part of
    the policy (a new justification is a new revision). ``plangate governance export``
    prints them beside each rule.
    """

    justification: str | None = Field(
        default=None, exclude_if=_absent, description="The business justification for the rule."
    )
    compliance: str | None = Field(
        default=None,
        exclude_if=_absent,
        description="The compliance requirement the rule satisfies, e.g. 'SOX 404' (free text).",
    )
