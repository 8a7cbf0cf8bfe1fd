"""Approve or reject from a chat message's buttons: signed by the chat service, never forged.

The signature covers the body, so the body is read first; :class:`BodyLimit` is what keeps
an unsigned one small. The payload is then held to the shape of an interaction, and a
payload of another shape is a 400, whoever signed it.

The person is found by the chat user's immutable id (``user.id``), linked to an account
with ``plangate users add NAME --slack-id U…``; the changeable display and user names
are never used. A button plangate did not send (an unknown action id) is refused.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from plangate.accounts import Accounts
from plangate.errors import GovernanceError, NotFoundError
from plangate.notify import decided_by, escape
from plangate.server import _actions
from plangate.server._bodies import read_json, validated
from plangate.server._deps import Config, Rt

router = APIRouter(include_in_schema=False)
_DECISIONS = ("plangate_approve", "plangate_reject")
_LINKS = ("plangate_open",)  # the Review button opens the plan's page: nothing to decide


class _Lax(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)  # the chat service sends much more


class SlackUser(_Lax):
    id: str = Field(min_length=1, max_length=32)
    name: str | None = None
    username: str | None = None


class SlackAction(_Lax):
    action_id: str
    value: str | None = Field(None, pattern=r"^[^:]+:.+$")  # plan_id:version:hash on the approve and reject buttons


class Interaction(_Lax):
    user: SlackUser
    actions: list[SlackAction] = Field(min_length=1)


async def signed(request: Request, config: Config) -> Interaction:
    """The interaction, once its signature holds (the body is read here, within the body limit)."""
    from plangate.notify import verify

    if config.slack_signing_secret is None:
        raise HTTPException(404, "chat buttons are not set up (no signing secret)")
    body = await request.body()
    stamp, signature = (
        request.headers.get("x-slack-request-timestamp", ""),
        request.headers.get("x-slack-signature", ""),
    )
    problem = verify(config.slack_signing_secret, stamp, body, signature)
    if problem is not None:
        raise HTTPException(401, f"refused: {problem}")
    return _interaction(body)


@router.post("/slack/actions")
def slack_actions(interaction: Annotated[Interaction, Depends(signed)], rt: Rt) -> dict[str, Any]:
    action, person = interaction.actions[0], interaction.user
    if action.action_id in _LINKS:
        return {}
    if action.action_id not in _DECISIONS:
        raise HTTPException(400, f"unknown action {action.action_id[:40]!r}: only plangate's own buttons decide")
    if action.value is None:
        raise HTTPException(400, "not an interaction payload: the button carries no plan_id:version:hash")
    sent_for = decided_by(action.value)
    if sent_for is None:  # a button that names no version (an earlier plangate's) decides nothing
        text = "Refused: this button does not say which version of the plan it was sent for: decide on its page"
        return {"response_type": "ephemeral", "text": text}
    plan_id, version, plan_hash = sent_for
    user = Accounts(rt.store).by_slack_id(person.id)
    if user is None or user.read_only:
        text = f"chat user {person.id} is linked to no account that may decide (users add NAME --slack-id ID)"
        return {"response_type": "ephemeral", "text": text}
    approve = action.action_id == "plangate_approve"
    try:
        comment = None if approve else "rejected from chat"
        record = _actions.decide(rt, user, plan_id, plan_hash, comment, approve=approve, version=version)
    except (GovernanceError, NotFoundError) as exc:
        return {"response_type": "ephemeral", "text": f"Refused: {exc}"}
    except HTTPException as exc:
        return {"response_type": "ephemeral", "text": f"Refused: {exc.detail}"}
    return {"replace_original": False, "text": f"{user.name}: {escape(record.task)} is now {record.status}."}


def _interaction(body: bytes) -> Interaction:
    try:
        fields = parse_qs(body.decode("utf-8"), strict_parsing=True, max_num_fields=16)
        raw = fields["payload"][0]
    except (ValueError, KeyError) as exc:
        raise HTTPException(400, f"not an interaction payload: {exc}") from None
    data = read_json(raw.encode(), what="the payload")
    try:
        return validated(Interaction, data)
    except HTTPException as exc:
        raise HTTPException(400, f"not an interaction payload: {exc.detail}") from None
