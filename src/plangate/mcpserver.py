"""plangate as an MCP server: a catalogue offered to any MCP client, under the policy.

What a client sees (:meth:`Gate.offers`) and what its calls do (:meth:`Gate.call`), free
of any transport; :mod:`plangate._mcpwire` puts it on the MCP SDK (stdio or streamable
HTTP) and ``plangate mcp serve`` starts it.

- A **read** tool's call becomes a one-step plan, checked and held against the policy
  like any other. When the policy approves it automatically it runs at once and its
  output is the answer; when the policy sends it to a person it waits like a write
  (nothing runs); when the check or the policy refuses it, the answer is an error naming
  every rule and why.
- A **write** or **irreversible** tool's call becomes a one-step plan, answered with its
  id, status, the approvals it needs and the dashboard link. Nothing with an effect runs
  from an MCP call: the client can neither approve nor execute (there is no such tool),
  and an approved plan runs by ``plangate execute``, a worker or the dashboard.
- ``plangate_submit_plan`` (a whole plan), ``plangate_draft_add`` and
  ``plangate_draft_submit`` (a plan built a step at a time), ``plangate_plan_status`` and
  ``plangate_plan_result``.

Every plan records who asked (``--as`` in local mode, the token's account otherwise) and
that it came ``via: mcp``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from plangate import identity, references
from plangate.errors import NotFoundError, PlangateError, UsageError
from plangate.plan import Plan, plan_json_schema
from plangate.record import PlanRecord
from plangate.results import recorded_result
from plangate.runtime import Runtime
from plangate.tools import Catalogue, Tool
from plangate.tools._tool import problems

__all__ = ["DASHBOARD_URL", "PREFIX", "Gate", "Offer", "Reply"]

PREFIX = "plangate_"
"""Names of plangate's own tools; no catalogue tool may start with it."""
DASHBOARD_URL = "http://127.0.0.1:8420"
FALLBACK_CATEGORY = "mcp"
MAX_DRAFTS = 64
_FINISHED = ("succeeded", "halted", "compensated", "compensation_incomplete", "closed")

_WRITE_NOTE = (
    "Governed by plangate: calling this only proposes a one-step plan for approval. Nothing happens until "
    "a person approves it and it is run (plangate execute, a worker or the dashboard). Returns the plan id, "
    "what it needs and a link to review it."
)
_READ_NOTE = (
    "Governed by plangate: checked against the policy and recorded in the audit log; it runs at once when "
    "the policy clears it without a person, otherwise it waits for approval like a write."
)


@dataclass(frozen=True, kw_only=True)
class Offer:
    """A tool as an MCP client sees it: name, description, input schema and annotations (MCP's field names)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Reply:
    """The answer to one call: text for the model, the same as data, and whether it is an error."""

    text: str
    data: dict[str, Any]
    error: bool = False


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _PlanId(_Args):
    plan_id: str = Field(min_length=1, max_length=100, description="The plan's id (or a unique prefix of it).")


class _DraftAdd(_Args):
    tool: str = Field(min_length=1, max_length=200, description="A tool of the catalogue.")
    params: dict[str, JsonValue] = Field(
        default_factory=dict, description="Its arguments; ${N} or ${N.field} takes step N's output."
    )
    rationale: str = Field(min_length=1, max_length=2000, description="Why this step is needed, for the reviewer.")
    draft: str | None = Field(default=None, max_length=64, description="The draft to add to; omit to start one.")


class _DraftSubmit(_Args):
    draft: str = Field(min_length=1, max_length=64, description="The draft's id, from plangate_draft_add.")
    task: str = Field(min_length=1, max_length=2000, description="What the plan achieves, in one sentence.")
    category: str | None = Field(
        default=None, max_length=100, description="Kind of work; default: the first the policy allows for every step."
    )


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    return schema


class Gate:
    """The catalogue of a runtime offered over MCP: reads run at once when the policy allows, the rest is proposed.

    ``user`` and ``token`` say who asks, as on the command line (:mod:`plangate.identity`):
    checked when the gate is made and again at each call, so a revoked token stops working.
    ``category``: the category of every plan made from a single call; default, the first
    of the policy's categories whose envelope admits the tool (``mcp`` when it has none).
    Calls are taken one at a time.
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        user: str | None = None,
        token: str | None = None,
        category: str | None = None,
        dashboard_url: str = DASHBOARD_URL,
    ) -> None:
        self.runtime = runtime
        self.user, self.token, self.category = user, token, category
        self.dashboard_url = dashboard_url.rstrip("/")
        self._lock = threading.Lock()
        self._drafts: dict[str, list[dict[str, Any]]] = {}
        if runtime.catalogue is None:
            raise UsageError("an MCP server needs the tools: give the runtime a catalogue (--tools)")
        self.catalogue: Catalogue = runtime.catalogue
        clash = [name for name in self.catalogue.names if name.startswith(PREFIX)]
        if clash:
            raise UsageError(f"tool names starting with {PREFIX!r} are plangate's own over MCP: {', '.join(clash)}")
        self.requester("submit")  # who asks is known before the first call
        self._own: dict[str, tuple[str, type[BaseModel] | None, Callable[[Any], Reply]]] = {
            "plangate_submit_plan": (
                "Submit a whole plan (task, category, steps): checked and held against the policy, then recorded "
                "for approval. Nothing runs; the answer is the plan id, its status, what it needs and a link.",
                None,
                self._submit_plan,
            ),
            "plangate_draft_add": (
                "Add a step to a draft plan (start one by omitting draft). Nothing is checked or recorded until "
                "plangate_draft_submit; drafts live in this server's memory only.",
                _DraftAdd,
                self._draft_add,
            ),
            "plangate_draft_submit": (
                "Submit a draft plan, as plangate_submit_plan does: checked, recorded for approval, never run here.",
                _DraftSubmit,
                self._draft_submit,
            ),
            "plangate_plan_status": (
                "A plan's status, the approvals it still needs, who approved it, and its link.",
                _PlanId,
                self._status,
            ),
            "plangate_plan_result": (
                "A plan's outputs once it has run, or why there are none yet. It never starts a run: an approved "
                "plan runs by plangate execute, a worker or the dashboard.",
                _PlanId,
                self._result,
            ),
        }

    # -- what the client sees ----------------------------------------------------------------
    def offers(self) -> list[Offer]:
        """The catalogue's tools, then plangate's own; descriptions and schemas from the catalogue."""
        offered = [_offer(tool) for tool in self.catalogue]
        for name, (description, model, _) in self._own.items():
            schema = plan_json_schema() if model is None else _schema(model)
            offered.append(Offer(name=name, description=description, input_schema=schema, annotations=_OWN[name]))
        return offered

    # -- what a call does --------------------------------------------------------------------
    def call(self, name: str, arguments: Mapping[str, Any] | None) -> Reply:
        """Answer one call; plangate's refusals and bad input come back as error replies, never raised."""
        with self._lock:
            try:
                return self._call(name, dict(arguments or {}))
            except PlangateError as exc:
                return _error(str(exc), {"error": type(exc).__name__})

    def _call(self, name: str, arguments: dict[str, Any]) -> Reply:
        if name in self._own:
            _, model, handler = self._own[name]
            if model is None:
                return handler(arguments)
            try:
                parsed = model.model_validate(arguments)
            except ValidationError as exc:
                return _bad_arguments(name, problems(exc.errors(include_url=False)))
            return handler(parsed)
        tool = self.catalogue.get(name)
        if tool is None:
            return _error(f"no tool named {name!r}", {"error": "unknown-tool"})
        wrong = tool.param_errors(arguments)
        if wrong:
            return _bad_arguments(name, problems(wrong))
        # The client's arguments are values, not plan text: a "${" in them is text the tool is given as it is.
        params = references.literal(arguments)
        step = {"id": 1, "tool": tool.name, "params": params, "rationale": "Called by an MCP client."}
        task = f"{tool.name} over MCP: {_short(json.dumps(arguments, ensure_ascii=False, sort_keys=True))}"
        plan = {"task": task, "category": self._category([tool]), "steps": [step]}
        record = self._submit(plan)
        if record.status == "approved" and tool.effect == "read":
            return self._run_read(record)
        return self._answer(record)

    def requester(self, doing: identity.Doing) -> str:
        """Who asks, once it is shown that their account may do ``doing``."""
        who = identity.actor(self.runtime.store, token=identity.find_token(self.token), claimed=self.user)
        identity.permit(who.user, doing)
        return who.name

    def _category(self, tools: list[Tool]) -> str:
        if self.category is not None:
            return self.category
        policy = self.runtime.policy
        for name, envelope in ((policy.categories or {}) if policy else {}).items():
            if all(envelope.breach(tool) is None for tool in tools):
                return name
        return FALLBACK_CATEGORY

    def _submit(self, plan: Mapping[str, Any] | Plan) -> PlanRecord:
        return self.runtime.submit(plan, requested_by=self.requester("submit"), via="mcp")

    def _run_read(self, record: PlanRecord) -> Reply:
        """A read the policy approved automatically: run now, the requester recorded as who started it."""
        runner = self.requester("execute")
        result = self.runtime.execute(record.id, actor=runner)
        data = self._data(self.runtime.get(record.id))
        if not result.ok:
            return _error(f"plan {record.id} ran and halted: {result.error}", {**data, "error": result.error})
        output = result.outputs.get(1)
        text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, indent=2)
        return Reply(text=text, data={**data, "output": output})

    def _submit_plan(self, arguments: dict[str, Any]) -> Reply:
        return self._answer(self._submit(Plan.parse(arguments)))

    def _draft_add(self, args: _DraftAdd) -> Reply:
        if args.tool not in self.catalogue:
            return _error(f"no tool named {args.tool!r}", {"error": "unknown-tool"})
        if args.draft is None:
            if len(self._drafts) >= MAX_DRAFTS:
                return _error(f"{MAX_DRAFTS} drafts are open: submit one first", {"error": "too-many-drafts"})
            draft = self.runtime.clock.new_id()
            self._drafts[draft] = []
        elif args.draft in self._drafts:
            draft = args.draft
        else:
            return _error(f"no draft {args.draft!r} (drafts are lost when the server stops)", {"error": "no-draft"})
        steps = self._drafts[draft]
        steps.append({"id": len(steps) + 1, "tool": args.tool, "params": args.params, "rationale": args.rationale})
        text = f"draft {draft}: step {len(steps)} is {args.tool}; later steps may use its output as ${{{len(steps)}}}"
        return Reply(text=text, data={"draft": draft, "step": len(steps), "steps": steps})

    def _draft_submit(self, args: _DraftSubmit) -> Reply:
        steps = self._drafts.get(args.draft)
        if steps is None:
            return _error(f"no draft {args.draft!r} (drafts are lost when the server stops)", {"error": "no-draft"})
        category = args.category or self._category([self.catalogue[step["tool"]] for step in steps])
        record = self._submit({"task": args.task, "category": category, "steps": steps})
        del self._drafts[args.draft]
        return self._answer(record)

    def _status(self, args: _PlanId) -> Reply:
        record = self._visible(args.plan_id)
        return Reply(text=_said(record, self._link(record.id)), data=self._data(record))

    def _result(self, args: _PlanId) -> Reply:
        record = self._visible(args.plan_id)
        data = self._data(record)
        if record.status not in _FINISHED or record.plan is None:
            why = _said(record, self._link(record.id))
            return Reply(text=f"no outputs: {why}", data={**data, "outputs": None, "why": why})
        store = self.runtime.store
        result = recorded_result(record.id, record.version, record.plan, store.steps(record.id), record.status)
        outputs = {str(step): value for step, value in result.outputs.items()}
        text = f"plan {record.id} {record.status}: " + json.dumps(outputs, ensure_ascii=False, indent=2)
        if not result.ok:
            text += f"\nhalted at step {result.failed_step} ({result.tool}): {result.error}"
        return Reply(text=text, data={**data, "outputs": outputs, "error": result.error})

    def _visible(self, plan_id: str) -> PlanRecord:
        """The plan, if the requester may see it (token mode: their own, or of a category they decide)."""
        who = identity.actor(self.runtime.store, token=identity.find_token(self.token), claimed=self.user)
        if who.user is None:
            return self.runtime.get(plan_id)
        hidden = NotFoundError(f"{who.name} may see no plan {plan_id!r} (give its full id if a prefix matches several)")
        try:  # one answer for none, several and another's: an id or prefix tells nothing of plans one may not see
            record = self.runtime.get(plan_id)
        except NotFoundError:
            raise hidden from None
        if not who.user.may_read(category=record.category, requested_by=record.requested_by):
            raise hidden
        return record

    # -- answers -----------------------------------------------------------------------------
    def _answer(self, record: PlanRecord) -> Reply:
        data = self._data(record)
        if record.status == "rejected":
            lines = [f"plan {record.id} refused ({len(record.violations)} violations):"]
            lines += [f"  {violation}" for violation in record.violations]
            return Reply(text="\n".join(lines), data=data, error=True)
        return Reply(text=_said(record, self._link(record.id)), data=data)

    def _data(self, record: PlanRecord) -> dict[str, Any]:
        approvals = self.runtime.store.approvals(record.id, record.version)
        return {
            "plan_id": record.id,
            "version": record.version,
            "hash": record.hash,
            "status": record.status,
            "task": record.task,
            "category": record.category,
            "requested_by": record.requested_by,
            "needs": list(record.needs),
            "approved_by": [a.actor for a in approvals if a.decision == "approved" and not a.void],
            "violations": [v.to_dict() for v in record.violations],
            "link": self._link(record.id),
        }

    def _link(self, plan_id: str) -> str:
        return f"{self.dashboard_url}/plans/{plan_id}"


def _offer(tool: Tool) -> Offer:
    reads = tool.effect == "read"
    annotations = {
        "title": tool.name if reads else f"{tool.name} (proposes a plan for approval)",
        "readOnlyHint": reads,
        "destructiveHint": tool.effect == "irreversible",
        "idempotentHint": tool.idempotent,
        "openWorldHint": tool.external,
    }
    note = _READ_NOTE if reads else _WRITE_NOTE
    description = f"{tool.description}\n\n{note}" if tool.description else note
    return Offer(name=tool.name, description=description, input_schema=tool.params_schema, annotations=annotations)


def _own(title: str, *, reads: bool) -> dict[str, Any]:
    return {
        "title": title,
        "readOnlyHint": reads,
        "destructiveHint": False,
        "idempotentHint": reads,
        "openWorldHint": False,
    }


# Submitting records a plan (an entry in the audit log, no effect in the world); the rest only reads.
_OWN = {
    "plangate_submit_plan": _own("Submit a plan for approval", reads=False),
    "plangate_draft_add": _own("Add a step to a draft plan", reads=False),
    "plangate_draft_submit": _own("Submit a draft plan for approval", reads=False),
    "plangate_plan_status": _own("A plan's status", reads=True),
    "plangate_plan_result": _own("A plan's outputs", reads=True),
}


def _said(record: PlanRecord, link: str) -> str:
    """Where the plan stands and what comes next, in one paragraph."""
    head = f"plan {record.id} ({record.category}): {record.status}."
    if record.status == "pending_approval":
        needs = " and by ".join(record.needs) or "a person"
        return f"{head} It waits for approval by {needs}; nothing has run. Review it at {link}"
    if record.status == "approved":
        return (
            f"{head} It runs when `plangate execute {record.id}`, a worker or the dashboard takes it; "
            f"an MCP call never runs it. {link}"
        )
    if record.status == "rejected":
        return f"{head} It will not run. {link}"
    if record.status in _FINISHED:
        return f"{head} plangate_plan_result gives its outputs. {link}"
    return f"{head} {link}"


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error(text: str, data: dict[str, Any]) -> Reply:
    return Reply(text=text, data=data, error=True)


def _bad_arguments(name: str, found: list[Any]) -> Reply:
    lines = [f"{name}: the arguments do not fit its schema; nothing was recorded:"]
    lines += [f"  {problem}" for problem in found]
    return _error("\n".join(lines), {"error": "bad-arguments", "problems": [str(p) for p in found]})
