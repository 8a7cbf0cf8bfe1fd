"""Benchmark: what traces cost per step, on a sequential chain of 100 no-op steps on SQLite.

Three ways, measured in this run, on this machine: tracing off (no ``OTEL_*`` variables);
spans batched to an in-memory exporter (the cost of making them); and spans batched over
OTLP/HTTP to a receiver on loopback (the cost of making and sending them).

Run: ``python bench/tracing.py [--repeat N]`` (needs the ``otel`` extra).
"""

from __future__ import annotations

import argparse
import http.server
import tempfile
import threading
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine import chain, median_ms_per_step, noop
from plangate import Catalogue, tracing
from plangate.runtime import Runtime

STEPS = 100


def per_step(folder: Path, traces: tracing.Traces, repeat: int) -> float:
    """The median time per step over ``repeat`` runs of the chain."""
    rt = Runtime(Catalogue([noop]), db=f"sqlite:///{folder}/bench.db?synchronous=normal", traces=traces)
    ids = []
    for _ in range(repeat):
        record = rt.submit(chain(STEPS), "bench")
        ids.append(rt.approve(record.id, "reviewer", record.hash).id)
    pending = iter(ids)
    result = median_ms_per_step(lambda: rt.execute(next(pending)).ok and None, STEPS, repeat)
    traces.flush()
    rt.close()
    return result


class _Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of the chain per round (their median counts)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, the ways taking turns (the best is shown)")
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    memory = TracerProvider()
    memory.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    ways = {
        "off": tracing.OFF,
        "in-memory exporter": tracing.Traces(memory.get_tracer("bench"), memory),
        "OTLP/HTTP to loopback": tracing.from_env(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}"}
        ),
    }
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(args.rounds):  # the ways take turns, so a busy moment on the machine hits them all
        for name, traces in ways.items():
            folder = Path(tempfile.mkdtemp(prefix="plangate-trace-"))
            best[name] = min(best[name], per_step(folder, traces, args.repeat))
    print(f"sequential chain of {STEPS} no-op steps, SQLite synchronous=normal, best of {args.rounds} rounds")
    for name, ms in best.items():
        print(f"  {name:22} {ms:7.3f} ms/step  ({(ms - best['off']) * 1000:+4.0f} µs/step over off)")
    server.shutdown()


if __name__ == "__main__":
    main()
