"""The optional parts behind extras: one check, and one message naming the ``pip install``.

The core never imports an optional SDK. Where a command reaches one, it calls :func:`need`
first, so a missing extra ends the command with one plain line (a :class:`UsageError`,
exit 2 on the command line) instead of a traceback from deep inside an import.
"""

from __future__ import annotations

import importlib

from plangate.errors import UsageError

__all__ = ["EXTRAS", "MissingExtraError", "need"]

# Each extra and the modules it brings (import names, not distribution names).
EXTRAS: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "uvicorn", "jinja2", "itsdangerous", "multipart", "argon2", "prometheus_client"),
    "metrics": ("prometheus_client",),
    "otel": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
    "mcp": ("mcp",),
    "temporal": ("temporalio",),
    "postgres": ("psycopg",),
    "llamacpp": ("llama_cpp",),
    "anthropic": ("anthropic",),
    "openai": ("openai",),
    "pydantic-ai": ("pydantic_ai",),
    "extract": ("jsonschema",),
}


class MissingExtraError(UsageError):
    """Something asked for needs an extra that is not installed."""


def need(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtraError` unless ``extra``'s modules (or just ``modules``) import.

    ``what`` names the thing asked for: ``serve`` gives ``serve needs the server extra: ...``.
    """
    for module in modules if modules is not None else EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingExtraError(f"{what} needs the {extra} extra: pip install 'plangate[{extra}]'") from None
