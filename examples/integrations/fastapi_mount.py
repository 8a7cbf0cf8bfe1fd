"""Mount the dashboard in your FastAPI app: your routes submit and run plans with the async API,
and the people who approve them use plangate's dashboard under a prefix of the same app.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Header, HTTPException

from plangate import Catalogue, Policy, Runtime, StateError
from plangate.server import create_app


def your_app(catalogue: Catalogue, policy: Policy, db: str, write_plan: Any) -> FastAPI:
    app = FastAPI()
    runtime = Runtime(catalogue, policy, db=db)

    @app.post("/refunds/{invoice_id}")
    async def ask_for_refund(invoice_id: str, x_user: str = Header()) -> dict[str, Any]:
        record = await runtime.asubmit(write_plan(f"Refund invoice {invoice_id}"), requested_by=x_user)
        return {
            "plan_id": record.id,
            "status": record.status,
            "needs": record.needs,
            "review": f"/gov/plans/{record.id}",
        }

    @app.post("/plans/{plan_id}/run")
    async def run_plan(plan_id: str) -> dict[str, Any]:
        try:
            result = await runtime.aexecute(plan_id)
        except StateError as exc:
            raise HTTPException(409, str(exc)) from None
        return {"status": result.status, "outputs": result.outputs}

    app.mount("/gov", create_app(catalogue, policy, db=db))
    return app


# --- the demo: not part of the recipe ---


def demo(folder: str) -> dict[str, Any]:
    """Ask for a refund on your route, fail to run it early, approve it on the mounted dashboard, run it."""
    import re

    from fastapi.testclient import TestClient

    from examples import business
    from examples.integrations import _demo
    from plangate.accounts import Accounts
    from plangate.store import open_store

    db = f"sqlite:///{folder}/plangate.db"
    accounts = Accounts(open_store(db))  # the dashboard's accounts (`plangate users add` does the same)
    accounts.add(_demo.APPROVER, "approver", password="correct horse battery", categories=("refunds",))
    accounts.store.close()
    runtime = _demo.runtime(folder)
    app = your_app(runtime.catalogue, runtime.policy, db, _demo.written_plan)  # type: ignore[arg-type]
    runtime.close()
    client = TestClient(app, base_url="https://intranet.example")
    asked = client.post("/refunds/42", headers={"X-User": _demo.REQUESTER}).json()
    early = client.post(f"/plans/{asked['plan_id']}/run")
    effects_before = business.effect_counts()
    csrf = re.compile(r'name="csrf" value="([^"]+)"')
    login = {"name": _demo.APPROVER, "password": "correct horse battery"}
    logged_in = client.post("/gov/login", data={**login, "csrf": csrf.findall(client.get("/gov/login").text)[0]})
    page = client.get(asked["review"]).text
    plan_hash = re.findall(r'name="plan_hash" value="([^"]+)"', page)[0]
    approved = client.post(f"{asked['review']}/approve", data={"plan_hash": plan_hash, "csrf": csrf.findall(page)[0]})
    ran = client.post(f"/plans/{asked['plan_id']}/run").json()
    return {
        "asked": asked,
        "early": (early.status_code, early.json()["detail"]),
        "effects_before": effects_before,
        "login_url": str(logged_in.url),
        "approved_url": str(approved.url),
        "ran": ran,
        "effects_after": business.effect_counts(),
    }


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        outcome = demo(folder)
    print(f"your route: plan {outcome['asked']['status']}, review at {outcome['asked']['review'][:10]}...")
    print(f"run before the approval: {outcome['early'][0]}")
    print(
        f"approved on the dashboard at /gov, then run: {outcome['ran']['status']}, effects {outcome['effects_after']}"
    )


if __name__ == "__main__":
    main()
