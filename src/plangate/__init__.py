"""plangate: a governed agent runtime. Plans are typed, checked, approved, then run."""

from plangate.check import RULES, CheckResult, check
from plangate.errors import (
    CatalogueError,
    ConditionError,
    GovernanceError,
    InputError,
    NotFoundError,
    ParamsError,
    PlanError,
    PlangateError,
    PolicyError,
    RefError,
    RefusedInputError,
    SelfApprovalError,
    StaleHashError,
    StateError,
    StoreError,
    ToolDefinitionError,
    UsageError,
)
from plangate.plan import LIMITS, SCHEMA_VERSION, Limits, Plan, Step, plan_json_schema
from plangate.policy import POLICY_RULES, Policy, PolicyDecision
from plangate.record import PlanRecord
from plangate.results import Progress, RunResult
from plangate.runtime import Runtime
from plangate.tools import Catalogue, RunContext, Tool, tool
from plangate.violations import Violation

__version__ = "0.1.0"

__all__ = [
    "LIMITS",
    "POLICY_RULES",
    "RULES",
    "SCHEMA_VERSION",
    "Catalogue",
    "CatalogueError",
    "CheckResult",
    "ConditionError",
    "GovernanceError",
    "InputError",
    "Limits",
    "NotFoundError",
    "ParamsError",
    "Plan",
    "PlanError",
    "PlanRecord",
    "PlangateError",
    "Policy",
    "PolicyDecision",
    "PolicyError",
    "Progress",
    "RefError",
    "RefusedInputError",
    "RunContext",
    "RunResult",
    "Runtime",
    "SelfApprovalError",
    "StaleHashError",
    "StateError",
    "Step",
    "StoreError",
    "Tool",
    "ToolDefinitionError",
    "UsageError",
    "Violation",
    "__version__",
    "check",
    "plan_json_schema",
    "tool",
]
