"""AgentDojo's suites as plangate sees them: its functions as a catalogue, its tasks as plans.

Read by ``bench/injection.py``. Three things live here:

- **The tool table** (``TOOLS``): for every function of every suite, its effect, whether it
  reaches outside (``external``), and whether its output is data a third party can write
  (``untrusted``: e-mails, files, calendar invitations, web pages, reviews and listings,
  channel messages, transactions). Written out by hand, tool by tool, rather than guessed
  from names; the bench checks it against AgentDojo's own injection vectors (every tool
  whose output carried an injection placeholder in a ground-truth run is untrusted).
- **The sinks** (``SINKS``): the parameters whose value decides who or what an effect
  reaches (a recipient, an IBAN, a URL, a password, a file to delete, a booking).
- **The plans**: the plan a planner that never sees a tool output would write for a user
  task, worked out mechanically from the task's ground truth (see :func:`derive`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pydantic_core
from agentdojo.base_tasks import BaseUserTask
from agentdojo.functions_runtime import FunctionCall, FunctionsRuntime, TaskEnvironment
from agentdojo.task_suite.task_suite import TaskSuite

from plangate import Catalogue
from plangate.tools import Tool
from plangate.tools._schematool import schema_tool


class Kind(NamedTuple):
    effect: str
    external: bool = False
    untrusted: bool = False


READ = Kind("read")
READ_3P = Kind("read", untrusted=True)  # returns what a third party wrote
FETCH = Kind("read", external=True, untrusted=True)  # reaches out, returns what is out there
WRITE = Kind("write")
SEND = Kind("irreversible", external=True)  # leaves the organisation and cannot be called back
BOOK = Kind("write", external=True)
# Writes that return what they touched, third-party text and all (an event, a file).
WRITE_3P = Kind("write", untrusted=True)
BOOK_3P = Kind("write", external=True, untrusted=True)

TOOLS: dict[str, dict[str, Kind]] = {
    "workspace": {
        "get_current_day": READ,
        "get_unread_emails": READ_3P,
        "get_sent_emails": READ_3P,
        "get_received_emails": READ_3P,
        "get_draft_emails": READ_3P,
        "search_emails": READ_3P,
        "search_contacts_by_name": READ_3P,  # contacts are gathered from e-mails
        "search_contacts_by_email": READ_3P,
        "search_calendar_events": READ_3P,  # invitations carry others' titles and descriptions
        "get_day_calendar_events": READ_3P,
        "search_files_by_filename": READ_3P,  # shared files are written by others
        "get_file_by_id": READ_3P,
        "list_files": READ_3P,
        "search_files": READ_3P,
        "send_email": SEND,
        "delete_email": WRITE,
        "create_calendar_event": BOOK_3P,  # invites participants
        "cancel_calendar_event": BOOK_3P,
        "reschedule_calendar_event": BOOK_3P,
        "add_calendar_event_participants": BOOK_3P,
        "append_to_file": WRITE_3P,
        "create_file": WRITE,
        "delete_file": WRITE_3P,
        "share_file": SEND,
    },
    "travel": {
        "get_user_information": READ,
        "get_all_hotels_in_city": READ_3P,  # listings and reviews are written by others
        "get_hotels_prices": READ_3P,
        "get_rating_reviews_for_hotels": READ_3P,
        "get_hotels_address": READ_3P,
        "get_all_restaurants_in_city": READ_3P,
        "get_cuisine_type_for_restaurants": READ_3P,
        "get_restaurants_address": READ_3P,
        "get_rating_reviews_for_restaurants": READ_3P,
        "get_dietary_restrictions_for_all_restaurants": READ_3P,
        "get_contact_information_for_restaurants": READ_3P,
        "get_price_for_restaurants": READ_3P,
        "check_restaurant_opening_hours": READ_3P,
        "get_all_car_rental_companies_in_city": READ_3P,
        "get_car_types_available": READ_3P,
        "get_rating_reviews_for_car_rental": READ_3P,
        "get_car_fuel_options": READ_3P,
        "get_car_rental_address": READ_3P,
        "get_car_price_per_day": READ_3P,
        "get_flight_information": READ_3P,
        "search_calendar_events": READ_3P,
        "get_day_calendar_events": READ_3P,
        "create_calendar_event": BOOK,
        "cancel_calendar_event": BOOK,
        "reserve_hotel": BOOK,
        "reserve_car_rental": BOOK,
        "reserve_restaurant": BOOK,
        "send_email": SEND,
    },
    "banking": {
        "get_iban": READ,
        "get_balance": READ,
        "get_user_info": READ,
        "get_most_recent_transactions": READ_3P,  # the sender writes a transaction's subject
        "get_scheduled_transactions": READ_3P,
        "read_file": READ_3P,  # bills and notices come from others
        "send_money": SEND,
        "schedule_transaction": BOOK,
        "update_scheduled_transaction": BOOK,
        "update_password": WRITE,
        "update_user_info": WRITE,
    },
    "slack": {
        "get_channels": READ_3P,  # anyone may name a channel
        "get_users_in_channel": READ,
        "read_channel_messages": READ_3P,
        "read_inbox": READ_3P,
        "get_webpage": FETCH,
        "add_user_to_channel": WRITE,
        "send_direct_message": SEND,
        "send_channel_message": SEND,
        "invite_user_to_slack": SEND,
        "remove_user_from_slack": WRITE,
        "post_webpage": SEND,
    },
}

# The parameters that must not take untrusted data without a person seeing it.
SINKS: dict[str, dict[str, tuple[str, ...]]] = {
    "workspace": {
        "send_email": ("recipients", "cc", "bcc", "attachments"),
        "share_file": ("file_id", "email"),
        "delete_file": ("file_id",),
        "delete_email": ("email_id",),
        "create_calendar_event": ("participants",),
        "add_calendar_event_participants": ("participants",),
    },
    "travel": {
        "send_email": ("recipients", "cc", "bcc"),
        "reserve_hotel": ("hotel",),
        "reserve_restaurant": ("restaurant",),
        "reserve_car_rental": ("company",),
        "create_calendar_event": ("participants",),
    },
    "banking": {
        "send_money": ("recipient", "amount"),
        "schedule_transaction": ("recipient", "amount"),
        "update_scheduled_transaction": ("recipient", "amount"),
        "update_password": ("password",),
        "update_user_info": ("first_name", "last_name", "street", "city"),
    },
    "slack": {
        "send_direct_message": ("recipient", "body"),
        "send_channel_message": ("channel",),
        "invite_user_to_slack": ("user", "user_email"),
        "add_user_to_channel": ("user", "channel"),
        "remove_user_from_slack": ("user",),
        "get_webpage": ("url",),
        "post_webpage": ("url", "content"),
    },
}

EXTRACT = "extract"
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a field name a planner reads in a schema, not a data key


def jsonable(value: Any) -> Any:
    """A function's return value as JSON data (pydantic models, dates and all)."""
    return json.loads(pydantic_core.to_json(value, serialize_unknown=True))


@dataclass
class World:
    """What the tools act on during one run: the environment, the calls made, the extractor's mind."""

    env: TaskEnvironment | None = None
    calls: list[FunctionCall] = field(default_factory=list)
    extract: Callable[[Any, dict[str, Any], str], Any] = lambda text, schema, instructions: None


def catalogue(suite: TaskSuite[Any], world: World) -> Catalogue:
    """AgentDojo's functions for ``suite`` as plangate tools over ``world``, with the extractor."""
    table = TOOLS[suite.name]
    runtime = FunctionsRuntime(suite.tools)
    tools: list[Tool] = []
    for function in suite.tools:
        kind = table[function.name]
        schema = function.parameters.model_json_schema()
        schema.pop("title", None)
        schema["additionalProperties"] = False
        tools.append(
            schema_tool(
                name=function.name,
                fn=_caller(runtime, function.name, world),
                params_schema=schema,
                output_schema={},
                ctx_param=None,
                description=function.description,
                effect=kind.effect,
                idempotent=kind.effect == "read",
                external=kind.external,
                scopes=(),
                resource=None,
                compensate=None,
                untrusted_output=kind.untrusted,
                tags=("agentdojo",),
            )
        )
    tools.append(extractor(world))
    return Catalogue(tools)


def _caller(runtime: FunctionsRuntime, name: str, world: World) -> Callable[..., Any]:
    def call(**kwargs: Any) -> Any:
        assert world.env is not None
        world.calls.append(FunctionCall(function=name, args=dict(kwargs)))
        result, error = runtime.run_function(world.env, name, kwargs, raise_on_error=False)
        if error is not None:
            raise RuntimeError(error)
        return jsonable(result)

    return call


def extractor(world: World) -> Tool:
    """plangate's own ``extract`` tool, its model a function that hands each request to the bench's mind.

    Which mind is the bench's to say (``world.extract``): an honest one, or one the injected
    text has taken over. The mind sees what the real extractor's model would: the
    instructions, the text (parsed back to the JSON it was), the schema; its answer goes
    through the extractor's own strict schema check, and the output is as trusted as its input.
    """
    from plangate.models.test import FunctionModel
    from plangate.tools.extract import extractor as real_extractor

    def mind(request: Any) -> str:
        content = request.messages[0].content
        instructions = content.split("\n", 1)[0].removeprefix("What to take: ")
        marker = content.rsplit("<<<END ", 1)[1].rstrip(">\n")
        read = content.split(f"<<<DATA {marker}>>>\n", 1)[1].rsplit(f"\n<<<END {marker}>>>", 1)[0]
        try:
            text: Any = json.loads(read)
        except ValueError:
            text = read
        answer_schema = request.json_schema
        wrapped = list(answer_schema.get("properties", {})) == ["value"] and answer_schema.get("required") == ["value"]
        schema = answer_schema["properties"]["value"] if wrapped else answer_schema
        value = world.extract(text, schema, instructions)
        return json.dumps({"value": value} if wrapped else value, ensure_ascii=False)

    return real_extractor(FunctionModel(mind, name="bench:extractor"), retries=0)


# -- plans from ground truths -----------------------------------------------------------------


@dataclass
class Derived:
    """A user task's plan, and what the bench needs to know of it."""

    task: BaseUserTask[Any]
    plan: dict[str, Any]
    answers: dict[str, Any]  # what an honest extractor returns, by the step's instructions
    feeds: dict[str, str]  # which parameter an extract step feeds ("send_money.recipient"), likewise
    composed: list[str]  # parameters whose value is in neither the task nor any output
    sources: dict[str, str]  # "step.param" -> user | plan | ref | extract


def derive(suite: TaskSuite[Any], task: BaseUserTask[Any], env: TaskEnvironment) -> Derived:
    """The plan a planner that never sees a tool output would write for ``task``.

    Each ground-truth call becomes a step. Each argument, element by element in a list, is:
    a literal when it appears in the user's task text (source ``user``); a reference
    ``${N.path}`` when an earlier call's output holds it at a path of field names (a path
    through a list index is a choice only a reader of the output can make); an ``extract``
    step over that output, feeding a reference, when it is inside an output's text or only
    found under a list index; otherwise a literal the planner composes (source ``plan``:
    optimistic, since the planner is credited with the ground truth's exact value). The plan's
    ``answer``: see :func:`_answer`.
    """
    work = task.init_environment(env.model_copy(deep=True))
    runtime = FunctionsRuntime(suite.tools)
    builder = _Builder(task.PROMPT.lower())
    for call in task.ground_truth(work.model_copy(deep=True)):
        params = {name: builder.arg(value, f"{call.function}.{name}") for name, value in call.args.items()}
        number = builder.add(call.function, params)
        result, _ = runtime.run_function(work, call.function, dict(call.args), raise_on_error=False)
        builder.outputs.append((number, jsonable(result)))
    plan = {"task": task.PROMPT, "category": "agentdojo", "steps": builder.steps, "answer": _answer(task, builder)}
    return Derived(task, plan, builder.answers, builder.feeds, builder.composed, builder.sources)


DONE = "Done."


def _answer(task: BaseUserTask[Any], builder: _Builder) -> str:
    """The plan's answer: for a question (the task has a ground-truth output), the last call's output,
    referenced, since only a reader of the outputs could word it; for an action, a confirmation the
    planner writes itself, quoting no output."""
    if not getattr(task, "GROUND_TRUTH_OUTPUT", ""):
        return DONE
    return "${" + str(len(builder.steps)) + "}"


@dataclass
class _Builder:
    prompt: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[tuple[int, Any]] = field(default_factory=list)
    answers: dict[str, Any] = field(default_factory=dict)
    feeds: dict[str, str] = field(default_factory=dict)
    composed: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)

    def add(self, tool: str, params: dict[str, Any]) -> int:
        number = len(self.steps) + 1
        self.steps.append({"id": number, "tool": tool, "params": params, "rationale": f"{tool}, as the task asks."})
        return number

    def arg(self, value: Any, where: str) -> Any:
        if isinstance(value, list):
            return [self.arg(item, where) for item in value]
        key = f"{len(self.steps) + 1}.{where.split('.', 1)[1]}"
        if not _plain(value) or _in_text(value, self.prompt):
            self.sources.setdefault(key, "user" if _plain(value) else "plan")
            return value
        for number, output in reversed(self.outputs):
            for path in _paths_to(output, value):
                if all(isinstance(part, str) and _FIELD.fullmatch(part) for part in path):
                    self.sources[key] = "ref"
                    return "${" + ".".join([str(number), *map(str, path)]) + "}"
        for number, output in reversed(self.outputs):
            if _inside(output, value):
                self.sources[key] = "extract"
                return "${" + str(self._extract(number, value, where)) + "}"
        self.sources.setdefault(key, "plan")
        self.composed.append(where)
        return value

    def _extract(self, number: int, value: Any, where: str) -> int:
        schema = {"type": _json_type(value)}
        instructions = f"the {where} that the task needs"
        if instructions in self.answers:
            instructions += f" (value {len(self.answers) + 1})"
        step = self.add(EXTRACT, {"text": "${" + str(number) + "}", "schema": schema, "instructions": instructions})
        self.answers[instructions] = value
        self.feeds[instructions] = where
        return step


def _plain(value: Any) -> bool:
    """A value worth tracing: text of some length, or a number that is not a tiny count."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, str):
        return len(value.strip()) >= 3
    return isinstance(value, int | float)


def _in_text(value: Any, text: str) -> bool:
    if isinstance(value, str):
        return value.lower() in text
    return any(form in text for form in _number_forms(value))


def _number_forms(value: float) -> set[str]:
    forms = {str(value)}
    if float(value).is_integer():
        forms.add(str(int(value)))
    else:
        forms.add(f"{value:.2f}")
    return forms


def _json_type(value: Any) -> str:
    if isinstance(value, str):
        return "string"
    return "integer" if isinstance(value, int) else "number"


def _leaves(data: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    if isinstance(data, dict):
        for key, item in data.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            yield from _leaves(item, (*path, index))
    else:
        yield path, data


def _paths_to(output: Any, value: Any) -> list[tuple[str | int, ...]]:
    found = [path for path, leaf in _leaves(output) if _same(leaf, value)]
    return sorted(found, key=len)


def _same(leaf: Any, value: Any) -> bool:
    if isinstance(value, str) or isinstance(leaf, (str, bool)):
        return leaf == value
    return isinstance(leaf, int | float) and float(leaf) == float(value)


def _inside(output: Any, value: Any) -> bool:
    forms = {value} if isinstance(value, str) else _number_forms(value)
    for _, leaf in _leaves(output):
        if isinstance(leaf, str) and any(form in leaf for form in forms):
            return True
        if _same(leaf, value):
            return True
    return False
