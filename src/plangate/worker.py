"""Workers: processes that claim approved plans and run them, on one machine or many.

A worker leases a plan (``approved``, or ``running`` under a lease that expired because
its worker died), runs it with ``resume`` semantics, renews the lease as steps finish,
and releases it at the end. On PostgreSQL the claim uses ``FOR UPDATE SKIP LOCKED``, so
workers never wait for each other or take the same plan; on SQLite the database's write
lock serialises claims. A killed worker's plan is taken over once its lease expires, and
the engine's resume rules decide what runs again: never a completed step, an idempotent
step with no outcome under the same key, anything else halts for a person.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from plangate._clock import Clock, SystemClock, iso
from plangate.engine import Progress, RunResult
from plangate.errors import LeaseLostError
from plangate.policy import Policy
from plangate.runtime import Runtime
from plangate.tools import Catalogue


@dataclass
class Worker:
    catalogue: Catalogue
    db: str | None = None
    policy: Policy | None = None
    lease_seconds: float = 30.0
    name: str = field(default_factory=lambda: f"{socket.gethostname()}:{id(object())}")
    clock: Clock = field(default_factory=SystemClock)

    def run_one(self) -> RunResult | None:
        """Claim and run one plan; None when there is nothing to do."""
        runtime = Runtime(self.catalogue, self.policy, db=self.db, clock=self.clock)
        try:
            plan_id = runtime.store.claim(self.name, iso(self.clock.now()), self._until())
            if plan_id is None:
                return None
            last = [time.monotonic()]

            def renew(_: Progress) -> None:
                if time.monotonic() - last[0] > self.lease_seconds / 3:
                    if not runtime.store.renew(plan_id, self.name, self._until()):
                        raise LeaseLostError(
                            f"worker {self.name} lost its lease on plan {plan_id}: another worker "
                            "took it over, so this one stops"
                        )
                    last[0] = time.monotonic()

            try:
                return runtime.resume(plan_id, actor=f"worker:{self.name}", progress=renew)
            finally:
                runtime.store.release(plan_id, self.name)
        finally:
            runtime.close()

    def serve(self, *, drain: bool = False, poll: float = 1.0, on_result: Any = None) -> int:
        """Run plans until stopped (or, with ``drain``, until none is left). Returns how many ran."""
        ran = 0
        while True:
            try:
                result = self.run_one()
            except LeaseLostError:
                continue  # another worker has the plan now; look for the next one
            if result is None:
                if drain:
                    return ran
                time.sleep(poll)
                continue
            ran += 1
            if on_result is not None:
                on_result(result)

    def _until(self) -> str:
        return iso(self.clock.now() + timedelta(seconds=self.lease_seconds))
