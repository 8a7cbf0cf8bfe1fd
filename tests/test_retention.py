"""Retention: payloads of finished plans purged after a floor of days, the audit chain still verifying."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plangate import Catalogue, Policy, Runtime, audit
from plangate._auditkey import audit_key
from plangate.cli import main
from plangate.errors import PolicyError
from plangate.store import open_store
from tests.conftest import EXAMPLES, load_plan
from tests.helpers import FixedClock

OLD = datetime(2020, 1, 1, 9, 0, tzinfo=UTC)


def cli(*args: str, stdin: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), input=stdin)
    return result.exit_code, result.stdout + result.stderr


def plans(url: str, catalogue: Catalogue, policy: Policy) -> dict[str, str]:
    """Old plans in every state a purge must tell apart, and one finished recently."""
    ids: dict[str, str] = {}
    with closing(Runtime(catalogue, policy, db=url, clock=FixedClock(OLD))) as rt:
        done = rt.submit(load_plan("refund"), "alice")
        rt.approve(done.id, "ben", done.hash)
        rt.approve(done.id, "carol", done.hash)
        rt.execute(done.id)
        rejected = rt.submit(load_plan("refund"), "alice")
        rt.reject(rejected.id, "ben", "not today")
        pending = rt.submit(load_plan("refund"), "alice")
        approved = rt.submit(load_plan("refund"), "alice")
        rt.approve(approved.id, "ben", approved.hash)
        rt.approve(approved.id, "carol", approved.hash)
        ids |= {"done": done.id, "rejected": rejected.id, "pending": pending.id, "approved": approved.id}
    with closing(Runtime(catalogue, policy, db=url)) as rt:  # today: too young to purge
        recent = rt.submit(load_plan("refund"), "alice")
        rt.approve(recent.id, "ben", recent.hash)
        rt.approve(recent.id, "carol", recent.hash)
        rt.execute(recent.id)
        ids["recent"] = recent.id
    return ids


def stored(url: str) -> dict[str, Any]:
    """Everything a purge may touch, to compare before and after."""
    with closing(open_store(url)) as store:
        return {
            table: store.query(f"SELECT * FROM {table} ORDER BY 1, 2")
            for table in ("events", "steps", "plan_versions", "plans")
        }


def events_of(url: str, plan_id: str) -> list[tuple[Any, ...]]:
    with closing(open_store(url)) as store:
        return store.query(f"SELECT {audit.COLUMNS} FROM events WHERE plan_id = ? ORDER BY seq", (plan_id,))


def test_a_limit_under_the_floor_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/plangate.db"
    code, out = cli("retention", "purge", "--older-than", "89", "--yes", "--db", url)
    assert code == 2 and out.strip().splitlines()[-1].endswith(
        "is under plangate's floor of 90 days: nothing was purged"
    )
    raised = tmp_path / "policy.yaml"
    raised.write_text((EXAMPLES / "policy.yaml").read_text() + "retention:\n  min_days: 365\n")
    code, out = cli("retention", "purge", "--older-than", "200", "--yes", "--db", url, "--policy", str(raised))
    assert code == 2 and "under the policy's retention.min_days of 365 days" in out
    lowered = (EXAMPLES / "policy.yaml").read_text() + "retention:\n  min_days: 30\n"
    with pytest.raises(PolicyError, match="min_days"):
        Policy.from_yaml(lowered)


def test_a_policy_without_retention_keeps_its_hash(policy: Policy) -> None:
    assert "retention" not in policy.canonical_json()


def test_purge_of_old_finished_plans_keeps_the_chain_verifiable(
    any_db: str, catalogue: Catalogue, policy: Policy
) -> None:
    url = any_db
    ids = plans(url, catalogue, policy)
    before = stored(url)
    untouched = {name: events_of(url, ids[name]) for name in ("pending", "approved", "recent")}
    code, out = cli("audit", "head", "--db", url)
    head = out.split()

    code, out = cli("retention", "purge", "--older-than", "365", "--dry-run", "--db", url)
    assert code == 0 and "would purge 2 plan(s), 10 event(s)" in out, out
    assert stored(url) == before

    code, out = cli("retention", "purge", "--older-than", "365", "--yes", "--as", "gina", "--db", url)
    assert code == 0 and "purged 2 plan(s), 10 event(s)" in out and "2/2 plans looked at" in out, out
    for name in ("pending", "approved", "recent"):
        assert events_of(url, ids[name]) == untouched[name]
    with closing(open_store(url)) as store:
        done = store.get_plan(ids["done"])
        assert done is not None and done.status == "succeeded" and done.purged_at is not None
        assert done.hash == next(r for r in before["plans"] if r[0] == ids["done"])[3]
        assert all(s.params is None and s.output is None for s in store.steps(ids["done"]).values())
        version = store.get_version(ids["done"], 1)
        assert version is not None and version.body == f'{{"purged":"{done.purged_at}"}}'
        data = [e.data for e in store.events(ids["done"])]
        assert not any({"params", "output"} & d.keys() for d in data)
        assert {d["transition"]["to"] for d in data if "transition" in d} >= {"succeeded"}
        (event,) = [e for e in store.events() if e.kind == "retention.purged"]
        assert event.actor == "gina" and event.data["older_than_days"] == 365
        assert sorted(event.data["plans"]) == sorted([ids["done"], ids["rejected"]]) and event.data["events"] == 10
        assert store.get_plan(ids["recent"]).purged_at is None  # type: ignore[union-attr]

    code, out = cli("audit", "verify", "--db", url)
    assert code == 0 and out.startswith("audit log intact"), out
    code, out = cli("audit", "verify", "--db", url, "--head", f"{head[0]}:{head[1]}")
    assert code == 0, out
    code, out = cli("retention", "purge", "--older-than", "365", "--yes", "--db", url)  # again: nothing left
    assert code == 0 and "purged 0 plan(s), 0 event(s)" in out
    with closing(open_store(url)) as store:
        assert [e.kind for e in store.events()].count("retention.purged") == 1

    code, out = cli("show", ids["done"], "--db", url)
    assert code == 0 and "payloads purged on " in out and "succeeded" in out and done.hash in out, out
    code, out = cli("trace", ids["done"], "--db", url)
    assert code == 0 and "payloads purged on " in out and "(purged)" in out and "succeeded" in out, out


@pytest.fixture
def purged(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> tuple[str, dict[str, str]]:
    url = f"sqlite:///{tmp_path}/plangate.db"
    ids = plans(url, catalogue, policy)
    assert cli("retention", "purge", "--older-than", "100", "--yes", "--db", url)[0] == 0
    return url, ids


def tamper(url: str, sql: str, params: tuple[Any, ...]) -> None:
    with closing(open_store(url)) as store, store.transaction():
        assert store.command(sql, params) == 1


def test_a_purged_event_whose_digest_is_altered_is_caught(purged: tuple[str, dict[str, str]]) -> None:
    url, ids = purged
    seq = events_of(url, ids["done"])[0][0]
    tamper(url, "UPDATE events SET data_hash = ? WHERE seq = ?", ("0" * 64, seq))
    code, out = cli("audit", "verify", "--db", url)
    assert code == 1 and out.startswith(f"audit log BROKEN at event {seq}: its content does not match its hash"), out


def test_a_kept_field_of_a_purged_event_changed_is_caught(purged: tuple[str, dict[str, str]]) -> None:
    url, ids = purged
    seq, data = next((r[0], r[7]) for r in events_of(url, ids["done"]) if '"transition"' in r[7])
    tamper(url, "UPDATE events SET data = ? WHERE seq = ?", (data.replace('"to":"', '"to":"x'), seq))
    assert cli("audit", "verify", "--db", url)[1].startswith(f"audit log BROKEN at event {seq}")


def test_a_forged_purge_marker_is_caught(purged: tuple[str, dict[str, str]]) -> None:
    """Blanking an event that was not purged, with a seal copied from one that was, does not pass."""
    url, ids = purged
    seal_text = events_of(url, ids["done"])[0][7]
    seq = events_of(url, ids["recent"])[0][0]
    tamper(url, "UPDATE events SET data = ? WHERE seq = ?", (seal_text, seq))
    code, out = cli("audit", "verify", "--db", url)
    assert code == 1 and out.startswith(f"audit log BROKEN at event {seq}"), out


@pytest.mark.parametrize(
    "reformat",
    [
        lambda text: json.dumps(dict(reversed(json.loads(text).items())), separators=(",", ":")),
        lambda text: json.dumps(json.loads(text), sort_keys=True),
        lambda text: text.replace('"purged":', '"\\u0070urged":'),
    ],
    ids=["key order", "white space", "an escape"],
)
def test_the_text_a_purge_kept_is_held_byte_for_byte(
    purged: tuple[str, dict[str, str]], reformat: Callable[[str], str]
) -> None:
    """The seal covers the text the purge wrote: the same data written another way is an edit, as for any event."""
    url, ids = purged
    seq, text = next((r[0], r[7]) for r in events_of(url, ids["done"]) if '"transition"' in r[7])
    edited = reformat(text)
    assert edited != text and json.loads(edited) == json.loads(text)
    tamper(url, "UPDATE events SET data = ? WHERE seq = ?", (edited, seq))
    code, out = cli("audit", "verify", "--db", url)
    assert code == 1 and out.startswith(f"audit log BROKEN at event {seq}: its content does not match its hash"), out


def test_a_purged_plan_text_is_the_purge_marker_exactly(purged: tuple[str, dict[str, str]]) -> None:
    """A purged plan text reads as purged only if it is what a purge writes, with nothing beside the date."""
    url, ids = purged
    with closing(open_store(url)) as store:
        marker = store.get_version(ids["done"], 1).body  # type: ignore[union-attr]
    more = marker[:-1] + ',"steps":[{"tool":"refund","params":{"amount":5000}}]}'
    tamper(url, "UPDATE plan_versions SET body = ? WHERE plan_id = ?", (more, ids["done"]))
    code, out = cli("audit", "verify", "--db", url)
    assert code == 1 and f"plan {ids['done']} v1: the stored plan text hashes to" in out, out


def test_a_plan_whose_rows_were_changed_is_left_whole(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> None:
    url = f"sqlite:///{tmp_path}/plangate.db"
    ids = plans(url, catalogue, policy)
    tamper(url, "UPDATE steps SET output = ? WHERE plan_id = ? AND step_id = 1", ('"forged"', ids["done"]))
    code, out = cli("retention", "purge", "--older-than", "100", "--yes", "--db", url)
    assert code == 0 and "purged 1 plan(s)" in out and f"left whole: plan {ids['done']}: its rows disagree" in out


def test_a_log_written_before_data_digests_still_verifies_and_is_not_purged(
    tmp_path: Path, catalogue: Catalogue, policy: Policy
) -> None:
    """Events hashed over their data itself (as before data digests) verify as ever; their payloads stay."""
    url = f"sqlite:///{tmp_path}/plangate.db"
    ids = plans(url, catalogue, policy)
    chain = audit.Chain(audit_key())
    with closing(open_store(url)) as store:
        rows = store.query(f"SELECT {audit.COLUMNS} FROM events ORDER BY seq")
    old = [(*row[:11], None) for row in rows]
    assert all(chain.hash(row) != row[9] for row in old)  # the formula differs: the old one is recomputed here
    with closing(open_store(url)) as store, store.transaction():
        renumbered: dict[str, str] = {}
        prev = audit.GENESIS
        for row in old:
            chained = (*row[:8], prev, "", renumbered.get(row[1] or f"~{row[4]}", audit.GENESIS), None)
            digest = chain.hash(chained)
            store.command(
                "UPDATE events SET prev = ?, hash = ?, plan_prev = ?, data_hash = NULL WHERE seq = ?",
                (prev, digest, chained[10], row[0]),
            )
            renumbered[row[1] or f"~{row[4]}"] = prev = digest
            if row[1] is not None:  # the seal of the plan's newest event, as plangate writes it
                tail = f"{row[0]}:{digest}:{chain.seal_text(audit.tail_text(row[1], row[0], digest))}"
                store.command("UPDATE plans SET tail = ? WHERE id = ?", (tail, row[1]))
        store.command("UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1", (old[-1][0], prev))
    with closing(open_store(url)) as store:
        assert store.verify_audit().ok
    code, out = cli("retention", "purge", "--older-than", "100", "--yes", "--db", url)
    assert code == 0 and "purged 0 plan(s)" in out and "written before plangate kept data digests" in out, out
    assert len(ids) == 5


def test_replay_and_the_governance_export_after_a_purge(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> None:
    """A purged plan cannot be replayed (its outputs are gone) and says so; the export still verifies."""
    url = f"sqlite:///{tmp_path}/plangate.db"
    ids = plans(url, catalogue, policy)
    assert cli("replay", ids["done"], "--db", url, "--tools", str(EXAMPLES / "business.py"))[0] == 0
    assert cli("retention", "purge", "--older-than", "90", "--yes", "--db", url)[0] == 0
    code, out = cli("replay", ids["done"], "--db", url, "--tools", str(EXAMPLES / "business.py"))
    assert code == 2 and "payloads were purged on" in out and "nothing to replay" in out, out
    assert cli("replay", ids["recent"], "--db", url, "--tools", str(EXAMPLES / "business.py"))[0] == 0
    export = tmp_path / "export"
    code, out = cli("governance", "export", "--out", str(export), "--db", url)
    assert code == 0, out
    assert (
        "(purged)" in (export / "traces" / f"{ids['done']}.txt").read_text()
        or "purged" in (export / "traces" / f"{ids['done']}.jsonl").read_text()
    )
    assert cli("governance", "verify", str(export), "--db", url)[0] == 0
