"""An OpenTelemetry tracer provider made from the standard ``OTEL_*`` variables, or none.

Read from a mapping (``os.environ`` in a process, any dict in a test), so a provider can be
made without touching the process's global one. Nothing here is imported unless a variable
asks for traces: a process with none of them never loads the SDK.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from plangate.errors import UsageError

_DEFAULT_ENDPOINT = "http://localhost:4318"
_EXPORTERS = ("otlp", "console", "none")


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the variables ask for traces: an exporter or an endpoint, and the SDK not disabled."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = exporters(env)
    if names:
        return names != ["none"]
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def exporters(env: Mapping[str, str]) -> list[str]:
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    unknown = [n for n in names if n not in _EXPORTERS]
    if unknown:
        raise UsageError(f"OTEL_TRACES_EXPORTER={unknown[0]!r} is not supported: use otlp, console or none")
    return names


def endpoint(env: Mapping[str, str]) -> str:
    """Where OTLP/HTTP spans go: the traces endpoint as given, else ``/v1/traces`` under the base one."""
    traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or _DEFAULT_ENDPOINT
    return base.rstrip("/") + "/v1/traces"


def headers(env: Mapping[str, str]) -> dict[str, str]:
    """``key=value,key2=value2`` (values URL-encoded), the traces' own list over the general one."""
    text = env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS") or ""
    found: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            found[urllib.parse.unquote(key.strip()).lower()] = urllib.parse.unquote(value.strip())
    return found


def resource_attributes(env: Mapping[str, str]) -> dict[str, str]:
    attributes = {}
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = urllib.parse.unquote(value.strip())
    attributes["service.name"] = env.get("OTEL_SERVICE_NAME") or attributes.get("service.name") or "plangate"
    return attributes


def _check_protocol(env: Mapping[str, str]) -> None:
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    if protocol.strip() not in ("", "http/protobuf"):
        raise UsageError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol.strip()!r} is not supported: plangate sends traces "
            "over OTLP/HTTP (http/protobuf); point it at the collector's HTTP port (4318)"
        )


def _timeout(env: Mapping[str, str]) -> float | None:
    text = env.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or env.get("OTEL_EXPORTER_OTLP_TIMEOUT")
    try:
        return float(text) / 1000 if text else None  # the variables give milliseconds
    except ValueError:
        raise UsageError(f"OTEL_EXPORTER_OTLP_TIMEOUT={text!r} is not a number of milliseconds") from None


def provider(env: Mapping[str, str]) -> Any:
    """A new SDK ``TracerProvider`` exporting as the variables say (call only when :func:`wanted`)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    made = TracerProvider(resource=Resource.create(resource_attributes(env)), shutdown_on_exit=True)
    for name in exporters(env) or ["otlp"]:
        if name == "otlp":
            _check_protocol(env)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=endpoint(env), headers=headers(env) or None, timeout=_timeout(env))
            made.add_span_processor(BatchSpanProcessor(exporter))
        elif name == "console":
            made.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    return made
