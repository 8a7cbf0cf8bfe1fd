"""A raw Temporal chain for bench/engine.py: N no-op activities in a row, no plangate at all."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn(name="bench.noop")
def noop_activity(i: int) -> int:
    return i


@workflow.defn(name="bench.RawChain")
class RawChain:
    @workflow.run
    async def run(self, n: int) -> int:
        value = 0
        for i in range(n):
            value = await workflow.execute_activity(
                noop_activity, i, activity_id=f"raw:{i}", start_to_close_timeout=timedelta(seconds=60)
            )
        return value
