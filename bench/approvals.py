"""Load: concurrent clients submitting and approving plans over the JSON API, on loopback.

A real server (uvicorn, the same app as ``plangate serve``) runs in this process; each
client thread submits a plan as a requester and approves it as an approver, for a fixed
time. Then the store is checked against what the clients did: every plan a client got an
id for exists exactly once, and every approval a client was told succeeded is recorded
exactly once, bound to the hash it named. Prints throughput and p50/p99 latency.

Run: ``python bench/approvals.py [--clients N] [--seconds S]``.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from typing import Any

import uvicorn

from plangate import Catalogue, tool
from plangate.accounts import Accounts
from plangate.server import create_app
from plangate.store import open_store


@tool
def look(key: str) -> str:
    """Read one thing."""
    return key


def call(url: str, token: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read()), time.perf_counter() - start
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), time.perf_counter() - start


def client(base: str, tokens: dict[str, str], number: int, until: float, log: list[dict[str, Any]]) -> None:
    n = 0
    while time.monotonic() < until:
        n += 1
        plan = {
            "task": f"look {number}-{n}",
            "category": "bench",
            "steps": [{"id": 1, "tool": "look", "params": {"key": f"{number}-{n}"}, "rationale": "load"}],
        }
        status, body, seconds = call(f"{base}/api/plans", tokens["requester"], plan)
        log.append({"op": "submit", "status": status, "seconds": seconds, "id": body.get("id")})
        if status != 201:
            continue
        status, _, seconds = call(f"{base}/api/plans/{body['id']}/approve", tokens["approver"], {"hash": body["hash"]})
        log.append({"op": "approve", "status": status, "seconds": seconds, "id": body["id"], "hash": body["hash"]})


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    db = f"sqlite:///{tempfile.mkdtemp(prefix='plangate-approvals-')}/bench.db"
    accounts = Accounts(open_store(db))
    accounts.add("req", "requester")
    accounts.add("app", "approver", categories=("*",))
    tokens = {"requester": accounts.issue_token("req"), "approver": accounts.issue_token("app")}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(Catalogue([look]), db=db, secure_cookies=False), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    logs: list[list[dict[str, Any]]] = [[] for _ in range(args.clients)]
    until = time.monotonic() + args.seconds
    threads = [threading.Thread(target=client, args=(base, tokens, i, until, logs[i])) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.should_exit = True
    log = [entry for entries in logs for entry in entries]
    report(log, db, args)
    return 0


def report(log: list[dict[str, Any]], db: str, args: argparse.Namespace) -> None:
    store = open_store(db)
    submitted = [e["id"] for e in log if e["op"] == "submit" and e["status"] == 201]
    approved = [e for e in log if e["op"] == "approve" and e["status"] == 200]
    rows = {row.id: row for row in store.list_plans(limit=10**9)}
    approvals = Counter((a.plan_id, a.plan_hash) for pid in rows for a in store.approvals(pid) if a.kind == "person")
    lost = [pid for pid in submitted if pid not in rows]
    duplicated = [key for key, count in approvals.items() if count > 1]
    unrecorded = [e for e in approved if approvals[(e["id"], e["hash"])] != 1]
    extra = len(rows) - len(set(submitted))
    errors = Counter(e["status"] for e in log if e["status"] not in (200, 201))
    print(f"{args.clients} clients for {args.seconds:.0f} s on loopback, one server process")
    for op in ("submit", "approve"):
        times = sorted(e["seconds"] * 1000 for e in log if e["op"] == op)
        if times:
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
            print(
                f"  {op:<8} {len(times):6} requests  {len(times) / args.seconds:7.1f}/s  "
                f"p50 {statistics.median(times):6.1f} ms  p99 {p99:6.1f} ms"
            )
    print(f"  decisions: {len(approved)} approvals acknowledged; in the ledger: {sum(approvals.values())}")
    print(
        f"  lost plans {len(lost)}, plans nobody submitted {extra}, duplicated decisions {len(duplicated)}, "
        f"acknowledged but not recorded once {len(unrecorded)}, error replies {dict(errors) or 0}"
    )
    print(f"  audit log: {store.verify_audit()}")


if __name__ == "__main__":
    sys.exit(main())
