"""Benchmark: what metrics and traces cost the engine per step, against both off in the same run.

A sequential chain of 100 no-op steps on SQLite (synchronous=normal), five ways taking
turns so that a busy moment on the shared machine hits them all: everything off (nobody
exposes metrics, no ``OTEL_*`` variables); metrics counted; spans batched to an in-memory
exporter (the cost of making them); spans batched over OTLP/HTTP to a receiver on loopback
(making and sending them); and metrics with OTLP/HTTP spans together. Prints the best median
per step of each way and its ratio to off.

Run: ``python bench/observability.py [--repeat N] [--rounds N]`` (needs the ``metrics`` and
``otel`` extras, both in ``make bench``).
"""

from __future__ import annotations

import argparse
import http.server
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine import chain, median_ms_per_step, noop
from plangate import Catalogue, metrics, tracing
from plangate.runtime import Runtime

STEPS = 100


def per_step(folder: Path, traces: tracing.Traces, counted: bool, repeat: int) -> float:
    """The median time per step over ``repeat`` runs of the chain, metrics counted or not."""
    rt = Runtime(Catalogue([noop]), db=f"sqlite:///{folder}/bench.db?synchronous=normal", traces=traces)
    ids = []
    for _ in range(repeat):
        record = rt.submit(chain(STEPS), "bench")
        ids.append(rt.approve(record.id, "reviewer", record.hash).id)
    pending = iter(ids)
    if counted:
        metrics.start()
    try:
        return median_ms_per_step(lambda: rt.execute(next(pending)).ok and None, STEPS, repeat)
    finally:
        metrics.stop()
        traces.flush()
        rt.close()


class _Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes the spans and throws them away."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of the chain per round (their median counts)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, the ways taking turns (the best is shown)")
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    memory = TracerProvider()
    memory.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    otlp = tracing.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}"})
    ways: dict[str, tuple[tracing.Traces, bool]] = {
        "off": (tracing.OFF, False),
        "metrics": (tracing.OFF, True),
        "traces, in memory": (tracing.Traces(memory.get_tracer("bench"), memory), False),
        "traces, OTLP/HTTP": (otlp, False),
        "metrics + OTLP/HTTP": (otlp, True),
    }
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(args.rounds):
        for name, (traces, counted) in ways.items():
            folder = Path(tempfile.mkdtemp(prefix="plangate-observe-"))
            best[name] = min(best[name], per_step(folder, traces, counted, args.repeat))
    server.shutdown()
    off = best["off"]
    print(f"sequential chain of {STEPS} no-op steps, SQLite synchronous=normal, best of {args.rounds} rounds")
    for name, ms in best.items():
        print(f"  {name:20} {ms:7.3f} ms/step  {ms / off:5.2f}x off  ({(ms - off) * 1000:+5.1f} µs/step)")


if __name__ == "__main__":
    main()
