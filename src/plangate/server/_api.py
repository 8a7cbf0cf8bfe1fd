"""The JSON API: every command that records a decision or starts work, with the dashboard's rules.

Bodies are read only after the caller's credentials hold (``json_of``), through the one
JSON reader, into strict request models: a field of the wrong type is a 422 that names it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from plangate.server import _actions, views
from plangate.server._auth import Password, UserName, check_password
from plangate.server._bodies import MAX_VERSION, Version, read_json, validated
from plangate.server._deps import Config, Reader, Rt, Writer, json_of
from plangate.store import MAX_LISTED, PlanQuery, PlanStatus

router = APIRouter(prefix="/api")
JSON = Any


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Approve(_Body):
    hash: str = Field(description="the hash of the version approved: the one reviewed")
    comment: str | None = None
    version: Version | None = Field(None, description="its number: refused once it is not the current version")


class Reject(_Body):
    comment: str = Field(description="why")
    hash: str | None = Field(None, description="the version rejected (any version when left out)")
    version: Version | None = Field(None, description="its number: refused once it is not the current version")


class Edit(_Body):
    plan: dict[str, JSON]


StepId = Annotated[int, Field(ge=-999_999, le=999_999)]  # a plan's step ids, and their undo steps


class Settle(_Body):
    step: StepId
    done: bool = Field(description="whether the step happened")
    output: JSON = Field(None, description="the output seen, when it happened")
    note: str | None = Field(None, description="what was checked")


class Compensate(_Body):
    reason: str


class Close(_Body):
    reason: str = Field(description="why the plan ends here, unresumed")


class RegisterChange(_Body):
    category: str
    state: Literal["on", "off"]
    reason: str
    force: bool = Field(False, description="turn it on even though the server's policy never approves it automatically")


class TokenRequest(_Body):
    name: UserName
    password: Password
    label: str = Field("api", min_length=1, max_length=64)
    expires: str = Field("90d", description="how long the token lives: days or hours, such as 30d or 12h")


PlanBody = dict[str, JSON]


def _documented(kind: Any) -> dict[str, Any]:
    """The OpenAPI entry of a body the handler reads itself (after checking credentials)."""
    schema = TypeAdapter(kind).json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


@router.post("/plans", status_code=201, openapi_extra=_documented(PlanBody))
def submit(rt: Rt, caller: Writer, plan: Annotated[PlanBody, json_of(PlanBody)]) -> dict[str, Any]:
    return rt.submit(plan, requested_by=caller.user.name).to_dict()


Cursor = Annotated[str | None, Query(max_length=80, description="a plan's id (or a unique prefix of one)")]


@router.get("/plans")
def list_plans(
    rt: Rt,
    caller: Reader,
    *,
    status: PlanStatus | None = None,
    kind: Literal["plan", "react"] | None = None,
    category: Annotated[str | None, Query(max_length=100)] = None,
    order: Literal["oldest", "newest"] = "oldest",
    limit: Annotated[int, Query(ge=1, le=MAX_LISTED)] = 100,
    before: Cursor = None,
    after: Cursor = None,
) -> list[dict[str, Any]]:
    """The plans the caller may see, oldest first (``order=newest``: newest first), at most ``limit``.

    ``before`` / ``after``: only the plans submitted before / after that plan. To walk through them
    all, give the last plan listed as ``after`` (oldest first) or ``before`` (newest first).
    """
    query = PlanQuery(status=status, kind=kind, category=category, order=order, before=before, after=after)
    return [dict(row.__dict__) for row in _actions.listing(rt, caller.user, query, limit)]


@router.get("/plans/{plan_id}")
def get(plan_id: str, rt: Rt, caller: Reader) -> dict[str, Any]:
    return _actions.visible(rt, caller.user, plan_id).to_dict()


@router.post("/plans/{plan_id}/approve", openapi_extra=_documented(Approve))
def approve(plan_id: str, rt: Rt, caller: Writer, body: Annotated[Approve, json_of(Approve)]) -> dict[str, Any]:
    record = _actions.decide(rt, caller.user, plan_id, body.hash, body.comment, approve=True, version=body.version)
    return record.to_dict()


@router.post("/plans/{plan_id}/reject", openapi_extra=_documented(Reject))
def reject(plan_id: str, rt: Rt, caller: Writer, body: Annotated[Reject, json_of(Reject)]) -> dict[str, Any]:
    record = _actions.decide(rt, caller.user, plan_id, body.hash, body.comment, approve=False, version=body.version)
    return record.to_dict()


@router.post("/plans/{plan_id}/edit", openapi_extra=_documented(Edit))
def edit(plan_id: str, rt: Rt, caller: Writer, body: Annotated[Edit, json_of(Edit)]) -> dict[str, Any]:
    """A new version: checked again, every earlier approval void; back for approval as the policy says."""
    return _actions.edit(rt, caller.user, plan_id, body.plan).to_dict()


@router.post("/plans/{plan_id}/execute")
def execute(plan_id: str, rt: Rt, caller: Writer) -> dict[str, Any]:
    """Run an approved plan and wait for the result."""
    record = _actions.visible(rt, caller.user, plan_id)
    return _actions.run_result(rt.execute(record.id, actor=caller.user.name))


@router.post("/plans/{plan_id}/resume")
def resume(plan_id: str, rt: Rt, caller: Writer) -> dict[str, Any]:
    """Carry on with a halted plan (what succeeded is kept) and wait for the result."""
    record = _actions.halted(rt, caller.user, plan_id)
    return _actions.run_result(rt.resume(record.id, actor=caller.user.name))


@router.post("/plans/{plan_id}/settle", openapi_extra=_documented(Settle))
def settle(plan_id: str, rt: Rt, caller: Writer, body: Annotated[Settle, json_of(Settle)]) -> dict[str, Any]:
    """Say whether a step whose outcome is unknown happened (a decision: approvers of the category)."""
    record = _actions.settle(rt, caller.user, plan_id, body.step, done=body.done, output=body.output, note=body.note)
    return record.to_dict()


@router.post("/plans/{plan_id}/compensate", openapi_extra=_documented(Compensate))
def compensate(
    plan_id: str, rt: Rt, caller: Writer, body: Annotated[Compensate, json_of(Compensate)]
) -> dict[str, Any]:
    """Roll back a halted plan's completed steps, last first (a decision: approvers of the category)."""
    return _actions.compensation_result(_actions.compensate(rt, caller.user, plan_id, body.reason))


@router.post("/plans/{plan_id}/close", openapi_extra=_documented(Close))
def close(plan_id: str, rt: Rt, caller: Writer, body: Annotated[Close, json_of(Close)]) -> dict[str, Any]:
    """Close a halted plan for good, saying why (a decision: approvers of the category)."""
    return _actions.close(rt, caller.user, plan_id, body.reason).to_dict()


@router.get("/plans/{plan_id}/diff")
def diff(
    plan_id: str,
    rt: Rt,
    caller: Reader,
    from_version: Annotated[int | None, Query(alias="from", ge=1, le=MAX_VERSION)] = None,
    to_version: Annotated[int | None, Query(alias="to", ge=1, le=MAX_VERSION)] = None,
) -> dict[str, Any]:
    """What changed between two versions, step by step (default: the one before the latest, and the latest)."""
    record = _actions.visible(rt, caller.user, plan_id)
    return rt.diff(record.id, from_version, to_version).to_dict()


@router.get("/plans/{plan_id}/compare/{other}")
def compare(plan_id: str, other: str, rt: Rt, caller: Reader) -> dict[str, Any]:
    """Two plans' runs side by side, step by step: status, parameters as run, output, duration (both readable)."""
    a, b = (_actions.visible(rt, caller.user, x) for x in (plan_id, other))
    return rt.compare(a.id, b.id).to_dict()


@router.get("/plans/{plan_id}/review")
def review(plan_id: str, rt: Rt, caller: Reader) -> dict[str, Any]:
    """What `plangate show` prints beside the plan: the policy's reasons, each step's effect and rollback, and
    once it ran, where each step stands."""
    from plangate.review import review as described

    return described(rt.store, _actions.visible(rt, caller.user, plan_id), rt.catalogue)


@router.get("/plans/{plan_id}/trace")
def trace(plan_id: str, rt: Rt, caller: Reader) -> list[dict[str, Any]]:
    return [e.to_dict() for e in rt.trace(_actions.visible(rt, caller.user, plan_id).id)]


@router.get("/plans/{plan_id}/progress")
def progress(plan_id: str, rt: Rt, caller: Reader) -> dict[str, Any]:
    return views.progress(rt, _actions.visible(rt, caller.user, plan_id))


@router.post("/tokens", status_code=201, openapi_extra=_documented(TokenRequest))
async def issue_token(request: Request, rt: Rt, config: Config) -> dict[str, Any]:
    """Sign in with a name and password (throttled like the login form): a new API token, shown once."""
    from plangate.accounts import Accounts, duration

    body = validated(TokenRequest, read_json(await request.body()))
    lifetime = duration(body.expires)
    accounts = Accounts(rt.store, config.clock)
    user = check_password(request, config, accounts, body.name, body.password)
    token = accounts.issue_token(user.name, body.label, lifetime=lifetime, by=user)
    return {"token": token, "user": user.name, "role": user.role, "expires_in": body.expires}


@router.get("/register")
def register(rt: Rt, caller: Reader, days: Annotated[int, Query(ge=1, le=36_500)] = 90) -> dict[str, Any]:
    """The auto-approval register, and the evidence per category over the last ``days`` (from the audit log; the
    plans left out of it, whose events do not verify, each with why: those the caller may see, and how many more)."""
    from plangate.register import Register, report

    evidence = report(rt.store, days=days)
    left_out, unseen = _actions.left_out_seen(rt, caller.user, evidence)
    return {
        "entries": [asdict(entry) for entry in Register(rt.store).all()],
        "report": [
            {**asdict(r), "approval_rate": r.approval_rate, "edit_rate": r.edit_rate} for r in evidence.categories
        ],
        "left_out": left_out,
        "left_out_unseen": unseen,
    }


@router.post("/register", openapi_extra=_documented(RegisterChange))
def change_register(rt: Rt, caller: Writer, body: Annotated[RegisterChange, json_of(RegisterChange)]) -> dict[str, Any]:
    """Turn automatic approval of a category on or off, saying why (governance only)."""

    on = body.state == "on"
    entry = _actions.change_register(rt, caller.user, body.category, on=on, reason=body.reason, force=body.force)
    return asdict(entry)


@router.get("/audit/verify")
def verify_audit(rt: Rt, caller: Reader) -> dict[str, Any]:
    """Walk the audit log and its seals (auditors and governance)."""
    from plangate import ledger

    _actions.may_audit(caller.user)
    report = ledger.verify(rt.store)
    return {**asdict(report), "summary": str(report)}
