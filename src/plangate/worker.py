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

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from plangate import lifecycle
from plangate._clock import Clock, SystemClock, iso
from plangate.errors import GovernanceError, LeaseLostError
from plangate.policy import Policy
from plangate.results import RunResult
from plangate.runtime import Runtime
from plangate.tools import Catalogue


@dataclass
class Worker:
    catalogue: Catalogue
    db: str | None = None
    policy: Policy | None = None
    lease_seconds: float = 30.0
    name: str = field(default_factory=lambda: lifecycle.runner(f"worker-{id(object()):x}"))
    clock: Clock = field(default_factory=SystemClock)
    refused: list[str] = field(default_factory=list)
    """Plans this worker claimed but was not allowed to run, and why."""

    def run_one(self) -> RunResult | None:
        """Claim and run one plan; None when there is nothing to do."""
        runtime = Runtime(self.catalogue, self.policy, db=self.db, clock=self.clock, lease_seconds=self.lease_seconds)
        try:
            skip: list[str] = []  # refused in this pass: claimed again on the next (it may have been approved since)
            while True:
                plan_id = runtime.store.claim(self.name, iso(self.clock.now()), self._until(), skip=skip)
                if plan_id is None:
                    return None
                try:
                    return runtime.resume(plan_id, actor=f"worker:{self.name}", owner=self.name)
                except GovernanceError as refused:  # it may not run: sent back for approval, or the log disagrees
                    skip.append(plan_id)
                    self.refused.append(f"{plan_id}: {refused}")
                finally:
                    runtime.store.release(plan_id, self.name)
        finally:
            runtime.store.close()  # the catalogue's MCP connections stay open for the next plan (see close)

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

    def close(self) -> None:
        """End the catalogue's connections to MCP servers."""
        self.catalogue.close()

    def _until(self) -> str:
        return iso(self.clock.now() + timedelta(seconds=self.lease_seconds))
