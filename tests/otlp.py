"""An OTLP/HTTP trace receiver on loopback that decodes what it receives (the protobuf of the real protocol)."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    status: int
    message: str
    events: list[tuple[str, dict[str, Any]]]
    service: str


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf in, protobuf out."""

    url: str
    spans: list[Span] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def named(self, name: str) -> list[Span]:
        return [s for s in self.spans if s.name == name]

    def one(self, name: str) -> Span:
        found = self.named(name)
        assert len(found) == 1, [s.name for s in self.spans]
        return found[0]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind)


def _attributes(items: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in items}


def _decode(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource in request.resource_spans:
        service = str(_attributes(resource.resource.attributes).get("service.name"))
        for scope in resource.scope_spans:
            for s in scope.spans:
                events = [(e.name, _attributes(e.attributes)) for e in s.events]
                spans.append(
                    Span(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        attributes=_attributes(s.attributes),
                        status=s.status.code,
                        message=s.status.message,
                        events=events,
                        service=service,
                    )
                )
    return spans


@contextlib.contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver on a free loopback port for as long as the block runs."""
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            ok = self.path == "/v1/traces"
            if ok:
                with lock:
                    found.spans.extend(_decode(body))
                    found.headers.append({k.lower(): v for k, v in self.headers.items()})
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    found = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield found
    server.shutdown()
    server.server_close()
