"""A Pydantic AI toolset whose calls become one governed plan.

The agent sees the catalogue's tools as usual. A call of a tool that only reads runs at once
when the policy approves a plan of it by itself (``read_category``, one whose envelope holds
only reads), recorded like any plan; every call, read or not, also becomes a step of one draft
plan, and a write answers only with the step's number and how a later call may refer to its
output (``${N.field}``). A call the checker or the policy would refuse is sent back to the
model at once (a retry) and kept out of the draft. When the run ends,
:meth:`PlanGateToolset.submit` submits the draft as one plan: checked, held against the
policy, approved by people as one hashed artefact, then run by plangate's engine.

Needs the ``pydantic-ai`` extra. One toolset collects one task: make a new one per task.
"""

from __future__ import annotations

from typing import Any

from plangate._extras import need

need("pydantic-ai", "plangate.integrations.pydantic_ai")

from pydantic_ai import ModelRetry, RunContext  # noqa: E402
from pydantic_ai.tools import ToolDefinition  # noqa: E402
from pydantic_ai.toolsets import AbstractToolset  # noqa: E402
from pydantic_ai.toolsets.abstract import ToolsetTool  # noqa: E402
from pydantic_core import SchemaValidator, core_schema  # noqa: E402

from plangate.check import check  # noqa: E402
from plangate.errors import UsageError  # noqa: E402
from plangate.record import PlanRecord  # noqa: E402
from plangate.runtime import Runtime  # noqa: E402
from plangate.tools import Catalogue  # noqa: E402

__all__ = ["PlanGateToolset"]

_ANY = SchemaValidator(schema=core_schema.dict_schema())  # plangate's checker validates the parameters


class PlanGateToolset(AbstractToolset[Any]):
    """The runtime's catalogue as a Pydantic AI toolset that collects the agent's calls into one draft plan."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        requester: str,
        task: str,
        category: str,
        read_category: str | None = None,
        toolset_id: str = "plangate",
    ) -> None:
        if runtime.catalogue is None:
            raise ValueError("the runtime has no catalogue: PlanGateToolset offers the catalogue's tools")
        self.runtime = runtime
        self.requester = requester
        self.task = task
        self.category = category
        self.read_category = read_category
        self.steps: list[dict[str, Any]] = []
        self.ran_at_once: list[str] = []
        """The ids of the one-step read plans that ran during the run."""
        self._id = toolset_id
        self.submitted: str | None = None
        """The id of the plan :meth:`submit` made; a toolset submits once."""

    @property
    def id(self) -> str | None:
        return self._id

    @property
    def catalogue(self) -> Catalogue:
        assert self.runtime.catalogue is not None  # checked when made
        return self.runtime.catalogue

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            tool.name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=tool.name, description=tool.description, parameters_json_schema=tool.params_schema
                ),
                max_retries=2,
                args_validator=_ANY,
            )
            for tool in self.catalogue
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        if self.submitted is not None:
            raise UsageError(f"this toolset's draft was already submitted as plan {self.submitted}: nothing is added")
        step = {"id": len(self.steps) + 1, "tool": name, "params": tool_args, "rationale": f"The agent's call {name}."}
        self.steps.append(step)
        checked = check(self.plan(), self.catalogue, self.runtime.policy, user=self.requester)
        problems = [v.message for v in checked.violations if v.step == step["id"]]
        if problems:  # told now, while the model can still change the call, not when the plan is submitted
            self.steps.pop()
            raise ModelRetry(f"plangate would refuse this call: {'; '.join(problems)}")
        if self.catalogue[name].effect == "read" and self.read_category is not None:
            ran = await self._read_now(step)
            if ran is not None:
                return ran
        return {
            "held": f"step {step['id']} of the plan, run only after the plan is approved",
            "refer_to_output_as": f"${{{step['id']}}}",
        }

    async def _read_now(self, step: dict[str, Any]) -> Any:
        plan = {"task": f"{self.task} (a read)", "category": self.read_category, "steps": [{**step, "id": 1}]}
        record = await self.runtime.asubmit(plan, requested_by=self.requester)
        if record.status != "approved":  # the policy wants a person even for this read: it waits with the rest
            return None
        self.ran_at_once.append(record.id)
        result = await self.runtime.aexecute(record.id)
        return result.outputs.get(1) if result.ok else {"error": result.error}

    def plan(self) -> dict[str, Any]:
        """The draft plan so far: every call of the run, in order."""
        return {"task": self.task, "category": self.category, "steps": list(self.steps)}

    async def submit(self) -> PlanRecord:
        """Submit the draft as one plan: checked, held against the policy, and waiting for its approvals."""
        if not self.steps:
            raise ValueError("the agent called no tool: there is no plan to submit")
        if self.submitted is not None:  # a second plan of the same calls would make their effects twice
            raise UsageError(f"this toolset's draft was already submitted as plan {self.submitted}: make a new one")
        record = await self.runtime.asubmit(self.plan(), requested_by=self.requester)
        self.submitted = record.id
        return record
