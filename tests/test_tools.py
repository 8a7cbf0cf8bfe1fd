from __future__ import annotations

import asyncio
import dataclasses
import enum
import sys
import typing
from datetime import datetime
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ValidationError
from typing_extensions import TypedDict

from plangate import ParamsError, RunContext, Tool, ToolDefinitionError, tool


class Address(TypedDict):
    street: str
    city: str


@dataclasses.dataclass
class Money:
    amount: float
    currency: str


class Order(BaseModel):
    id: int
    items: list[str]


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_all_three_forms_make_a_tool() -> None:
    @tool
    def bare(x: int) -> int:
        return x

    @tool(effect="write", scopes=["a:b"])
    def called(x: int) -> int:
        return x

    def plain(x: int) -> int:
        return x

    wrapped = tool(plain, effect="irreversible", external=True)
    assert all(isinstance(t, Tool) for t in (bare, called, wrapped))
    assert (bare.effect, called.effect, wrapped.effect) == ("read", "write", "irreversible")
    assert called.scopes == ("a:b",) and wrapped.external
    assert bare(3) == 3, "calling a tool calls the function unchanged"


def test_schemas_from_plain_types_unions_lists_typeddicts_dataclasses_and_models() -> None:
    @tool
    def everything(
        count: int,
        ratio: float,
        label: str | None,
        key: int | str,
        tags: list[str],
        address: Address,
        price: Money,
        order: Order,
        mode: Literal["fast", "slow"] = "fast",
        colour: Colour = Colour.RED,
        when: datetime | None = None,
    ) -> dict[str, Any]:
        return {}

    props = everything.params_schema["properties"]
    assert props["count"]["type"] == "integer"
    assert props["ratio"]["type"] == "number"
    assert {b.get("type") for b in props["label"]["anyOf"]} == {"string", "null"}
    assert {b["type"] for b in props["key"]["anyOf"]} == {"integer", "string"}
    assert props["tags"] == {"items": {"type": "string"}, "title": "Tags", "type": "array"}
    assert set(everything.params_schema["required"]) == {
        "count",
        "ratio",
        "label",
        "key",
        "tags",
        "address",
        "price",
        "order",
    }
    defs = everything.params_schema["$defs"]
    assert set(defs) >= {"Address", "Money", "Order", "Colour"}
    assert everything.params_schema["additionalProperties"] is False
    assert everything.output_schema["type"] == "object"

    kwargs = everything.validate_params(
        {
            "count": 1,
            "ratio": 2,
            "label": None,
            "key": "k",
            "tags": ["a"],
            "address": {"street": "Main", "city": "Paris"},
            "price": {"amount": 1.5, "currency": "EUR"},
            "order": {"id": 7, "items": []},
            "colour": "blue",
            "when": "2026-11-29T10:00:00Z",
        }
    )
    assert isinstance(kwargs["price"], Money) and isinstance(kwargs["order"], Order)
    assert kwargs["colour"] is Colour.BLUE and isinstance(kwargs["when"], datetime)
    assert kwargs["address"] == {"street": "Main", "city": "Paris"}
    assert "mode" in kwargs and kwargs["mode"] == "fast"


def test_unknown_missing_and_ill_typed_params_are_rejected() -> None:
    @tool
    def refund(invoice_id: str, amount: float) -> None:
        return None

    with pytest.raises(ParamsError) as err:
        refund.validate_params({"invoice_id": 42, "extra": 1})
    locations = {p.location for p in err.value.problems}
    assert locations == {"invoice_id", "amount", "extra"}
    assert "not a known field" in str(err.value)
    assert refund.param_errors({"invoice_id": "42", "amount": 5}) == []


def test_validation_is_strict_json() -> None:
    @tool
    def f(n: int, flag: bool) -> None:
        return None

    assert [e["loc"] for e in f.param_errors({"n": "42", "flag": True})] == [("n",)]
    assert [e["loc"] for e in f.param_errors({"n": 4, "flag": "yes"})] == [("flag",)]


def test_description_and_param_docs_come_from_the_docstring() -> None:
    @tool
    def send(to: str, body: str) -> str:
        """Send a message.

        It is queued first.

        Args:
            to: The recipient's address.
            body: The text,
                over two lines.

        Returns:
            The message id.
        """
        return ""

    assert send.description == "Send a message.\n\nIt is queued first."
    props = send.params_schema["properties"]
    assert props["to"]["description"] == "The recipient's address."
    assert props["body"]["description"] == "The text, over two lines."

    @tool
    def rest(x: int) -> int:
        """Double it.

        :param x: the number
        """
        return 2 * x

    assert rest.description == "Double it."
    assert rest.params_schema["properties"]["x"]["description"] == "the number"


def test_ctx_is_not_part_of_the_schema() -> None:
    @tool(effect="write", idempotent=True)
    def pay(amount: float, ctx: RunContext) -> str:
        return ctx.idempotency_key

    @tool
    def other(x: int, context: RunContext) -> int:
        return x

    assert pay.ctx_param == "ctx" and other.ctx_param == "context"
    assert list(pay.params_schema["properties"]) == ["amount"]
    assert list(other.params_schema["properties"]) == ["x"]
    ctx = RunContext(plan_id="p-1", step_id=3, now=datetime(2026, 1, 1))
    assert pay(1.0, ctx) == "p-1:3"


def test_async_tools_are_detected() -> None:
    @tool
    async def fetch(url: str) -> str:
        await asyncio.sleep(0)
        return url

    assert fetch.is_async
    assert asyncio.run(fetch("x")) == "x"


def test_idempotent_defaults_follow_the_effect() -> None:
    @tool
    def read(x: int) -> int:
        return x

    @tool(effect="write")
    def write(x: int) -> int:
        return x

    @tool(effect="read", idempotent=False)
    def fresh(x: int) -> int:
        return x

    assert (read.idempotent, write.idempotent, fresh.idempotent) == (True, False, False)


def test_params_that_shadow_model_attributes_work() -> None:
    @tool
    def shadow(json: str, copy: int, model_config: str) -> str:
        return json

    assert shadow.param_names == ("json", "copy", "model_config")
    assert shadow.validate_params({"json": "a", "copy": 1, "model_config": "c"}) == {
        "json": "a",
        "copy": 1,
        "model_config": "c",
    }


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: tool(lambda x: x), "a tool name"),
        (lambda: tool(_untyped), "has no type hint"),
        (lambda: tool(_no_return), "return type hint"),
        (lambda: tool(_varargs), "plain named parameter"),
        (lambda: tool(_typed, effect="delete"), "effect must be one of"),
        (lambda: tool(_typed, name="bad name"), "a tool name"),
        (lambda: tool(_typed, resource="row:{nope}"), "unknown parameter"),
        (lambda: tool(tool(_typed)), "already a tool"),
        (lambda: tool(42), "must be a function"),  # type: ignore[call-overload]
        (lambda: tool(_opaque_param), "not supported"),
        (lambda: tool(_opaque_return), "cannot be described"),
    ],
)
def test_bad_definitions_fail_clearly(build: Any, message: str) -> None:
    with pytest.raises(ToolDefinitionError, match=message):
        build()


def _untyped(x) -> int:  # type: ignore[no-untyped-def]
    return 1


def _no_return(x: int):  # type: ignore[no-untyped-def]
    return x


def _varargs(*values: int) -> int:
    return 0


def _typed(x: int) -> int:
    return x


class Opaque:
    pass


def _opaque_param(x: Opaque) -> int:
    return 1


def _opaque_return(x: int) -> Opaque:
    return Opaque()


def test_output_is_checked_and_serialised() -> None:
    @tool
    def total(x: int) -> Money:
        return Money(amount=x, currency="EUR")

    @tool
    def liar(x: int) -> int:
        return "not a number"  # type: ignore[return-value]

    assert total.dump_output(total(2)) == {"amount": 2.0, "currency": "EUR"}
    with pytest.raises(ValidationError):
        liar.dump_output(liar(1))


def test_resource_templates_fill_from_literal_params() -> None:
    @tool(effect="write", resource="invoice:{invoice_id}")
    def touch(invoice_id: str) -> None:
        return None

    assert touch.resource_for({"invoice_id": "42"}) == "invoice:42"
    assert touch.resource_for({"invoice_id": "${1.id}"}) == "invoice:*"
    assert touch.resource_for({}) == "invoice:*"


class _StdlibInvoice(typing.TypedDict):
    total: float


class _Invoice(TypedDict):
    total: float


def _returns_stdlib_typeddict(invoice_id: str) -> _StdlibInvoice:
    return {"total": 1.0}


def _takes_stdlib_typeddict(invoice: _StdlibInvoice) -> str:
    return "ok"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="pydantic takes typing.TypedDict from Python 3.12")
@pytest.mark.parametrize("fn", [_returns_stdlib_typeddict, _takes_stdlib_typeddict])
def test_a_stdlib_typeddict_before_3_12_is_refused_in_one_line_naming_the_fix(fn: Any) -> None:
    with pytest.raises(ToolDefinitionError) as refused:
        tool(fn)
    assert str(refused.value) == (
        f"tool {fn.__name__!r}: it uses typing.TypedDict, which pydantic refuses before Python 3.12: "
        "write 'from typing_extensions import TypedDict' instead"
    )


def test_a_typing_extensions_typeddict_describes_a_typed_output() -> None:
    def get_invoice(invoice_id: str) -> _Invoice:
        """Fetch one invoice."""
        return {"total": 1.0}

    schema = tool(get_invoice).output_schema
    assert schema["properties"] == {"total": {"title": "Total", "type": "number"}}
