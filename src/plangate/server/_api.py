"""The JSON API, with the dashboard's rules.

Bodies are read only after the caller's credentials hold (``json_of``), through the one
JSON reader, into strict request models: a field of the wrong type is a 422 that names it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from plangate.server import _actions, views
from plangate.server._deps import Reader, Rt, Writer, json_of

router = APIRouter(prefix="/api")
JSON = Any


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Approve(_Body):
    hash: str = Field(description="the hash of the version approved: the one reviewed")
    comment: str | None = None


class Reject(_Body):
    comment: str = Field(description="why")
    hash: str | None = Field(None, description="the version rejected (any version when left out)")


class Edit(_Body):
    plan: dict[str, JSON]


PlanBody = dict[str, JSON]


def _documented(kind: Any) -> dict[str, Any]:
    """The OpenAPI entry of a body the handler reads itself (after checking credentials)."""
    schema = TypeAdapter(kind).json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


@router.post("/plans", status_code=201, openapi_extra=_documented(PlanBody))
def submit(rt: Rt, caller: Writer, plan: Annotated[PlanBody, json_of(PlanBody)]) -> dict[str, Any]:
    return rt.submit(plan, requested_by=caller.user.name).to_dict()


@router.get("/plans")
def list_plans(rt: Rt, _: Reader, status: str | None = None) -> list[dict[str, Any]]:
    return [dict(row.__dict__) for row in rt.list_plans(status)]


@router.get("/plans/{plan_id}")
def get(plan_id: str, rt: Rt, _: Reader) -> dict[str, Any]:
    return rt.get(plan_id).to_dict()


@router.post("/plans/{plan_id}/approve", openapi_extra=_documented(Approve))
def approve(plan_id: str, rt: Rt, caller: Writer, body: Annotated[Approve, json_of(Approve)]) -> dict[str, Any]:
    return _actions.decide(rt, caller.user, plan_id, body.hash, body.comment, approve=True).to_dict()


@router.post("/plans/{plan_id}/reject", openapi_extra=_documented(Reject))
def reject(plan_id: str, rt: Rt, caller: Writer, body: Annotated[Reject, json_of(Reject)]) -> dict[str, Any]:
    return _actions.decide(rt, caller.user, plan_id, body.hash, body.comment, approve=False).to_dict()


@router.post("/plans/{plan_id}/edit", openapi_extra=_documented(Edit))
def edit(plan_id: str, rt: Rt, caller: Writer, body: Annotated[Edit, json_of(Edit)]) -> dict[str, Any]:
    return rt.edit(plan_id, body.plan, editor=caller.user.name).to_dict()


@router.post("/plans/{plan_id}/execute")
def execute(plan_id: str, rt: Rt, caller: Writer) -> dict[str, Any]:
    """Run an approved plan and wait for the result."""
    return _actions.run_result(rt.execute(plan_id, actor=caller.user.name))


@router.get("/plans/{plan_id}/trace")
def trace(plan_id: str, rt: Rt, _: Reader) -> list[dict[str, Any]]:
    return [e.to_dict() for e in rt.trace(plan_id)]


@router.get("/plans/{plan_id}/progress")
def progress(plan_id: str, rt: Rt, _: Reader) -> dict[str, Any]:
    return views.progress(rt, rt.get(plan_id))
