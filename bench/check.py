"""Benchmark: full check + policy of a 10-step plan with references.

The baseline, measured in the same run, is a trivial rule in plain Python (every step's
tool is on an allow-list), the floor any policy engine pays. The machines are shared and
noisy, so the ratio matters more than the absolute time.

With ``--previous SRC`` (a checkout's ``src`` folder of an earlier plangate), a fresh plan's check + policy is
also timed by that tree and by this one in alternating processes, and their ratio printed: on a machine whose
speed changes from one hour to the next, that ratio, not the absolute figure, says what changed.

Run: ``make bench`` (or ``python bench/check.py [--rounds N] [--previous SRC [--alternate N]]``).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/trees.py, beside this file, however it is loaded

import trees
from plangate import Catalogue, Plan, Policy, _overrides, check
from plangate.graph import PlanGraph

ROOT = Path(__file__).resolve().parent.parent
TARGET_US = 100.0


def ten_step_plan(variant: int = 0) -> Plan:
    """The plan; each ``variant`` differs in its values (so no cache keyed by text can help)."""
    steps = [
        {"id": 1, "tool": "get_invoice", "params": {"invoice_id": str(42 + variant)}, "expected_output": "object"},
        {"id": 2, "tool": "lookup_customer", "params": {"customer_id": "${1.customer_id}"}},
        {"id": 3, "tool": "get_invoice", "params": {"invoice_id": "43"}},
        {"id": 4, "tool": "get_invoice", "params": {"invoice_id": "44"}},
        {
            "id": 5,
            "tool": "issue_refund",
            "params": {"invoice_id": "42", "amount": "${1.total}"},
            "condition": f'${{1.status}} == "paid" and ${{1.total}} > {variant}',
        },
        {"id": 6, "tool": "issue_refund", "params": {"invoice_id": "43", "amount": "${3.total}"}},
        {"id": 7, "tool": "lookup_customer", "params": {"customer_id": "${3.customer_id}"}},
        {"id": 8, "tool": "void_refund", "params": {"refund_id": "${6.refund_id}"}},
        {"id": 9, "tool": "issue_refund", "params": {"invoice_id": "44", "amount": "${4.total}"}},
        {
            "id": 10,
            "tool": "send_email",
            "params": {
                "to": "${2.email}",
                "subject": "Refund",
                "body": "Dear ${2.name}, we refunded ${5.amount} ${1.currency}.",
            },
        },
    ]
    return Plan.parse(
        {"task": "Refunds", "category": "refunds", "steps": [{"rationale": "needed", **s} for s in steps]}
    )


def per_call_us(fn: Callable[[object], object], make: Callable[[], object], rounds: int, batch: int) -> list[float]:
    """Median-ready samples: each round times ``fn`` over ``batch`` inputs made before the clock starts."""
    samples = []
    for _ in range(rounds):
        inputs = [make() for _ in range(batch)]
        gc.collect()
        gc.disable()  # as timeit does: collector pauses are the host's noise, not the checker's cost
        try:
            start = time.perf_counter()
            for item in inputs:
                fn(item)
            samples.append((time.perf_counter() - start) / batch * 1e6)
        finally:
            gc.enable()
    return samples


def parts(
    catalogue: Catalogue, policy: Policy, fresh: Callable[[], Plan]
) -> list[tuple[str, Callable[[object], object], Callable[[], object]]]:
    """The check's parts, each with inputs made before the clock starts (the earlier parts already done)."""
    governed = _overrides.governed(catalogue, policy)

    def analysed() -> Plan:
        plan = fresh()
        for step in plan.steps:
            step.refs  # noqa: B018 - worked out now, before the clock starts
        return plan

    def with_graph() -> tuple[Plan, PlanGraph]:
        plan = analysed()
        return plan, PlanGraph.of(plan)

    def analyse(p: Any) -> object:
        return [step.refs for step in p.steps]

    def graph(p: Any) -> object:
        return PlanGraph.of(p)

    def catalogue_pass(p: Any) -> object:
        return check(p, catalogue)

    def policy_pass(pair: Any) -> object:
        plan, plan_graph = pair
        return policy.evaluate(plan, governed, user="bob", graph=plan_graph)

    return [
        ("the plan's analysis: references, condition parsed", analyse, fresh),
        ("its dependency graph", graph, analysed),
        ("the catalogue's checks (graph included)", catalogue_pass, analysed),
        ("the policy", policy_pass, with_graph),
    ]


def against_previous(previous: str, alternate: int, rounds: int, batch: int) -> tuple[float, float]:
    """A fresh plan's check + policy (us, medians) by an earlier tree and by this one, in alternating processes
    (so both see the same machine), printed with their ratio."""
    command = [sys.executable, __file__, "--fresh-only", "--rounds", str(rounds), "--batch", str(batch)]
    times = {
        label: [float(words[-1]) for words in runs]
        for label, runs in trees.alternating(previous, alternate, command).items()
    }
    old, new = statistics.median(times["previous"]), statistics.median(times["this"])
    print(f"\ncheck + policy of a fresh 10-step plan, {alternate} alternating processes of each tree (us, medians)")
    print(f"  previous tree ({previous}) {old:9.2f} us")
    print(f"  this tree {'':{len(previous) + 5}} {new:9.2f} us")
    print(f"  -> this tree takes {new / old:.2f}x the previous one's time")
    return old, new


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (the median is reported)")
    parser.add_argument("--batch", type=int, default=200, help="calls per round")
    parser.add_argument("--previous", metavar="SRC", help="an earlier plangate's src folder, timed alongside")
    parser.add_argument("--alternate", type=int, default=5, help="with --previous: processes of each tree")
    parser.add_argument("--fresh-only", action="store_true", help=argparse.SUPPRESS)  # one figure, for --previous
    args = parser.parse_args()

    catalogue = Catalogue.from_module(ROOT / "examples" / "business.py")
    policy = Policy.load(ROOT / "examples" / "policy.yaml")
    plan = ten_step_plan()
    assert check(plan, catalogue, policy, user="bob").ok
    allowed = frozenset(catalogue.names)

    def baseline(p: object) -> object:
        return all(step.tool in allowed for step in plan.steps)

    def full(p: object) -> object:
        return check(p, catalogue, policy, user="bob")  # type: ignore[arg-type]

    variants = itertools.count(1)

    def fresh() -> Plan:
        return ten_step_plan(next(variants))  # a new plan, new values: nothing cached from an earlier check

    def fresh_text() -> str:
        return ten_step_plan(next(variants)).canonical_json()

    if args.fresh_only:
        per_call_us(full, fresh, 2, args.batch)  # warm up
        print(f"{statistics.median(per_call_us(full, fresh, args.rounds, args.batch)):.3f}")
        return 0
    cases: list[tuple[str, Callable[[object], object], Callable[[], object]]] = [
        ("check + policy (a freshly parsed Plan)", full, fresh),
        ("parse + check + policy (JSON text)", full, fresh_text),
        ("check + policy again (same Plan, analysis kept)", full, lambda: plan),
    ]
    per_call_us(baseline, lambda: None, 2, args.batch)
    for _, fn, make in cases:  # warm up the interpreter and the catalogue's validators
        per_call_us(fn, make, 2, args.batch)
    base = statistics.median(per_call_us(baseline, lambda: None, args.rounds, args.batch * 10))
    print(f"10-step plan with references and a condition; median of {args.rounds} rounds x {args.batch} calls")
    print("(the garbage collector is paused while timing, as timeit does)")
    print(f"{'baseline: trivial allow-list rule in plain Python':52} {base:9.2f} us      1x")
    results = {}
    for name, fn, make in cases:
        results[name] = statistics.median(per_call_us(fn, make, args.rounds, args.batch))
        print(f"{name:52} {results[name]:9.2f} us  {results[name] / base:5.0f}x baseline")
    cold = results[cases[0][0]]
    print("where a fresh plan's time goes (each part timed alone, on fresh plans):")
    for name, fn, make in parts(catalogue, policy, fresh):
        part = statistics.median(per_call_us(fn, make, args.rounds, args.batch))
        print(f"  {name:50} {part:9.2f} us  {part / cold:5.0%} of the whole")
    verdict = "meets" if cold < TARGET_US else "MISSES"
    print(f"target: median under {TARGET_US:.0f} us for check + policy of a fresh 10-step plan: {verdict} it")
    if args.previous:
        against_previous(args.previous, args.alternate, args.rounds, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
